"""The design report's scenario 4.5, literally: A, B and C arrive together while the KV cache is nearly full.

The report: a VIP request A (1,000-token prompt, TTFT < 50 ms), a standard request B (5,000
tokens, < 200 ms) and a free request C (100 tokens, no SLO) arrive at once while the load is at
95 % and the KV cache is nearly exhausted. Its answers: FCFS serves them in arrival order (B first
makes A and C wait); static priority serves A first, then B, and C waits behind B; dynamic
priority serves A and C (C's short prompt fits beside A in the KV cache left) and B later,
aging guarding it against starvation.

Here: the prompts are divided by 10 (100 / 500 / 10 tokens); the engine's KV cache is
`KV_BLOCKS` blocks of `BLOCK_SIZE` tokens; a standard-tier load of `BACKGROUND` requests (earlier
requests of B's own tenant, `BACKGROUND_TENANT`) is running and holds nearly all of it: what is
left fits A and C but not B until one of them finishes (`KvPlan` checks that arithmetic). The load
is of B's tier on purpose: slaq preempts only strictly lower tiers, so a batch-tier load would be
preempted to start B at once (A, B and C in one step), which is not the question the report asks. Then B, A and C are sent `ARRIVAL_GAP_S` apart, in that order
(B first: the report's bad case for FCFS), and the order of their first tokens is recorded.
Nothing here knows the expected answer except `REPORT_ORDER`, printed beside what was observed.
"""

from __future__ import annotations

import asyncio
import math
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Mapping, Protocol

from slaq.local.errors import ScenarioError
from slaq.local.loadgen import Outcome, PlannedRequest, stream_one

class NotTogether(ScenarioError):
    """The run did not pose the report's question: A, B and C were not sent within `TOGETHER_S` of
    each other, or the background did not still hold its blocks when they were. Run it again."""


BLOCK_SIZE = 32  # the CPU backend's preferred multiple
KV_BLOCKS = 64
ARRIVAL_ORDER = ("B", "A", "C")
ARRIVAL_GAP_S = 0.005
TOGETHER_S = 0.03
# With a `hold` (the engine's scheduler stopped): how long the background is given to be sent.
# A, B and C are then sent `ARRIVAL_GAP_S` apart to the running sidecar (or API server) while the
# engine is still stopped, and the sidecar and the API server get `HANDOVER_S` after the last send
# to put them in the engine's input queue; the engine continues after it. Their objectives' clocks
# run from the moment their bytes reach the host (the sidecar's arrival stamp, sidecar arrival.py),
# so they run through the sends and the handover, about 25 ms for B: a calibrated A objective can be
# 30 ms (three times its unloaded p90), and B's backfill window (half of its objective,
# `backfillSlack`) about 80 ms; once a 100 ms hold ran on their clocks, A's deadline had passed and
# B's window had closed before the engine's first step, which then kept C behind B. (The requests
# used to be sent to a stopped sidecar, whose stamp was then taken when it read them: a stamp from
# the host's receipt counts that wait, as it should.)
SETTLE_S = 0.1
HANDOVER_S = 0.015
REPORT_ORDER = {"fcfs": ("B", "A", "C"), "priority": ("A", "B", "C"), "slaq": ("A", "C", "B")}
REPORT_ANSWER = {
    "fcfs": "arrival order: B first holds the KV cache, A and C wait (A's SLO lost)",
    "priority": "A first; B next; C waits behind B although it would fit",
    "slaq": "A and C first (C fits beside A); B later, aging keeps it from starving",
}


@dataclass(frozen=True)
class Sized:
    prompt_tokens: int
    output_tokens: int

    def blocks_at_admission(self) -> int:
        return math.ceil(self.prompt_tokens / BLOCK_SIZE)

    def blocks_when_done(self) -> int:
        return math.ceil((self.prompt_tokens + self.output_tokens) / BLOCK_SIZE)


REQUESTS: dict[str, Sized] = {"A": Sized(100, 8), "B": Sized(500, 16), "C": Sized(10, 16)}
BACKGROUND = (Sized(544, 64),) * 3  # running when A, B and C arrive
BACKGROUND_TENANT = "B"  # whose key (and stock priority) the background is sent with: B's tier, see the module doc


