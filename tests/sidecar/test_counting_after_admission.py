"""A long prompt admitted on its bound and counted after (tokens.py, `SidecarCore.admit`): the bound
holds for the tokenizers it is given for, a request with room goes on before its count lands, one
near its quota waits for the count, and what is charged ends at the exact count whatever happens
to the request meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
import threading
import time
from typing import Any

import pytest

from slaq.sidecar.errors import TokenRateExceeded
from slaq.sidecar.service import SETTLE_AFTER_S, SETTLING_NICENESS, CoreConfig, Flight, SidecarCore
from slaq.sidecar.tenants import TenantDirectory
from slaq.sidecar.tokens import OFF_LOOP_TEXT_CHARS, PromptBound, PromptCount, TokenizerCounter, byte_bounded, text_chars
from tests.sidecar.tables import abc_table, bearer

TPM = 10_000
EXACT, BOUND, ESTIMATE = 1234, 5000, 1200
LONG = json.dumps({"prompt": "x" * (OFF_LOOP_TEXT_CHARS + 1), "max_tokens": 2}).encode()


@pytest.fixture(scope="module")
def tiny() -> TokenizerCounter:
    from slaq.engine.tiny_model import ensure_tiny_model

    return TokenizerCounter.load(str(ensure_tiny_model()))


# -- the bound -------------------------------------------------------------------------------------

def _texts(seed: int) -> list[str]:
    rng = random.Random(seed)
    pools = [
        "The scheduler preempts a batch decode. ",
        "服务等级目标限制首个令牌的时间。",
        "🙂🚀 naïve café Ω≈ç√ ",
        "<s></s><pad><unk> ",  # the tokenizer's added tokens, matched in the text
    ]
    texts = [rng.choice(pools) * rng.randint(1, 200) for _ in range(20)]
    texts += ["".join(chr(rng.randint(1, 0x10FFFF)) for _ in range(rng.randint(1, 3000))).encode("utf-8", "ignore").decode("utf-8", "ignore")
              for _ in range(20)]  # random code points, surrogates dropped
    texts += [bytes(rng.randint(0, 255) for _ in range(2000)).decode("latin-1") for _ in range(5)]
    return texts


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_exact_count_never_exceeds_the_bound_for_the_tiny_tokenizer(tiny: TokenizerCounter, seed: int) -> None:
    for text in _texts(seed):
        for special in (True, False):
            body = {"prompt": text, "add_special_tokens": special}
            bound, count = tiny.bound("completions", body), tiny.measure("completions", body)
            assert count.method == "tokenizer" and bound is not None
            assert count.tokens <= bound.tokens, (text[:40], count, bound)
        chat = {"messages": [{"role": "system", "content": text[:50]}, {"role": "user", "content": text}],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}
        bound, count = tiny.bound("chat", chat), tiny.measure("chat", chat)
        assert bound is not None and count.method == "tokenizer" and count.tokens <= bound.tokens
    ascii_prompt = "The scheduler preempts a batch decode. " * 100
    bound = tiny.bound("completions", {"prompt": ascii_prompt})
    assert bound == PromptBound(len(ascii_prompt), tiny.fallback.measure("completions", {"prompt": ascii_prompt}).tokens)
    assert tiny.bound("completions", {"prompt": ascii_prompt, "truncate_prompt_tokens": 7}).tokens == 7  # type: ignore[union-attr]
    assert tiny.bound("completions", {"prompt": [1, 2, 3]}) is None  # token ids: exact already


BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
BPE = {"type": "BPE", "byte_fallback": False}


@pytest.mark.parametrize(("tokenizer_json", "expected"), [
    ({"normalizer": None, "pre_tokenizer": BYTE_LEVEL, "model": BPE, "padding": None}, (True, False)),  # GPT-2, Llama 3
    ({"normalizer": {"type": "NFC"}, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split"}, {**BYTE_LEVEL, "use_regex": False}]},
      "model": BPE, "padding": None}, (True, True)),  # Qwen2: ASCII text only
    ({"normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}, {"type": "Replace"}]}, "pre_tokenizer": None,
      "model": {"type": "BPE", "byte_fallback": True}, "padding": None}, (False, True)),  # Llama 2: the normalizer adds characters
    ({"normalizer": None, "pre_tokenizer": {"type": "Metaspace"}, "model": {"type": "Unigram"}, "padding": None}, (False, False)),
    ({"normalizer": None, "pre_tokenizer": {**BYTE_LEVEL, "add_prefix_space": True}, "model": BPE, "padding": None}, (False, False)),
    ({"normalizer": None, "pre_tokenizer": BYTE_LEVEL, "model": BPE, "padding": {"strategy": "BatchLongest"}}, (False, False)),
    ({"normalizer": {"type": "BertNormalizer"}, "pre_tokenizer": {"type": "BertPreTokenizer"}, "model": {"type": "WordPiece"}, "padding": None},
     (False, True)),  # BERT: the normalizer spaces out CJK characters
])
def test_only_tokenizers_that_cannot_exceed_the_bytes_get_a_bound(tokenizer_json: dict[str, Any], expected: tuple[bool, bool]) -> None:
    assert byte_bounded(tokenizer_json) == expected


def test_under_a_normalizer_only_ascii_text_is_bounded() -> None:
    from tokenizers import Tokenizer, normalizers
    from transformers import PreTrainedTokenizerFast

    from slaq.engine.tiny_model import ensure_tiny_model

    backend = Tokenizer.from_file(str(ensure_tiny_model() / "tokenizer.json"))
    backend.normalizer = normalizers.NFKC()  # "ﷺ" (3 bytes) becomes 18 characters (33 bytes) under NFKC
    counter = TokenizerCounter(PreTrainedTokenizerFast(tokenizer_object=backend))
    assert counter.bound("completions", {"prompt": "plain text " * 10}) is not None
    assert counter.bound("completions", {"prompt": "ﷺ" * 10}) is None
    assert counter.measure("completions", {"prompt": "ﷺ" * 10}).tokens > len(("ﷺ" * 10).encode())  # what the bound would have missed


# -- admission -------------------------------------------------------------------------------------

class SlowBoundedCounter:
    """A long prompt's tokenization (no GIL for `seconds`) with an O(bytes) bound."""

    loaded = True

    def __init__(self, seconds: float = 0.5, exact: int = EXACT, bound: int | None = BOUND) -> None:
        self.seconds, self.exact, self._bound = seconds, exact, bound
        self.release = threading.Event()  # set: the count lands now
        self.threads: list[str] = []
        self.niceness: list[int] = []  # of the threads that counted

    def measure(self, kind: str, body: dict[str, Any]) -> PromptCount:
        if not self.offloads(kind, body):
            return PromptCount(len(body["prompt"]), "tokenizer")
        self.threads.append(threading.current_thread().name)
        self.niceness.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        self.release.wait(self.seconds)
        return PromptCount(self.exact, "tokenizer")

    measure_apart = measure  # no encoder process: the thread's own niceness is what the test reads

    def close(self) -> None:
        pass

    def offloads(self, kind: str, body: dict[str, Any]) -> bool:
        return text_chars(kind, body) > OFF_LOOP_TEXT_CHARS

    def bound(self, kind: str, body: dict[str, Any]) -> PromptBound | None:
        return None if self._bound is None else PromptBound(self._bound, ESTIMATE)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class RecordedAccounting:
    """The fairness counters, with every charge recorded."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.charges = inner, []

    def charge(self, tier: str, tenant: str, tokens: float) -> None:
        self.charges.append((tenant, tokens))
        self.inner.charge(tier, tenant, tokens)

    def service_share(self, tier: str, tenant: str) -> float:
        return self.inner.service_share(tier, tenant)


def core(counter: SlowBoundedCounter, tpm: float = TPM) -> SidecarCore:
    table = abc_table(vip={"tokens_per_minute": tpm, "max_concurrency": 8})
    c = SidecarCore(CoreConfig(served_model_name="m"), TenantDirectory.from_table(table), counter=counter, clock=Clock())
    c.accounting = RecordedAccounting(c.accounting)  # type: ignore[assignment]
    return c


def charges(c: SidecarCore) -> list[tuple[str, float]]:
    return c.accounting.charges  # type: ignore[attr-defined]


def level(c: SidecarCore, tenant: str = "vip") -> float:
    return c.quotas._states[tenant].tokens.level  # type: ignore[union-attr]


async def landed(flight: Flight) -> None:
    """The flight's count landed (or, started for nothing, was called off) and its callback has run."""
    assert flight.counting is not None
    with contextlib.suppress(asyncio.CancelledError):
        await flight.counting
    await asyncio.sleep(0)


