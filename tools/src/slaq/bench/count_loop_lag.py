"""How much counting a long prompt delays the sidecar's event loop, by where it is encoded (prints figures).

An asyncio loop sleeps 1 ms `--samples` times and records how late each wake-up is, as the
sidecar's loop is late to forward a token, while a thread counts a prompt of `--prompt-tokens`
tokens (the built-in tiny model's tokenizer) every 5 ms, as the sidecar's counting threads do:

- `idle`: nothing counts (the floor);
- `thread`: the thread encodes in this process (`TokenizerCounter.measure`);
- `process`: the thread has the text encoded in an encoder process (`measure_apart`, encoder.py),
  as the sidecar does.

    python tools/src/slaq/bench/count_loop_lag.py [--prompt-tokens 4096] [--samples 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time

from slaq.bench.sidecar_latency import pct, prompt_of
from slaq.engine.tiny_model import ensure_tiny_model
from slaq.sidecar.tokens import ENCODER_PROCESSES, TokenizerCounter

MODES = ("idle", "thread", "process")
SLEEP_S = 0.001
COUNT_EVERY_S = 0.005


async def lags(samples: int) -> list[float]:
    """How late (s) each of `samples` wake-ups from a `SLEEP_S` sleep is."""
    late = []
    for _ in range(samples):
        start = time.perf_counter()
        await asyncio.sleep(SLEEP_S)
        late.append(time.perf_counter() - start - SLEEP_S)
    return late


def run(mode: str, counter: TokenizerCounter, body: dict, samples: int) -> list[float]:
    stop = threading.Event()
    measure = counter.measure_apart if mode == "process" else counter.measure

    def count() -> None:
        while not stop.wait(COUNT_EVERY_S):
            measure("completions", body)

    worker = threading.Thread(target=count, daemon=True) if mode != "idle" else None
    if worker is not None:
        worker.start()
    try:
        return asyncio.run(lags(samples))
    finally:
        stop.set()
        if worker is not None:
            worker.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=4096)
    parser.add_argument("--samples", type=int, default=3000)
    args = parser.parse_args()
    model = str(ensure_tiny_model())
    counter = TokenizerCounter.load(model, encoder_processes=ENCODER_PROCESSES)
    try:
        body = {"prompt": prompt_of(args.prompt_tokens, model)}  # the text sidecar_latency.py sends
        started = time.perf_counter()
        for _ in range(20):
            counter.measure("completions", body)
        print(f"prompt: {counter.measure('completions', body).tokens} tokens, "
              f"{(time.perf_counter() - started) / 20 * 1000:.2f} ms to count in this process")
        print(f"{'mode':>8}  {'lag p50':>8}  {'lag p99':>8}  {'max':>8}  (ms, {args.samples} wake-ups of a {SLEEP_S * 1000:.0f} ms sleep)")
        for mode in MODES:
            late = run(mode, counter, body, args.samples)
            print(f"{mode:>8}  {pct(late, 0.5):8.3f}  {pct(late, 0.99):8.3f}  {max(late) * 1000:8.3f}")
    finally:
        counter.close()


if __name__ == "__main__":
    main()
