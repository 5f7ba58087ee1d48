"""Client side of the e2e tests: streaming completions through the sidecar, with what each one got."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass

import httpx

from slaq.sse import DONE, alines, sse_data

MODEL = "slaq-tiny"


@dataclass
class Outcome:
    status: int | None = None
    ttft_s: float | None = None
    tokens: int = 0
    done: bool = False  # the stream ended with [DONE]
    error: str | None = None
    elapsed_s: float = 0.0
    ended_at: float = 0.0  # time.monotonic() when the response ended
    started_at: float = 0.0  # time.monotonic() when the request was sent
    served_by: str | None = None  # the server a load balancer named in `x-served-by` (tests/support/haproxy.py)

    def met(self, ttft_objective_s: float) -> bool:
        """Completed, with its first token within the objective."""
        return self.done and self.ttft_s is not None and self.ttft_s <= ttft_objective_s

    @property
    def terminated(self) -> bool:
        """Ended without completing: a refused request or a stream that was cut."""
        return not self.done


async def stream_completion(client: httpx.AsyncClient, url: str, key: str, *, prompt_tokens: int = 16,
                            max_tokens: int = 16, seed: int = 0, first_token: asyncio.Event | None = None) -> Outcome:
    rng = random.Random(seed)
    body = {"model": MODEL, "prompt": [rng.randrange(10, 200) for _ in range(prompt_tokens)], "max_tokens": max_tokens,
            "min_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    outcome = Outcome()
    started = outcome.started_at = time.monotonic()
    try:
        async with client.stream("POST", url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as response:
            outcome.status = response.status_code
            outcome.served_by = response.headers.get("x-served-by")
            if response.status_code != 200:
                outcome.error = (await response.aread()).decode("utf-8", "replace")[:200]
                return outcome
            async for line in alines(response.aiter_bytes()):
                data = sse_data(line)
                if data is None:
                    continue
                if data is DONE:
                    outcome.done = True
                    break
                if "error" in data:
                    outcome.error = str(data["error"])[:200]
                    break
                if data.get("usage"):  # the engine's own count: a token may decode to no text yet
                    outcome.tokens = data["usage"].get("completion_tokens", outcome.tokens)
                choices = data.get("choices") or []
                if choices:  # a chunk per new token, whose text may still be empty (partial UTF-8)
                    if not data.get("usage"):
                        outcome.tokens += 1
                    if outcome.ttft_s is None:
                        outcome.ttft_s = time.monotonic() - started
                        if first_token is not None:
                            first_token.set()
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    finally:
        outcome.ended_at = time.monotonic()
        outcome.elapsed_s = outcome.ended_at - started
    return outcome


def client(timeout_s: float = 120.0) -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0), limits=httpx.Limits(max_connections=256))


def attainment(outcomes: list[Outcome], ttft_objective_s: float) -> float:
    met = sum(1 for o in outcomes if o.met(ttft_objective_s))
    return met / len(outcomes)