async def test_a_request_with_room_goes_on_before_its_slow_count_lands() -> None:
    counter = SlowBoundedCounter(seconds=5.0)
    c = core(counter)
    started = time.monotonic()
    flight = await c.admit(c.identify(bearer("vip")), "completions", LONG)
    assert time.monotonic() - started < 1.0  # released to the engine without waiting the 5 s count
    assert flight.entry.release_time is not None and flight.counting is not None and not flight.counting.done()
    assert flight.prompt_tokens == BOUND and flight.entry.view.prompt_tokens == ESTIMATE  # charged the bound, ordered by the estimate
    assert level(c) == TPM - BOUND - 2
    counter.release.set()
    await landed(flight)
    assert counter.threads == [counter.threads[0]] and counter.threads[0].startswith("slaq-settle-count")
    if sys.platform == "linux":  # counted at a lower CPU priority than the request path's (the process's own is untouched)
        assert counter.niceness[0] == min(19, os.getpriority(os.PRIO_PROCESS, 0) + SETTLING_NICENESS)
    assert flight.prompt_tokens == EXACT and level(c) == TPM - EXACT - 2  # the charge came down to the count
    assert b'slaq_prompt_counts_total{method="tokenizer"} 1.0' in c.metrics.render()
    c.finish(flight, output_tokens=2, engine_prompt_tokens=EXACT, status=200)
    assert level(c) == TPM - EXACT - 2 and c.quotas.in_flight("vip") == 0 and charges(c) == [("vip", EXACT + 2)]


