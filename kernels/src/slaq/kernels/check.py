"""`python -m slaq.kernels.check`: the KV-block kernels against their torch references, and the
cost of erasing a block, on the device at hand.

On CUDA the Triton kernels run natively; on CPU they run under the Triton interpreter when
TRITON_INTERPRET=1 is set before this module is imported (slow: correctness only), else only the
reference path is timed. The page shape defaults to one layer of a Llama-3-8B block (block of 16
tokens, K and V, 8 KV heads of 128, bf16: 64 KiB); a scheduler block spans every layer (32), so
the cost per erased block is the per-layer figure times the layer count, which is what is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from slaq.kernels import kv_blocks as k

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def check_agreement(device: str, dtypes: list[torch.dtype]) -> list[str]:
    """Erase and copy through `kv_blocks` (Triton when it applies) equal the torch references."""
    failures = []
    torch.manual_seed(0)
    for dtype in dtypes:
        cache = torch.randn(12, 2, 16, 2, 40, device=device).to(dtype)  # page of 2560 elements: > 2 chunks
        expected = cache.clone()
        k.erase_blocks(cache, [3, 7, 11])
        k.erase_blocks_reference(expected, [3, 7, 11])
        if not torch.equal(cache, expected):
            failures.append(f"erase {dtype}")
        k.copy_blocks(cache, [0, 1], [4, 9])
        k.copy_blocks_reference(expected, [0, 1], [4, 9])
        if not torch.equal(cache, expected) or not torch.equal(cache[4], cache[0]):
            failures.append(f"copy {dtype}")
    return failures


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def erase_cost(device: str, dtype: torch.dtype, *, num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
               layers: int, batch: int, repeats: int) -> dict[str, float]:
    """Seconds to zero `batch` blocks of one layer (median of `repeats`), and per block over all layers."""
    cache = torch.ones(num_blocks, 2, block_size, kv_heads, head_dim, device=device, dtype=dtype)
    ids = list(range(0, num_blocks, max(1, num_blocks // batch)))[:batch]
    k.erase_blocks(cache, ids)  # compile / warm up
    _sync(device)
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        k.erase_blocks(cache, ids)
        _sync(device)
        samples.append(time.perf_counter() - started)
    median = sorted(samples)[len(samples) // 2]
    page_bytes = cache[0].numel() * cache.element_size()
    return {
        "batch_blocks": len(ids),
        "layer_seconds": median,
        "seconds_per_block_all_layers": median / len(ids) * layers,
        "page_bytes_per_layer": page_bytes,
        "effective_gb_s": page_bytes * len(ids) / median / 1e9,
        "triton": k._use_triton(cache),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slaq.kernels.check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--num-blocks", type=int, default=4096)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64, help="blocks erased per call (a step's worth)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--skip-timing", action="store_true")
    args = parser.parse_args(argv)

    failures = check_agreement(args.device, list(DTYPES.values()))
    report: dict[str, object] = {"device": args.device, "triton_interpreter": k._interpreting(), "agreement_failures": failures}
    if not args.skip_timing:
        report["erase"] = erase_cost(args.device, DTYPES[args.dtype], num_blocks=args.num_blocks, block_size=args.block_size,
                                     kv_heads=args.kv_heads, head_dim=args.head_dim, layers=args.layers, batch=args.batch, repeats=args.repeats)
    print(json.dumps(report, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
