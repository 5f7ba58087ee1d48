"""vLLM's offline `LLM` entry point (a public API), for scripts that time a real model's steps."""

from __future__ import annotations

from typing import Any

from vllm import LLM, SamplingParams, TokensPrompt


def offline_llm(**engine_args: Any) -> LLM:
    """`vllm.LLM(**engine_args)`: an engine in this process, as `vllm serve` takes the same arguments."""
    return LLM(**engine_args)


def greedy_inputs(prompts: list[list[int]], max_tokens: int) -> tuple[list[TokensPrompt], SamplingParams]:
    """`LLM.generate` arguments that make each token-id prompt yield exactly `max_tokens` greedy
    tokens (EOS ignored, nothing detokenized)."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0, detokenize=False)
    return [TokensPrompt(prompt_token_ids=p) for p in prompts], params
