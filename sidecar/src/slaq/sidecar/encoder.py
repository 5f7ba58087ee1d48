"""`EncoderWorkers`: the model's Rust tokenizer in worker processes of their own.

A long prompt's count is a few milliseconds of CPU (4k tokens: 1.5-3 ms on this project's 2-core
machine). Run on a thread of the sidecar's process, it delays the event loop even though the
encoder releases the GIL: with an asyncio loop timing 1 ms sleeps while a thread counts a 4k-token
prompt every 5 ms (tools/src/slaq/bench/count_loop_lag.py), the loop's lag at p99 is 2.3-2.6 ms with
the encoding on that thread, 0.4-1.7 ms with it here, 0.2 ms with nothing counting (three runs). A
thread doing as much pure Python work cost 0.23 ms, so the GIL is not the cause; the encoder's
allocations in the serving process are the likely one. So the sidecar's long prompts are encoded
here: `TokenizerCounter.measure_apart` from the threads that count them, which wait on a pipe
meanwhile.

The workers are spawned (the sidecar runs threads, which fork must not copy), `WORKER_NICENESS`
levels nicer (as the parsing workers), and load the tokenizer from its JSON (the `tokenizers`
library only: no `transformers`, so no torch in a worker even where torch is installed). Chat
templates are rendered in the sidecar; only text crosses the pipe, and only lengths come back.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from slaq.sidecar.payload import WORKER_NICENESS

_tokenizer: Any = None  # in a worker: its tokenizer


def _start(tokenizer_json: str) -> None:
    global _tokenizer
    os.nice(WORKER_NICENESS)
    from tokenizers import Tokenizer

    _tokenizer = Tokenizer.from_str(tokenizer_json)


def _lengths(texts: list[str], add_special_tokens: bool) -> list[int]:
    return [len(encoding) for encoding in _tokenizer.encode_batch_fast(texts, add_special_tokens=add_special_tokens)]


def _pid() -> int:
    return os.getpid()


class EncoderWorkers:
    def __init__(self, tokenizer_json: str, processes: int) -> None:
        self._executor = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_start, initargs=(tokenizer_json,))

    def lengths(self, texts: list[str], add_special_tokens: bool) -> list[int]:
        """Each text's tokens, encoded in a worker (blocks: call it from a thread, never the event
        loop). Raises what the worker raised, or `BrokenProcessPool` when a worker died."""
        return self._executor.submit(_lengths, texts, add_special_tokens).result()

    def pid(self) -> int:
        """The process id of a worker (it is started if none is): a worker answers."""
        return self._executor.submit(_pid).result()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
