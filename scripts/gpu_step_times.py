"""Measured vLLM step times for Llama-3-8B geometry (dummy weights, nothing downloaded), beside what
`tools/src/slaq/bench/models/h200-llama3-8b.yaml` predicts, so its efficiencies and overhead can be calibrated.

    python scripts/gpu_step_times.py model-dir [--out FILE] [--write-model-only] [--vocab N]

`model-dir` is created when missing: the Llama-3-8B `config.json` and the tiny model's tokenizer
(ids are what matter; the engine runs with `skip_tokenizer_init`). Prefill: one prompt of T tokens
and one output token, so the step is that prompt's chunk. Decode: B prompts of 128 tokens, 65
output tokens; (time − the same batch with 1 output token) / 64 is one decode step at B sequences.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
PREFILL_TOKENS = (512, 2048, 8192)
DECODE_BATCHES = (1, 32, 128, 256)
DECODE_PROMPT = 128
DECODE_STEPS = 64


def write_model_dir(target: Path, vocab_size: int = LLAMA3_8B["vocab_size"]) -> Path:
    """Llama-3-8B config (vocab_size overridable: the erase test uses the tiny tokenizer's 512) plus
    the tiny model's tokenizer files."""
    from slaq.engine.tiny_model import ensure_tiny_model

    target.mkdir(parents=True, exist_ok=True)
    tiny = ensure_tiny_model()
    for path in tiny.iterdir():
        if path.name != "config.json" and path.is_file():
            shutil.copy(path, target / path.name)
    (target / "config.json").write_text(json.dumps({**LLAMA3_8B, "vocab_size": vocab_size}, indent=2), encoding="utf-8")
    return target


def _timed(llm, prompts: list[list[int]], max_tokens: int, repeats: int = 3) -> float:
    from slaq.engine.vllm_compat.llm import greedy_inputs

    inputs, params = greedy_inputs(prompts, max_tokens)
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        llm.generate(inputs, params, use_tqdm=False)
        samples.append(time.perf_counter() - started)
    return sorted(samples)[len(samples) // 2]


def _prompt(seed: int, length: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % 120000 + 100 for i in range(length)]


def measure(model_dir: Path) -> dict:
    from slaq.bench.pool_profile import load_profile
    from slaq.bench.stepcost import ScheduledWork, StepCostModel
    from slaq.engine.vllm_compat.llm import offline_llm

    cost = StepCostModel(load_profile("h200-llama3-8b"))
    llm = offline_llm(model=str(model_dir), load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16", max_model_len=8192,
                      max_num_batched_tokens=8192, max_num_seqs=256, block_size=16, gpu_memory_utilization=0.9, enable_prefix_caching=False)
    _timed(llm, [_prompt(0, 256)], 4, repeats=1)  # warm up
    prefill = []
    for tokens in PREFILL_TOKENS:
        seconds = _timed(llm, [_prompt(tokens, tokens)], 1)
        prefill.append({"tokens": tokens, "measured_s": seconds, "profile_s": cost.step_seconds([ScheduledWork(tokens, 0, True)])})
    decode = []
    for batch in DECODE_BATCHES:
        prompts = [_prompt(batch * 1000 + i, DECODE_PROMPT) for i in range(batch)]
        first = _timed(llm, prompts, 1)
        full = _timed(llm, prompts, DECODE_STEPS + 1)
        step = (full - first) / DECODE_STEPS
        decode.append({"batch": batch, "measured_s": step, "profile_s": cost.decode_seconds(batch, DECODE_PROMPT + DECODE_STEPS / 2)})
    return {"model": "Llama-3-8B geometry, dummy weights, bf16", "prefill": prefill, "decode": decode}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--vocab", type=int, default=LLAMA3_8B["vocab_size"])
    parser.add_argument("--write-model-only", action="store_true", help="create the model directory and stop (CPU dry run)")
    args = parser.parse_args(argv)
    if not (args.model_dir / "config.json").exists() or args.write_model_only:
        write_model_dir(args.model_dir, args.vocab)
        print(f"model directory: {args.model_dir}")
    if args.write_model_only:
        return 0
    report = measure(args.model_dir)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
