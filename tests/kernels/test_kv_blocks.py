"""The Triton KV-block kernels agree with their torch references.

The kernels run under the Triton interpreter (TRITON_INTERPRET=1) in a subprocess, because the
interpreter is chosen when a kernel is defined and vLLM may already have imported triton here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from slaq.kernels.kv_blocks import copy_blocks, copy_blocks_reference, erase_blocks, erase_blocks_reference

triton = pytest.importorskip("triton")

CHECK = textwrap.dedent(
    """
    import torch
    from slaq.kernels import kv_blocks as k
    assert k._use_triton(torch.zeros(1))
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        # (num_blocks, 2, block_size, kv_heads, head_dim); page = 2*16*2*40 = 2560 elements, > 2 chunks
        cache = torch.randn(12, 2, 16, 2, 40).to(dtype)
        expected = cache.clone()
        k.erase_blocks(cache, [3, 7, 11])
        k.erase_blocks_reference(expected, [3, 7, 11])
        assert torch.equal(cache, expected), "erase"
        k.copy_blocks(cache, [0, 1], [4, 9])
        k.copy_blocks_reference(expected, [0, 1], [4, 9])
        assert torch.equal(cache, expected), "copy"
        assert torch.count_nonzero(cache[3]) == 0 and torch.equal(cache[4], cache[0])
    print("kernels ok")
    """
)


def test_triton_kernels_match_reference_under_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "kernels ok" in result.stdout


def test_reference_erase_zeroes_only_the_given_blocks() -> None:
    cache = torch.ones(6, 2, 4, 1, 8)
    erase_blocks(cache, [1, 4])  # CPU tensor without the interpreter: the reference path
    assert torch.count_nonzero(cache[1]) == 0 and torch.count_nonzero(cache[4]) == 0
    assert torch.all(cache[[0, 2, 3, 5]] == 1)
    erase_blocks(cache, torch.tensor([[0], [5]]))  # ids may come as a tensor of any shape
    assert torch.count_nonzero(cache[0]) == 0 and torch.count_nonzero(cache[5]) == 0
    assert torch.all(cache[[2, 3]] == 1)


def test_erase_writes_through_a_strided_block_first_view() -> None:
    """A layout that interleaves layers (block outermost across layers) hands each layer a strided
    view; erasing one layer's blocks zeroes exactly those pages of the shared buffer."""
    buffer = torch.ones(6, 3, 2, 4, 8)  # (block, layer, ...): layer 1's view is strided
    layer = buffer[:, 1]
    assert not layer.is_contiguous()
    erase_blocks(layer, [2, 5])
    assert torch.count_nonzero(buffer[[2, 5], 1]) == 0
    assert int(torch.count_nonzero(buffer)) == buffer.numel() - 2 * layer[0].numel()
    with pytest.raises(ValueError, match="contiguous"):
        copy_blocks(layer, [0], [1])


def test_copy_refuses_overlapping_or_mismatched_ids() -> None:
    cache = torch.arange(4 * 8, dtype=torch.float32).view(4, 8)
    with pytest.raises(ValueError):
        copy_blocks(cache, [0, 1], [1, 2])
    with pytest.raises(ValueError):
        copy_blocks(cache, [0], [2, 3])
    with pytest.raises(IndexError):
        erase_blocks(cache, [4])
    copy_blocks(cache, [0], [3])
    assert torch.equal(cache[3], cache[0])


def test_reference_copy_is_the_definition() -> None:
    cache = torch.randn(5, 2, 4, 1, 8)
    before = cache.clone()
    copy_blocks_reference(cache, [2], [0])
    assert torch.equal(cache[0], before[2]) and torch.equal(cache[1:], before[1:])
    erase_blocks_reference(cache, [])
    assert torch.equal(cache[0], before[2])