@dataclass(frozen=True)
class KvPlan:
    """The block arithmetic the scenario rests on."""

    kv_blocks: int = KV_BLOCKS
    requests: Mapping[str, Sized] = field(default_factory=lambda: dict(REQUESTS))
    background: tuple[Sized, ...] = BACKGROUND

    def free_blocks(self, background_done: bool) -> int:
        """Blocks left by the running background: at its admission (most left) or when it has decoded everything."""
        held = sum(s.blocks_when_done() if background_done else s.blocks_at_admission() for s in self.background)
        return self.kv_blocks - held

    def problems(self) -> list[str]:
        """Why this plan would not pose the report's question (empty: it does)."""
        out = []
        a, b, c = (self.requests[x] for x in "ABC")
        if a.blocks_when_done() + c.blocks_when_done() > self.free_blocks(background_done=True):
            out.append("A and C do not both fit beside the background")
        if b.blocks_at_admission() <= self.free_blocks(background_done=False):
            out.append("B fits beside the background: nothing waits")
        held_when_done = [s.blocks_when_done() for s in self.background]
        if b.blocks_at_admission() > self.kv_blocks - sum(held_when_done) + min(held_when_done):
            out.append("B does not fit even once one background request is done")
        if self.decode_margin() < 1:
            out.append("C cannot finish before a background request does: serving it first would delay B")
        return out

    def decode_margin(self) -> int:
        """The most tokens each background request may have decoded when A, B and C arrive for C to
        be done (its prefill step and its output) before a background request frees B's room. Past
        it, serving C beside A would delay B, and a backfilling scheduler rightly makes C wait: the
        run would not ask the report's question."""
        c = self.requests["C"]
        return min(s.output_tokens for s in self.background) - (1 + c.output_tokens)


@dataclass
class ScenarioRun:
    system: str
    outcomes: dict[str, Outcome]  # by letter: A, B, C
    held_until: float | None = None  # when the engine continued after a `hold` (seconds since the run's origin)
    # When the engine first scheduled each letter (epoch seconds, from slaq's engine request log;
    # empty for stock vLLM, which keeps none): the scheduler's own order.
    engine_started: dict[str, float] = field(default_factory=dict)

    @property
    def order(self) -> list[str]:
        """The letters in the order their first tokens came back; a request without one comes last."""
        return _ordered({x: o.first_token_at for x, o in self.outcomes.items()})

    @property
    def groups(self) -> list[list[str]]:
        """`order` cut where first tokens came more than `TOGETHER_S` apart: a group started in one go
        (the client's own reading spreads one engine step's tokens over a few milliseconds)."""
        return _grouped({x: o.first_token_at for x, o in self.outcomes.items()})

    @property
    def engine_groups(self) -> list[list[str]] | None:
        """The letters grouped as the engine first scheduled them (`TOGETHER_S` apart: a group started
        in one step); None without the engine's log. The client's view (`groups`) is this one seen
        through the API server, the sidecar and this client's reading: on a busy two-core machine a
        stall there delivered the first tokens of A, C and then B (admitted 200 ms apart) in one go."""
        if set(self.engine_started) != set(self.outcomes):
            return None
        # within a step there is no order (the times are the engine's millisecond stamps plus waits)
        return [sorted(group) for group in _grouped(dict(self.engine_started))]

    def ttft_ms(self, letter: str) -> float | None:
        """From its send, or, under a hold, from when the engine continued (the wait for the hold is
        the scenario's set-up, not the scheduler's doing)."""
        outcome = self.outcomes[letter]
        if outcome.ttft_s is None or outcome.first_token_at is None:
            return None
        if self.held_until is None:
            return round(outcome.ttft_s * 1000.0, 1)
        return round((outcome.first_token_at - max(outcome.sent_at, self.held_until)) * 1000.0, 1)

    def finished(self, letter: str) -> bool:
        return self.outcomes[letter].finished

    def as_json(self) -> dict:
        return {"order": self.order, "together": self.groups, "arrival_order": list(ARRIVAL_ORDER), "report_order": list(REPORT_ORDER[self.system]),
                "ttft_ms": {x: self.ttft_ms(x) for x in "ABC"}, "finished": {x: self.finished(x) for x in "ABC"},
                "sent_ms": {x: _ms(self.outcomes[x].sent_at) for x in "ABC"},
                "first_token_ms": {x: _ms(self.outcomes[x].first_token_at) for x in "ABC"},
                "engine_together": self.engine_groups}


def _ordered(times: Mapping[str, float | None]) -> list[str]:
    """The letters by time; those without one last, in their given order."""
    timed = sorted((x for x in times if times[x] is not None), key=lambda x: times[x])  # type: ignore[arg-type, return-value]
    return timed + [x for x in times if times[x] is None]


def _grouped(times: Mapping[str, float | None]) -> list[list[str]]:
    """`_ordered`, cut where two times are more than `TOGETHER_S` apart."""
    out: list[list[str]] = []
    last: float | None = None
    for letter in _ordered(times):
        at = times[letter]
        if out and at is not None and last is not None and at - last <= TOGETHER_S:
            out[-1].append(letter)
        else:
            out.append([letter])
        last = at
    return out


def scenario_requests(seed: int, keys: Mapping[str, str], priorities: Mapping[str, int | None], background_key: str,
                      background_priority: int | None) -> list[PlannedRequest]:
    """The background requests, then B, A and C in arrival order; each prompt drawn from its own seed."""
    out = [PlannedRequest(0.0, "bg", background_key, s.prompt_tokens, s.output_tokens, seed + i, background_priority)
           for i, s in enumerate(BACKGROUND)]
    for n, letter in enumerate(ARRIVAL_ORDER):
        size = REQUESTS[letter]
        out.append(PlannedRequest(0.0, letter, keys[letter], size.prompt_tokens, size.output_tokens, seed + 100 + n, priorities[letter]))
    return out


