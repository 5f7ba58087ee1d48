"""Kill a process group once its engine has generated N more tokens, from a process of its own.

The engine-kill test must land its SIGKILL mid-stream. Timed by the test's client it can land
late: the client shares its process with the emulated API server and the operator, and on a loaded
machine it can read a stream's first event after the engine has written the whole stream (CI once
saw 5 of 16 streams whole, 11 not yet started and none cut). Counted here, on the engine's own
`vllm:generation_tokens_total`, the kill lands at the first reading of at least N tokens whatever
the client's lag; vLLM's counter moves in batches (readings of 1,500 and 2,931 at its first change
were seen), so the test tries again when no stream was mid-way.

    python -m e2e.killer ENGINE_URL PGID TOKENS

prints `baseline N` once it has read the counter (start the load after that line), then
`killed at N` (the tokens generated since the baseline) and exits 0; exits 1 if the engine stops
answering or the tokens never come within the time limit.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import httpx

COUNTER = "vllm:generation_tokens_total"
POLL_S = 0.01
LIMIT_S = 120.0


def generated_tokens(metrics_text: str) -> float:
    """The engine's generated tokens: the counter's samples summed (one per model and engine)."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith(COUNTER) and line[len(COUNTER)] in " {":
            total += float(line.rsplit(" ", 1)[1])
    return total


def main(argv: list[str]) -> int:
    engine_url, pgid, tokens = argv[0], int(argv[1]), int(argv[2])
    with httpx.Client(timeout=5.0) as http:
        def read() -> float:
            return generated_tokens(http.get(engine_url + "/metrics").text)

        baseline = read()
        print(f"baseline {baseline:.0f}", flush=True)
        deadline = time.monotonic() + LIMIT_S
        while time.monotonic() < deadline:
            generated = read() - baseline
            if generated >= tokens:
                os.killpg(pgid, signal.SIGKILL)
                print(f"killed at {generated:.0f}", flush=True)
                return 0
            time.sleep(POLL_S)
    print(f"the engine generated fewer than {tokens} tokens in {LIMIT_S:.0f} s", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