async def test_a_count_starts_once_the_first_token_is_forwarded_or_after_a_while_without_one() -> None:
    counter = SlowBoundedCounter(seconds=5.0)
    c = core(counter, tpm=4 * TPM)  # room for both at their bounds
    streaming = await c.admit(c.identify(bearer("vip")), "completions", LONG)
    waiting = await c.admit(c.identify(bearer("vip")), "completions", LONG)
    await asyncio.sleep(0)
    assert counter.threads == []  # neither starts beside the request's way to its first token
    c.first_token(streaming)
    await asyncio.sleep(0.01)
    assert len(counter.threads) == 1 and waiting.count_timer is not None
    await asyncio.sleep(SETTLE_AFTER_S)
    assert waiting.count_timer is None  # no first token within SETTLE_AFTER_S: counted all the same
    counter.release.set()
    for flight in (streaming, waiting):
        await landed(flight)
        assert flight.prompt_tokens == EXACT
    assert counter.threads == ["slaq-settle-count"] * 2 and level(c) == 4 * TPM - 2 * (EXACT + 2)


@pytest.mark.parametrize("exact", [EXACT, 4500])
async def test_a_request_near_its_quota_waits_for_the_exact_count(exact: int) -> None:
    counter = SlowBoundedCounter(seconds=0.3, exact=exact)
    c = core(counter)
    first = await c.admit(c.identify(bearer("vip")), "completions", json.dumps({"prompt": "hi", "max_tokens": 6000}).encode())
    room = level(c)
    assert 3900 < room < BOUND  # the bound would not fit; 1234 would, 4500 would not
    started = time.monotonic()
    if exact > room:
        with pytest.raises(TokenRateExceeded):
            await c.admit(c.identify(bearer("vip")), "completions", LONG)
        assert level(c) == room
    else:
        flight = await c.admit(c.identify(bearer("vip")), "completions", LONG)
        assert flight.counting is None and flight.prompt_tokens == exact and level(c) == room - exact - 2
    assert time.monotonic() - started >= 0.25  # it waited for the count
    assert counter.threads[0].startswith("slaq-count")  # counted first, in the counting threads
    assert counter.niceness[0] == os.getpriority(os.PRIO_PROCESS, 0)  # at the request path's priority: it waits for it
    assert first.ticket.reserved_tokens > 6000


