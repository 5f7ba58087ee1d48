"""KV-cache block erase and copy: Triton kernels for GPUs, each with a torch reference path.

vLLM 0.32 hands each layer's KV cache to a KV connector as a view with the block (page) as the
first dimension. When that view is contiguous (the usual per-layer layouts) it is a
`[num_blocks, page_elements]` array, which the Triton kernels work on, one program per (block,
chunk of the page). When the resolved layout interleaves layers or heads (`VLLM_KV_CACHE_LAYOUT`),
the view is strided: `erase_blocks` then zeroes it with torch's `index_fill_`, which writes through
any strides; `copy_blocks` refuses it. slaq's KV connector (`slaq.engine.kv_security`) calls
`erase_blocks` on every layer, before a step's forward pass, for the blocks that held another
tenant's data (or an onFree tenant's freed blocks); KV data may be sensitive (design report 1.6).
`copy_blocks` is not used by the engine yet.

`erase_blocks` and `copy_blocks` pick the Triton kernel when the tensor is contiguous and on a
CUDA device (or when TRITON_INTERPRET=1 asks for the interpreter, which is how the tests run the
real kernel code on CPU), and the torch reference otherwise.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs without triton use the reference path
    triton = None

CHUNK = 1024


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _use_triton(cache: torch.Tensor) -> bool:
    return triton is not None and cache.is_contiguous() and (cache.is_cuda or _interpreting())


def _pages(cache: torch.Tensor) -> torch.Tensor:
    """The `[num_blocks, page_elements]` view of one layer's cache (no copy)."""
    if not cache.is_contiguous():
        raise ValueError("KV cache tensor must be contiguous with the block dimension outermost")
    return cache.view(cache.shape[0], -1)


def _host_ids(block_ids: Sequence[int] | torch.Tensor, num_blocks: int) -> list[int]:
    """Block ids as Python ints, range-checked on the host (one device read at most)."""
    ids = block_ids.flatten().tolist() if isinstance(block_ids, torch.Tensor) else [int(b) for b in block_ids]
    if ids and (min(ids) < 0 or max(ids) >= num_blocks):
        raise IndexError(f"block id out of range 0..{num_blocks - 1}")
    return ids


def _copy_pairs(src: Sequence[int] | torch.Tensor, dst: Sequence[int] | torch.Tensor, num_blocks: int) -> tuple[list[int], list[int]]:
    src_ids, dst_ids = _host_ids(src, num_blocks), _host_ids(dst, num_blocks)
    if len(src_ids) != len(dst_ids):
        raise ValueError(f"{len(src_ids)} source blocks but {len(dst_ids)} destination blocks")
    return src_ids, dst_ids


def _on(ids: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.int64, device=device)


def erase_blocks_reference(cache: torch.Tensor, block_ids: Sequence[int] | torch.Tensor) -> None:
    """Zero the blocks through torch: any strides, the block dimension first."""
    cache.index_fill_(0, _on(_host_ids(block_ids, cache.shape[0]), cache.device), 0)


def copy_blocks_reference(cache: torch.Tensor, src: Sequence[int] | torch.Tensor, dst: Sequence[int] | torch.Tensor) -> None:
    pages = _pages(cache)
    src_ids, dst_ids = _copy_pairs(src, dst, pages.shape[0])
    pages[_on(dst_ids, pages.device)] = pages[_on(src_ids, pages.device)].clone()


if triton is not None:

    @triton.jit
    def _erase_kernel(pages_ptr, ids_ptr, page_elems, CHUNK_SIZE: tl.constexpr):
        block = tl.load(ids_ptr + tl.program_id(0))
        offsets = tl.program_id(1) * CHUNK_SIZE + tl.arange(0, CHUNK_SIZE)
        mask = offsets < page_elems
        row = pages_ptr + block * page_elems
        zeros = tl.zeros([CHUNK_SIZE], dtype=pages_ptr.dtype.element_ty)
        tl.store(row + offsets, zeros, mask=mask)

    @triton.jit
    def _copy_kernel(pages_ptr, src_ptr, dst_ptr, page_elems, CHUNK_SIZE: tl.constexpr):
        src = tl.load(src_ptr + tl.program_id(0))
        dst = tl.load(dst_ptr + tl.program_id(0))
        offsets = tl.program_id(1) * CHUNK_SIZE + tl.arange(0, CHUNK_SIZE)
        mask = offsets < page_elems
        values = tl.load(pages_ptr + src * page_elems + offsets, mask=mask)
        tl.store(pages_ptr + dst * page_elems + offsets, values, mask=mask)


def erase_blocks(cache: torch.Tensor, block_ids: Sequence[int] | torch.Tensor) -> None:
    """Zero the given blocks of one layer's KV cache, in place."""
    if not _use_triton(cache):
        erase_blocks_reference(cache, block_ids)
        return
    pages = _pages(cache)
    ids = _host_ids(block_ids, pages.shape[0])
    if ids:
        grid = (len(ids), triton.cdiv(pages.shape[1], CHUNK))
        _erase_kernel[grid](pages, _on(ids, pages.device), pages.shape[1], CHUNK_SIZE=CHUNK)


def copy_blocks(cache: torch.Tensor, src: Sequence[int] | torch.Tensor, dst: Sequence[int] | torch.Tensor) -> None:
    """Copy blocks `src[i]` to `dst[i]` of one layer's KV cache, in place.

    Destinations must be distinct from each other and from every source (the block manager only
    copies into freshly allocated blocks), so the programs never race.
    """
    pages = _pages(cache)
    src_ids, dst_ids = _copy_pairs(src, dst, pages.shape[0])
    if len(set(dst_ids)) != len(dst_ids) or set(dst_ids) & set(src_ids):
        raise ValueError("destination blocks must be distinct and must not be sources")
    if not _use_triton(cache):
        copy_blocks_reference(cache, src_ids, dst_ids)
        return
    if src_ids:
        grid = (len(src_ids), triton.cdiv(pages.shape[1], CHUNK))
        _copy_kernel[grid](pages, _on(src_ids, pages.device), _on(dst_ids, pages.device), pages.shape[1], CHUNK_SIZE=CHUNK)


def erase_blocks_all_layers(caches: Sequence[torch.Tensor], block_ids: Sequence[int]) -> None:
    """Zero the given blocks in every layer (block ids are shared across layers of one KV group)."""
    ids = list(block_ids)  # read once, whatever iterable the caller holds
    for cache in caches:
        erase_blocks(cache, ids)
