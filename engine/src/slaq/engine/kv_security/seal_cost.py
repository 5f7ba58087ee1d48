"""`python -m slaq.engine.kv_security.seal_cost`: what swapping one KV block costs the worker.

Times the connector worker's own code (worker.py's `KVBlockPages`, vault.py's `Vault`) on KV
cache tensors of a model's geometry, on the device at hand: seal = read the block's page from
every layer and encrypt it (what `handle_preemptions` does per block of a victim), open = decrypt
and write it back into every layer (what `start_load_kv` does per block of a readmitted request).
Both run in the worker before the forward pass, one block after the other, so the GPU waits for
them. On CPU tensors nothing crosses a host link: the figures are the host side alone (AES-GCM and
the host copies), which the simulator's profile adds to the host link's time
(`gpu.host_seal_gb_s`). On CUDA they include the device-to-host and host-to-device copies.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from slaq.engine.kv_security.vault import Vault
from slaq.engine.kv_security.worker import KVBlockPages

def host_seal_seconds_per_byte(block_bytes: int, *, blocks: int = 4, repeats: int = 3) -> float:
    """Seconds per byte, one way, of the worker's seal and open of one KV page on this host (the mean
    of the two, best of `repeats`): what the swap rule charges when `hostSealGbS` is not given. The
    host side alone (AES-GCM and its copies); a GPU's device-host copies, at tens of GB/s, add a few
    per cent to a seal at ~1 GB/s."""
    page = bytes(block_bytes)
    vault = Vault()
    vault.seal("probe", "probe", 0, page)  # the key is made on first use: not part of the cost
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for block in range(blocks):
            vault.seal("probe", "probe", block, page)
        for block in range(blocks):
            vault.open("probe", "probe", block)
        best = min(best, (time.perf_counter() - started) / (2 * blocks * block_bytes))
    return best


DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def default_device() -> str:
    """cuda when a CUDA device is here, else cpu."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def measure(*, device: str, layers: int, block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
            blocks: int, repeats: int) -> dict[str, float]:
    """Median seconds per block to seal and to open, over `repeats` rounds of `blocks` blocks."""
    caches = {f"layer.{i}": torch.randn(blocks, 2, block_size, kv_heads, head_dim, device=device).to(dtype) for i in range(layers)}
    pages = KVBlockPages(caches, blocks)
    vault = Vault()
    block_bytes = layers * 2 * block_size * kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()
    seal, open_ = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        for block in range(blocks):
            vault.seal("tenant", "request", block, pages.read(block))
        if device == "cuda":
            torch.cuda.synchronize()
        seal.append((time.perf_counter() - started) / blocks)
        started = time.perf_counter()
        for block in range(blocks):
            pages.write(block, vault.open("tenant", "request", block))
        if device == "cuda":
            torch.cuda.synchronize()
        open_.append((time.perf_counter() - started) / blocks)
        vault.drop("request")
    seal_s, open_s = statistics.median(seal), statistics.median(open_)
    return {
        "block_bytes": block_bytes,
        "seal_s_per_block": round(seal_s, 7),
        "open_s_per_block": round(open_s, 7),
        "seal_gb_s": round(block_bytes / seal_s / 1e9, 3),
        "open_gb_s": round(block_bytes / open_s / 1e9, 3),
        # both ways, as the simulator charges a swapped victim: out, then back in
        "round_trip_gb_s": round(2 * block_bytes / (seal_s + open_s) / 1e9, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slaq.engine.kv_security.seal_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=default_device())
    parser.add_argument("--layers", type=int, default=32, help="default: Llama-3-8B's 32")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--blocks", type=int, default=32, help="blocks sealed and opened per round")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device here", file=sys.stderr)
        return 2
    figures = measure(device=args.device, layers=args.layers, block_size=args.block_size, kv_heads=args.kv_heads,
                      head_dim=args.head_dim, dtype=DTYPES[args.dtype], blocks=args.blocks, repeats=args.repeats)
    print(json.dumps({"device": args.device, "dtype": args.dtype, "layers": args.layers, **figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