async def test_a_cut_stream_that_ends_before_its_count_is_charged_the_count_when_it_lands() -> None:
    counter = SlowBoundedCounter(seconds=5.0)
    c = core(counter)
    flight = await c.admit(c.identify(bearer("vip")), "completions", LONG)
    c.finish(flight, output_tokens=10, engine_prompt_tokens=None, status=499)  # no usage chunk: the prompt is the sidecar's count
    assert level(c) == TPM - BOUND - 2 and c.quotas.in_flight("vip") == 1  # nothing settled on the bound
    counter.release.set()
    await landed(flight)
    assert level(c) == TPM - EXACT - 10 and c.quotas.in_flight("vip") == 0
    assert charges(c) == [("vip", EXACT + 10)] and c.usage.report("p", "r", {}, c.clock()).tenants["vip"].tokens_per_minute == EXACT + 10
    assert b'slaq_tokens_total{direction="in",tenant="vip",tier="critical"} 1234.0' in c.metrics.render()


async def test_a_count_that_landed_before_its_callback_ran_is_used_by_finish() -> None:
    counter = SlowBoundedCounter(seconds=5.0)
    c = core(counter)
    flight = await c.admit(c.identify(bearer("vip")), "completions", LONG)
    # The count's future done and its callback only scheduled (it runs at the loop's next turn), as when
    # finish runs in a callback queued before it: stand in a future completed right here.
    landing: asyncio.Future[PromptCount] = asyncio.get_running_loop().create_future()
    flight.counting = landing
    landing.add_done_callback(lambda _: c._counted(flight))
    landing.set_result(PromptCount(EXACT, "tokenizer"))
    c.finish(flight, output_tokens=10, engine_prompt_tokens=None, status=499)
    assert level(c) == TPM - EXACT - 10 and flight.settlement.prompt_tokens == EXACT  # type: ignore[union-attr]
    await asyncio.sleep(0)
    assert level(c) == TPM - EXACT - 10  # the callback, run after, changed nothing
    counter.release.set()


@pytest.mark.parametrize("started", [True, False])
@pytest.mark.parametrize("how", ["cancelled_while_queued", "refused_by_engine", "engine_usage"])
async def test_a_late_count_leaks_no_charge(how: str, started: bool) -> None:
    counter = SlowBoundedCounter(seconds=5.0)
    c = core(counter)
    flight = await c.admit(c.identify(bearer("vip")), "completions", LONG)
    if started:  # no first token within SETTLE_AFTER_S: the count starts anyway
        await asyncio.sleep(SETTLE_AFTER_S + 0.05)
    assert bool(counter.threads) == started
    if how == "engine_usage":
        c.finish(flight, output_tokens=2, engine_prompt_tokens=1300, status=200)
        expected = TPM - 1300 - 2
    else:
        c.finish(flight, output_tokens=None, engine_prompt_tokens=None, status=499 if how == "cancelled_while_queued" else 400, refund=True)
        expected = TPM
    assert level(c) == expected and c.quotas.in_flight("vip") == 0
    counter.release.set()
    await landed(flight)
    assert level(c) == expected and flight.prompt_tokens == BOUND  # the late count touched nothing
    assert len(counter.threads) == started  # a request settled before its count started is never counted
    report = c.usage.report("p", "r", {}, c.clock()).tenants["vip"]
    assert report.tokens_per_minute == (1302 if how == "engine_usage" else 0)
    assert charges(c) == ([("vip", 1302)] if how == "engine_usage" else [])


async def test_a_client_gone_while_queued_before_its_count_is_refunded_once() -> None:
    counter = SlowBoundedCounter(seconds=5.0)
    c = core(counter)
    c.gate.max_in_flight = 0  # nothing is released: the request waits in the queue
    task = asyncio.ensure_future(c.admit(c.identify(bearer("vip")), "completions", LONG))
    await asyncio.sleep(0.05)
    assert level(c) == TPM - BOUND - 2 and len(c.queue) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert level(c) == TPM and c.quotas.in_flight("vip") == 0
    counter.release.set()
    await asyncio.sleep(0.2)
    assert level(c) == TPM and counter.threads  # counted, and charged nothing


async def test_without_a_bound_the_prompt_is_counted_before_admission() -> None:
    counter = SlowBoundedCounter(seconds=0.3, bound=None)
    c = core(counter)
    started = time.monotonic()
    flight = await c.admit(c.identify(bearer("vip")), "completions", LONG)
    assert time.monotonic() - started >= 0.25 and flight.counting is None and flight.prompt_tokens == EXACT
    assert level(c) == TPM - EXACT - 2
