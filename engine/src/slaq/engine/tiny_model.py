"""The tiny built-in model: a Llama config and a tokenizer, generated on first use into a cache dir.

The weights are random (`load_format=dummy`), so the engine starts in about a minute on CPU and
serves real requests through the real engine core and scheduler: enough to test scheduling, not
to read the text it writes. head_dim is 64 because vLLM's CPU attention kernels reject 16.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

SERVED_NAME = "slaq-tiny"
CACHE_ENV = "SLAQ_CACHE_DIR"
VOCAB_SIZE = 512
MAX_POSITIONS = 2048
MODEL_VERSION = 2

_TRAINING_TEXT = [
    "Service level objectives bound the time to the first token and the time per output token.",
    "A critical tenant is served before a standard tenant, and a standard tenant before a batch tenant.",
    "The scheduler preempts a batch decode when an urgent request arrives and the batch is full.",
    "Aging lets a long waiting request outrank fresh arrivals, so nothing starves.",
    "The quick brown fox jumps over the lazy dog while the engine streams tokens back.",
    "Hello world. How are you today? Tell me a short story about a cache of key value blocks.",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 + - * / = ( ) [ ] { } , . ; : ! ?",
]

_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": MAX_POSITIONS,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "vocab_size": VOCAB_SIZE,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


def default_cache_dir() -> Path:
    base = os.environ.get(CACHE_ENV) or os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    # The version changes with the generated files (2: the chat template renders tools), so a cache of an older one is not reused.
    return Path(base) / "slaq" / f"tiny-model-{MODEL_VERSION}"


def ensure_tiny_model(directory: Path | None = None) -> Path:
    """Return a directory holding the tiny model, generating it once (atomically, so parallel starts are safe)."""
    target = directory or default_cache_dir()
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tiny-", dir=target.parent))
    _write_model(staging)
    try:
        staging.rename(target)
    except OSError:  # another process won the race; its copy is identical
        if not (target / "config.json").exists():
            raise
    return target


def _write_model(directory: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_TRAINING_TEXT, trainer=trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = dict(_CONFIG, vocab_size=max(VOCAB_SIZE, tokenizer.get_vocab_size()))
    (directory / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<pad>",
                "model_max_length": MAX_POSITIONS,
                # Tools as JSON before the messages, as tool-calling models' templates render them.
                "chat_template": (
                    "{% if tools %}tools: {{ tools | tojson }}\n{% endif %}"
                    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
                    "{% if add_generation_prompt %}assistant: {% endif %}"
                ),
            },
            indent=2,
        ),
        encoding="utf-8",
    )
    (directory / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}), encoding="utf-8")
