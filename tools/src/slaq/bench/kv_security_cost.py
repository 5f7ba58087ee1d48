"""What KV security costs on the machine at hand, as a report: sealing and opening a swapped block
(the connector worker's own code, `slaq.engine.kv_security.seal_cost`) and erasing freed blocks
(`slaq.kernels.check`'s erase timing: Triton on CUDA, the torch reference elsewhere).

    python tools/src/slaq/bench/kv_security_cost.py [--device cpu|cuda] [--repeats 5] [--out FILE]

The geometry is Llama-3-8B's (32 layers; blocks of 16 tokens, K and V, 8 KV heads of 128; bf16:
2 MiB a block over all layers). Wall clock: the machine and its load (the envelope records both)
are part of the figures. --out writes them as JSON (schema slaq.bench.kv_security_cost/v1, with
the run's envelope: command line, date, commit, load average) for docs/results.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

SCHEMA = "slaq.bench.kv_security_cost/v1"
GEOMETRY = {"layers": 32, "block_size": 16, "kv_heads": 8, "head_dim": 128}  # Llama-3-8B
DTYPE = "bfloat16"
SEAL_BLOCKS = 32  # blocks sealed and opened per round
ERASE_BLOCKS, ERASE_BATCH = 512, 16  # a cache of 512 blocks, 16 erased per call (a step's worth)


def measure(device: str, repeats: int) -> dict[str, Any]:
    from slaq.engine.kv_security.seal_cost import DTYPES, measure as seal_measure
    from slaq.kernels.check import erase_cost

    dtype = DTYPES[DTYPE]
    seal = seal_measure(device=device, dtype=dtype, blocks=SEAL_BLOCKS, repeats=repeats, **GEOMETRY)
    erase = erase_cost(device, dtype, num_blocks=ERASE_BLOCKS, batch=ERASE_BATCH, repeats=max(repeats, 3), **GEOMETRY)
    per_token_us = (seal["seal_s_per_block"] + seal["open_s_per_block"]) / GEOMETRY["block_size"] * 1e6
    return {"schema": SCHEMA, "device": device, "dtype": DTYPE, "geometry": GEOMETRY, "repeats": repeats,
            "seal": {**seal, "out_and_back_us_per_token": round(per_token_us, 2)}, "erase": erase}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when a CUDA device is here, else cpu")
    parser.add_argument("--repeats", type=int, default=5, help="rounds; the median counts")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as a JSON report here")
    args = parser.parse_args(argv)
    from slaq.engine.kv_security.seal_cost import default_device

    here = default_device()
    args.device = args.device or here
    if args.device == "cuda" and here != "cuda":
        print("error: --device cuda but no CUDA device here", file=sys.stderr)
        return 2
    if args.repeats < 1:
        print(f"error: --repeats must be >= 1, got {args.repeats}", file=sys.stderr)
        return 2

    from slaq.bench.envelope import envelope
    from slaq.bench.report import write_report

    run = envelope(None if argv is None else [__file__, *argv])
    report = measure(args.device, args.repeats)
    seal, erase = report["seal"], report["erase"]
    print(f"{args.device}, {DTYPE}, Llama-3-8B blocks of {seal['block_bytes'] / 2**20:g} MiB: seal {seal['seal_gb_s']:g} GB/s, "
          f"open {seal['open_gb_s']:g} GB/s ({seal['out_and_back_us_per_token']:g} µs per token out and back); erase "
          f"{erase['seconds_per_block_all_layers'] * 1e3:.3f} ms per block over {GEOMETRY['layers']} layers "
          f"({'Triton' if erase['triton'] else 'torch reference'})")
    if args.out is not None:
        write_report(report, args.out, run)
        print(f"report: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
