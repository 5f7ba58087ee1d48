"""The demo's client: streaming completions, sent at planned times, TTFT as the client sees it.

`send` is one request (`stream_one`) or a planned list of them (`replay`); `run_in_subprocess`
runs `replay` in a process of its own, so that the client's event loop does no other work.

Its CPU priority is the default one, not the lowest. A client on another machine never waits for
the server's CPU, and that is what the demo's figures should show; on a small machine the next
best is a light client that runs the moment it has work. Requests go through `sse_client`, which
costs 1.6 ms of CPU per streamed request (a sixth of httpx's), so it takes little from the engine
whatever its priority, and both systems pay the same. At the lowest priority (`os.nice(19)`) it
starves instead: vLLM's CPU engine keeps both cores busy under load (its OpenMP threads and its
engine core spin while waiting for each other), and a nice-19 process then gets about 1 % of a
core, so its readings are its own queue for the CPU (on CI: VIP TTFT 7.8 s as the client saw it,
0.2 s in the sidecar's histogram). Each outcome records how late its request was sent against
the plan (`late_s`): the client's own CPU wait, reported beside the figures.

Plan and results travel as JSON files: `python -m slaq.local.loadgen PLAN RESULTS`.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from slaq.local.sse_client import post_stream



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
    late_s: float = 0.0  # how long after its planned time the request was sent (the client's CPU wait)
    request_id: str | None = None  # the sidecar's id for it (its x-request-id answer header)


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


async def stream_one(url: str, model: str, request: PlannedRequest, origin: float,
                     first_token: asyncio.Event | None = None, lazy: bool = False) -> Outcome:
    """Send one request now; `origin` is the plan's start (time.monotonic()) that times are counted from;
    `first_token` is set when the first token is back. `lazy`: the rest of the stream is read in a
    few late reads (less CPU; the end time is then late by up to `sse_client.LAZY_READ_S`)."""
    outcome = Outcome(request.letter)
    started = time.monotonic()
    outcome.sent_at = started - origin
    result = await post_stream(url + "/v1/completions", request_body(model, request), {"Authorization": f"Bearer {request.key}"},
                               on_first_token=None if first_token is None else first_token.set, lazy_after_first_token=lazy)
    outcome.status = result.status
    outcome.request_id = result.request_id
    if result.first_token_at is not None:
        outcome.ttft_s = result.first_token_at - started
        outcome.first_token_at = result.first_token_at - origin
    if result.status == 200 and result.done and result.error is None:
        outcome.finished = True
        outcome.ended_at = (result.ended_at or time.monotonic()) - origin
    return outcome


async def replay(plan: Plan, progress: Callable[[int, int], None] | None = None) -> list[Outcome]:
    """Every planned request at its time; outcomes in plan order."""
    answered = 0

    async def one(request: PlannedRequest, origin: float) -> Outcome:
        nonlocal answered
        await asyncio.sleep(max(0.0, origin + request.at - time.monotonic()))
        outcome = await stream_one(plan.url, plan.model, request, origin, lazy=True)
        outcome.late_s = max(0.0, outcome.sent_at - request.at)
        answered += 1
        return outcome

    origin = time.monotonic()
    tasks = [asyncio.create_task(one(r, origin)) for r in plan.requests]
    while not all(t.done() for t in tasks):
        await asyncio.wait(tasks, timeout=1.0)
        if progress is not None:
            progress(answered, len(tasks))
    return [t.result() for t in tasks]


def run_in_subprocess(plan: Plan, workdir: Path, name: str, progress: Callable[[int, int], None] | None = None) -> list[Outcome]:
    """`replay(plan)` in a child process; its progress lines feed `progress`."""
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
    plan = Plan.from_json(plan_path.read_text(encoding="utf-8"))
    outcomes = asyncio.run(replay(plan, lambda done, total: print(f"answered {done} {total}", flush=True)))
    results_path.write_text(json.dumps([asdict(o) for o in outcomes]), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