class Hold(Protocol):
    """What stops the engine's scheduler for a run (the demo's `EngineHold`)."""

    async def arm(self) -> None:
        """Called before the background is sent."""

    async def holding(self, prompt_tokens: int, blocks: int, max_decoded: int, timeout_s: float) -> None:
        """Return once the engine admitted `prompt_tokens` more prompt tokens and holds `blocks`
        blocks (it may return with the engine already stopped); raise `NotTogether` when it had
        decoded more than `max_decoded` tokens by then."""

    def stopped(self) -> AbstractContextManager[object]:
        """The engine's scheduler does not run inside it; requests sent meanwhile reach its input
        queue; after it, the engine runs."""


async def run_scenario(system: str, url: str, model: str, keys: Mapping[str, str], priorities: Mapping[str, int | None],
                       seed: int, background_key: str, background_priority: int | None = None,
                       timeout_s: float = 60.0, hold: Hold | None = None) -> ScenarioRun:
    """Fill the KV cache with the background, then send B, A, C together; `keys`/`priorities` by letter.

    With a `hold` (the demo's): the background is sent while the engine's scheduler is stopped and
    given `SETTLE_S` to reach its input queue, so one step admits all of it and it decodes in step
    (sent to a running engine, the first could be far along before the last was handed over on a
    busy machine, and one close to its end rightly keeps C waiting for B). Once the engine itself
    says it holds the background's blocks (`KvPlan`'s count at admission), having decoded no more
    than `KvPlan.decode_margin` tokens each, its scheduler is stopped, A, B and C are sent
    `ARRIVAL_GAP_S` apart, and the sidecar and the API server get `HANDOVER_S` after the last send to
    put them in the engine's input queue, so its first step after the hold finds all three beside the
    background however slowly this machine streams tokens, with their objectives' clocks the sends
    and the handover old. With one or without, the three must be sent within `TOGETHER_S`. Without one, the
    background holds its blocks once its first tokens are back, and the three are sent
    `ARRIVAL_GAP_S` apart and must leave within `TOGETHER_S`.

    `seed` picks fresh prompt tokens: a run must not hit the prefix cache an earlier run left."""
    requests = scenario_requests(seed, keys, priorities, background_key, background_priority)
    background, trio_requests = requests[:len(BACKGROUND)], requests[len(BACKGROUND):]
    if hold is not None:
        await hold.arm()
    origin = time.monotonic()
    decoding = [asyncio.Event() for _ in background]
    running: list[asyncio.Task] = []
    with hold.stopped() if hold is not None else nullcontext():
        running += [asyncio.create_task(stream_one(url, model, r, origin, event)) for r, event in zip(background, decoding)]
        if hold is not None:
            await asyncio.sleep(SETTLE_S)
    if hold is not None:
        plan = KvPlan()
        await hold.holding(sum(r.prompt_tokens for r in background), KV_BLOCKS - plan.free_blocks(background_done=False),
                           plan.decode_margin() * len(background), timeout_s)
    else:  # the background holds its KV blocks once it decodes: its first token is back
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in decoding)), timeout_s)
    trio: dict[str, asyncio.Task] = {}
    held_until: float | None = None
    with hold.stopped() if hold is not None else nullcontext():
        if ended := [t.result() for t in running if t.done()]:
            raise NotTogether(f"a background request ended before A, B and C were sent (status {ended[0].status}, "
                              f"{'finished' if ended[0].finished else 'not finished'})")
        for n, request in enumerate(trio_requests):
            if n:
                await asyncio.sleep(ARRIVAL_GAP_S)
            # A new connection is made by the kernel's handshake alone (the server accepts it when it
            # gets to it), so sending on one costs no more than on an open one.
            trio[request.letter] = asyncio.create_task(stream_one(url, model, request, origin))
        if hold is not None:
            await asyncio.sleep(HANDOVER_S)
            held_until = time.monotonic() - origin
    await asyncio.wait_for(asyncio.gather(*trio.values(), *running), timeout_s)
    sent = [task.result().sent_at for task in trio.values()]
    if held_until is not None and held_until - max(sent) < HANDOVER_S / 2:
        raise NotTogether(f"a request was sent {1000 * (held_until - max(sent)):.0f} ms before the engine continued, "
                          f"less than half of the {1000 * HANDOVER_S:g} ms it is given to reach the engine")
    if max(sent) - min(sent) > TOGETHER_S:
        # This client's event loop was held up between two sends (it happens on a busy machine):
        # the three did not arrive together, so the run does not pose the report's question.
        raise NotTogether(f"A, B and C were sent {1000 * (max(sent) - min(sent)):.0f} ms apart, not together")
    return ScenarioRun(system, {x: trio[x].result() for x in "ABC"}, held_until)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 1)
