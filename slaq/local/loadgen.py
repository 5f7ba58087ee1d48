"""The demo's client: streaming completions, sent at planned times, TTFT as the client sees it.

`send` is one request (`stream_one`) or a planned list of them (`replay`); `run_in_subprocess`
runs `replay` in a process of its own at the lowest CPU priority (`os.nice(19)`), so that on a
small machine the load generator does not take CPU from the engine and the sidecar it measures
(its own TTFT readings then carry whatever CPU wait it has, which the sidecar's figures show).

Plan and results travel as JSON files: `python -m slaq.local.loadgen PLAN RESULTS`.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

LOWEST_CPU_PRIORITY = 19


@dataclass(frozen=True)
class PlannedRequest:
    """One request of a plan: when (seconds after the start), who (a tenant letter and its key) and how big."""

    at: float
    letter: str
    key: str
    prompt_tokens: int
    output_tokens: int
    seed: int
    priority: int | None = None  # the body's `priority` (stock vLLM's priority policy); None: not sent


@dataclass
class Outcome:
    letter: str
    sent_at: float = 0.0  # seconds after the plan's start
    status: int | None = None
    ttft_s: float | None = None
    first_token_at: float | None = None  # seconds after the plan's start
    finished: bool = False
    ended_at: float | None = None  # seconds after the plan's start, when the response ended


@dataclass(frozen=True)
class Plan:
    url: str
    model: str
    requests: list[PlannedRequest] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({"url": self.url, "model": self.model, "requests": [asdict(r) for r in self.requests]})

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        data = json.loads(text)
        return cls(data["url"], data["model"], [PlannedRequest(**r) for r in data["requests"]])


def request_body(model: str, request: PlannedRequest) -> dict[str, Any]:
    """A streaming completion of exactly `output_tokens` tokens; the prompt is token ids, so its length is exact."""
    rng = random.Random(request.seed)
    body: dict[str, Any] = {"model": model, "prompt": [rng.randrange(10, 200) for _ in range(request.prompt_tokens)],
                            "max_tokens": request.output_tokens, "min_tokens": request.output_tokens,
                            "ignore_eos": True, "stream": True}
    if request.priority is not None:
        body["priority"] = request.priority
    return body


def client() -> Any:
    import httpx

    return httpx.AsyncClient(timeout=httpx.Timeout(120.0, connect=10.0), limits=httpx.Limits(max_connections=1024))


async def stream_one(http: Any, url: str, model: str, request: PlannedRequest, origin: float,
                     first_token: asyncio.Event | None = None) -> Outcome:
    """Send one request now; `origin` is the plan's start (time.monotonic()) that times are counted from;
    `first_token` is set when the first token is back."""
    outcome = Outcome(request.letter)
    started = time.monotonic()
    outcome.sent_at = started - origin
    try:
        async with http.stream("POST", url + "/v1/completions", json=request_body(model, request),
                               headers={"Authorization": f"Bearer {request.key}"}) as response:
            outcome.status = response.status_code
            if response.status_code != 200:
                await response.aread()
                return outcome
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    outcome.finished = True
                    outcome.ended_at = time.monotonic() - origin
                    break
                if outcome.ttft_s is not None:
                    continue  # only the first token's time is needed: spare the CPU the engine shares
                # Every chunk carries new tokens; the first token's text may still be empty (a partial
                # UTF-8 sequence from the random-weight model), so any chunk with a choice counts.
                if json.loads(payload).get("choices"):
                    now = time.monotonic()
                    outcome.ttft_s = now - started
                    outcome.first_token_at = now - origin
                    if first_token is not None:
                        first_token.set()
    except Exception:  # a broken stream is a result here (not finished), not a crash
        pass
    return outcome


async def replay(plan: Plan, progress: Callable[[int, int], None] | None = None) -> list[Outcome]:
    """Every planned request at its time; outcomes in plan order."""
    answered = 0

    async def one(http: Any, request: PlannedRequest, origin: float) -> Outcome:
        nonlocal answered
        await asyncio.sleep(max(0.0, origin + request.at - time.monotonic()))
        outcome = await stream_one(http, plan.url, plan.model, request, origin)
        answered += 1
        return outcome

    async with client() as http:
        origin = time.monotonic()
        tasks = [asyncio.create_task(one(http, r, origin)) for r in plan.requests]
        while not all(t.done() for t in tasks):
            await asyncio.wait(tasks, timeout=1.0)
            if progress is not None:
                progress(answered, len(tasks))
        return [t.result() for t in tasks]


def run_in_subprocess(plan: Plan, workdir: Path, name: str, progress: Callable[[int, int], None] | None = None) -> list[Outcome]:
    """`replay(plan)` in a child process at the lowest CPU priority; its progress lines feed `progress`."""
    plan_path, results_path = workdir / f"{name}-plan.json", workdir / f"{name}-results.json"
    plan_path.write_text(plan.to_json(), encoding="utf-8")
    command = [sys.executable, "-m", "slaq.local.loadgen", str(plan_path), str(results_path)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as child:
        assert child.stdout is not None
        tail: list[str] = []
        for line in child.stdout:
            parts = line.split()
            if len(parts) == 3 and parts[0] == "answered" and progress is not None:
                progress(int(parts[1]), int(parts[2]))
            else:
                tail = (tail + [line.rstrip()])[-20:]
        if child.wait() != 0:
            from slaq.local.errors import LocalError

            raise LocalError(f"the load generator exited with status {child.returncode}:\n" + "\n".join(tail))
    return [Outcome(**o) for o in json.loads(results_path.read_text(encoding="utf-8"))]


def main(argv: Sequence[str]) -> int:
    plan_path, results_path = Path(argv[0]), Path(argv[1])
    os.nice(LOWEST_CPU_PRIORITY)
    plan = Plan.from_json(plan_path.read_text(encoding="utf-8"))
    outcomes = asyncio.run(replay(plan, lambda done, total: print(f"answered {done} {total}", flush=True)))
    results_path.write_text(json.dumps([asdict(o) for o in outcomes]), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
