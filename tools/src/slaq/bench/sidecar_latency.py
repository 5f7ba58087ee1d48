"""Added time-to-first-token of the sidecar vs going straight to the engine (prints figures).

A fast fake engine (tools/src/slaq/testing/fake_engine.py: vLLM's SSE format, `--tokens` tokens, the
first after `--token-delay-ms`) runs in its own process; `slaq sidecar` runs in another, in front
of it. A load generator (this process) keeps C streams busy, each sending streaming completions
back to back, alternately straight to the engine and through the sidecar (which goes first swaps
from pair to pair), and measures TTFT as the time from sending the request to the first SSE event
carrying a token. The added TTFT is the difference of the two distributions' percentiles. Pairing
the two paths request by request means a change in the machine's load during the run (another
process, a CPU's frequency) lands on both columns alike instead of on whichever ran at the time.
The load generator shares the machine's CPUs with both servers, so at high C its own overhead is
part of both columns.

    python tools/src/slaq/bench/sidecar_latency.py [--streams 1 50 200] [--requests-per-stream 20]
        [--prompt-tokens 4096 [--tokenizer PATH_OR_ID|tiny]] [--out FILE]

`--tokenizer` runs the sidecar with that tokenizer (`tiny`: the built-in tiny model's), so the prompt
is counted as the engine counts it; without it the sidecar estimates. `--prompt-tokens` sends a prompt
of that many tokens (by the tokenizer when given, else 4 characters per token).
--out writes the figures as JSON (schema slaq.bench.sidecar_latency/v1, with the run's envelope:
command line, date, commit, and the load average before the run) for docs/results.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from slaq.api.table import TenantEntry, TenantTable, derive_cache_salt, hash_api_key
from slaq.local.processes import free_port
from slaq.sse import alines
from slaq.testing.fake_engine import fake_user

KEY = "sk-bench-0123456789"
UPSTREAM = (
    "import uvicorn; from slaq.testing.fake_engine import FakeEngine; "
    "uvicorn.run(FakeEngine(), host='127.0.0.1', port={port}, log_level='warning', access_log=False)"
)


def wait_ready(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout_s:.0f}s")


async def one(client: httpx.AsyncClient, url: str, headers: dict[str, str], body: dict) -> float:
    start = time.perf_counter()
    async with client.stream("POST", url, json=body, headers=headers) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{url}: {response.status_code} {await response.aread()!r}")
        ttft = None
        async for line in alines(response.aiter_bytes()):
            if ttft is None and line.startswith("data: {") and '"text"' in line:
                ttft = time.perf_counter() - start
    if ttft is None:
        raise RuntimeError("stream ended without a token")
    return ttft


async def run_level(direct: str, sidecar: str, streams: int, per_stream: int, headers: dict[str, str],
                    body: dict) -> tuple[list[float], list[float]]:
    """TTFTs (s) straight to the engine and through the sidecar: each of `streams` streams sends
    `per_stream` pairs back to back, one request each way, the first way alternating."""
    limits = httpx.Limits(max_connections=streams + 8, max_keepalive_connections=streams + 8)
    async with httpx.AsyncClient(base_url=direct, timeout=60, limits=limits) as straight, \
            httpx.AsyncClient(base_url=sidecar, timeout=60, limits=limits) as through:
        await asyncio.gather(*(one(client, "/v1/completions", headers, body) for client in (straight, through) for _ in range(streams)))  # warm connections
        samples: dict[httpx.AsyncClient, list[float]] = {straight: [], through: []}
        errors: list[str] = []

        async def worker(first: int) -> None:
            for i in range(per_stream):
                pair = (straight, through) if (first + i) % 2 == 0 else (through, straight)
                for client in pair:
                    try:
                        samples[client].append(await one(client, "/v1/completions", headers, body))
                    except (httpx.HTTPError, RuntimeError) as exc:  # counted and shown, not fatal
                        errors.append(f"{client.base_url}: {type(exc).__name__}: {exc}"[:200])

        await asyncio.gather(*(worker(first) for first in range(streams)))
        if errors:
            print(f"  at {streams} streams: {len(errors)} failed requests, e.g. {errors[0]}")
        return samples[straight], samples[through]


def added_buckets(metrics: str) -> dict[float, float]:
    """Cumulative bucket counts of the sidecar's own `slaq_sidecar_added_seconds` histogram (metrics port)."""
    buckets = {}
    for line in httpx.get(metrics + "/metrics", timeout=10).text.splitlines():
        if line.startswith("slaq_sidecar_added_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[float("inf") if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return buckets


def bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """Upper bound (bucket edge, ms) of the q-quantile of the observations between two scrapes."""
    edges = sorted(after)
    total = after[float("inf")] - before.get(float("inf"), 0.0)
    for edge in edges:
        if after[edge] - before.get(edge, 0.0) >= q * total:
            return edge * 1000.0
    return float("inf")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000.0


SENTENCE = "The scheduler preempts a batch decode when an urgent request arrives and the batch is full. "


def prompt_of(tokens: int, tokenizer: str | None) -> str:
    """English text of `tokens` tokens by `tokenizer` (characters / 4 without one)."""
    if not tokenizer:
        return (SENTENCE * (tokens * 4 // len(SENTENCE) + 1))[: tokens * 4]
    from transformers import AutoTokenizer

    model = AutoTokenizer.from_pretrained(tokenizer)
    return model.decode(model.encode(SENTENCE * (tokens // 4 + 1), add_special_tokens=False)[:tokens])


def wait_tokenizer(metrics: str, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if "slaq_tokenizer_loaded 1.0" in httpx.get(metrics + "/metrics", timeout=10).text:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the sidecar's tokenizer was not loaded after {timeout_s:.0f}s (see its log)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 50, 200])
    parser.add_argument("--requests-per-stream", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--token-delay-ms", type=float, default=5.0)
    parser.add_argument("--prompt-tokens", type=int, default=0, help="Prompt length in tokens (default: 'hello ' × 50).")
    parser.add_argument("--tokenizer", default=None, help="The sidecar's --tokenizer (tiny: the built-in tiny model's); default none (estimated).")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as a JSON report here")
    args = parser.parse_args()
    tokenizer_name = args.tokenizer  # as given ("tiny", a hub id), for the report: not this machine's path
    if args.tokenizer == "tiny":
        from slaq.engine.tiny_model import ensure_tiny_model

        args.tokenizer = str(ensure_tiny_model())

    from slaq.bench.envelope import envelope
    from slaq.bench.report import write_report

    run = envelope()
    load_average = os.getloadavg()[0]

    workdir = Path(tempfile.mkdtemp(prefix="slaq-bench-sidecar-"))
    table = workdir / "tenants.json"
    table.write_text(TenantTable(pool="bench/pool", revision="1", tenants=[
        TenantEntry(name="bench", tier="standard", ttft_ms=2000.0, key_hashes=[hash_api_key(KEY)], cache_salt=derive_cache_salt(b"b", "bench")),
    ]).model_dump_json(by_alias=True))
    upstream_port, sidecar_port, metrics_port = free_port(), free_port(), free_port()
    sidecar_log = open(workdir / "sidecar.log", "wb")
    print(f"sidecar log: {workdir / 'sidecar.log'}")
    # The children import slaq as installed: the repository root on PYTHONPATH would let its top-level
    # folders (operator/, …) shadow stdlib modules.
    env = dict(os.environ)
    processes = [
        subprocess.Popen([sys.executable, "-c", UPSTREAM.format(port=upstream_port)], cwd=workdir, env=env),
        subprocess.Popen([sys.executable, "-m", "slaq", "sidecar", "--host", "127.0.0.1", "--port", str(sidecar_port),
                          "--metrics-port", str(metrics_port),
                          "--engine-url", f"http://127.0.0.1:{upstream_port}", "--tenant-table", str(table),
                          "--max-queue-depth", "100000", *(["--tokenizer", args.tokenizer] if args.tokenizer else [])],
                         cwd=workdir, env=env, stdout=sidecar_log, stderr=subprocess.STDOUT),
    ]
    try:
        direct, sidecar, metrics = f"http://127.0.0.1:{upstream_port}", f"http://127.0.0.1:{sidecar_port}", f"http://127.0.0.1:{metrics_port}"
        wait_ready(direct + "/health")
        wait_ready(sidecar + "/ready")
        if args.tokenizer:
            wait_tokenizer(metrics)
        headers = {"authorization": f"Bearer {KEY}"}
        # The fake engine's controls ride in `user`: the sidecar forwards no x-fake-* header.
        prompt = prompt_of(args.prompt_tokens, args.tokenizer) if args.prompt_tokens else "hello " * 50
        body = {"model": "fake-model", "prompt": prompt, "max_tokens": args.tokens, "stream": True,
                "user": fake_user(tokens=args.tokens, delay_ms=args.token_delay_ms)}
        print(f"prompt: {len(prompt)} characters ({args.prompt_tokens or 'about 50'} tokens); sidecar tokenizer: {args.tokenizer or 'none (estimated)'}")
        print(f"load average {load_average:.1f} before the run; fake engine: {args.tokens} tokens, first after {args.token_delay_ms:g} ms; {args.requests_per_stream} requests per stream; CPUs: {os.cpu_count()}")
        print(f"{'streams':>8} {'n':>6} {'direct p50':>11} {'direct p99':>11} {'sidecar p50':>12} {'sidecar p99':>12} {'added p50':>10} {'added p99':>10}  (ms)")
        own = []
        rows: list[dict] = []
        for streams in args.streams:
            before = added_buckets(metrics)
            d, s = asyncio.run(run_level(direct, sidecar, streams, args.requests_per_stream, headers, body))
            after = added_buckets(metrics)
            own.append((streams, bucket_quantile(before, after, 0.5), bucket_quantile(before, after, 0.99)))
            print(f"{streams:>8} {len(s):>6} {pct(d, .5):>11.2f} {pct(d, .99):>11.2f} {pct(s, .5):>12.2f} {pct(s, .99):>12.2f} "
                  f"{pct(s, .5) - pct(d, .5):>10.2f} {pct(s, .99) - pct(d, .99):>10.2f}  mean added {1000 * (statistics.fmean(s) - statistics.fmean(d)):.2f}")
            rows.append({"streams": streams, "requests": len(s), "direct_p50_ms": pct(d, .5), "direct_p99_ms": pct(d, .99),
                         "sidecar_p50_ms": pct(s, .5), "sidecar_p99_ms": pct(s, .99),
                         "added_p50_ms": pct(s, .5) - pct(d, .5), "added_p99_ms": pct(s, .99) - pct(d, .99),
                         "own_p50_ms_at_most": own[-1][1], "own_p99_ms_at_most": own[-1][2]})
        print("the sidecar's own share of TTFT (slaq_sidecar_added_seconds: its work before the engine call + forwarding the first token),")
        print("as bucket upper bounds in ms:")
        for streams, p50, p99 in own:
            print(f"{streams:>8} streams: p50 <= {p50:g} ms, p99 <= {p99:g} ms")
        if args.out:
            write_report({"schema": "slaq.bench.sidecar_latency/v1", "load_average_before": load_average, "cpus": os.cpu_count(), "paired": True,
                          "tokens": args.tokens, "token_delay_ms": args.token_delay_ms,
                          "prompt_tokens": args.prompt_tokens or None, "prompt_chars": len(prompt), "tokenizer": tokenizer_name,
                          "requests_per_stream": args.requests_per_stream, "rows": rows}, args.out, run)
            print(f"report: {args.out}")
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


if __name__ == "__main__":
    main()
