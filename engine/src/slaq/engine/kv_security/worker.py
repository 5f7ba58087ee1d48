"""The worker side of slaq's KV connector: carries out a step's `KVSecurityPlan` on the KV tensors.

vLLM hands the connector every layer's KV cache tensor (`register_kv_caches`), block dimension
first. A scheduler block may span several kernel blocks (the attention backend's block size can
be a divisor of the scheduler's), so block `b` of a layer with `r` kernel blocks per scheduler
block is rows `b*r .. b*r+r-1`. Erasing calls `slaq.kernels.kv_blocks` (Triton on CUDA, the torch
reference on CPU); sealing and opening host copies goes through vault.py.

Before the forward pass (`handle_preemptions`): seal the preempted, drop stale copies, zero. At
`start_load_kv` (still before the forward pass): fill readmitted requests' blocks from their
copies; a block that cannot be opened is reported to vLLM (`get_block_ids_with_load_errors`),
which recomputes the request from there.

Test hooks, off in production (`kv_connector_extra_config`): `inspectPath` appends one JSON line
per block handed to another tenant, with its non-zero element count before and after the erase
(both before the forward pass writes it); `tamperFlag` names a file: while it exists, one
ciphertext byte of every host copy is flipped before the copy is opened; `stepDelayS` makes every
forward step sleep that long at `start_load_kv` (the tiny test model's steps, ~3 ms, are shorter than
the API server's hand-over of a request on two busy cores: without it two 250-token requests can end
in the engine before a request sent after their first tokens reaches the scheduler).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Mapping, Sequence

import torch

from slaq.engine.kv_security.planner import KVSecurityPlan
from slaq.engine.kv_security.vault import SealBroken, Vault
from slaq.kernels.kv_blocks import erase_blocks

log = logging.getLogger(__name__)


class KVBlockPages:
    """Every layer's view of one scheduler block: read, write, zero, count."""

    def __init__(self, kv_caches: Mapping[str, torch.Tensor], num_blocks: int) -> None:
        seen: set[int] = set()
        self.layers: list[torch.Tensor] = []
        for tensor in kv_caches.values():
            if tensor.data_ptr() not in seen:  # layers sharing one cache are counted once
                seen.add(tensor.data_ptr())
                self.layers.append(tensor)
        self.rows = [layer.shape[0] // num_blocks for layer in self.layers]
        for layer, rows in zip(self.layers, self.rows):
            if rows < 1 or layer.shape[0] % num_blocks:
                raise ValueError(f"KV cache tensor of shape {tuple(layer.shape)} does not split into {num_blocks} blocks")

    def _rows(self, index: int, block: int) -> torch.Tensor:
        rows = self.rows[index]
        return self.layers[index][block * rows:(block + 1) * rows]

    def erase(self, blocks: Sequence[int]) -> None:
        for layer, rows in zip(self.layers, self.rows):
            erase_blocks(layer, [block * rows + r for block in blocks for r in range(rows)])

    def read(self, block: int) -> bytes:
        parts = [self._rows(i, block).contiguous().view(torch.uint8).reshape(-1).cpu() for i in range(len(self.layers))]
        return torch.cat(parts).numpy().tobytes()

    def write(self, block: int, page: bytes) -> None:
        data = torch.frombuffer(bytearray(page), dtype=torch.uint8)
        offset = 0
        for i in range(len(self.layers)):
            target = self._rows(i, block)
            size = target.numel() * target.element_size()
            target.copy_(data[offset:offset + size].view(target.dtype).view(target.shape))
            offset += size
        if offset != len(data):
            raise ValueError(f"page of {len(data)} bytes does not fit a block of {offset}")

    def nonzero(self, block: int) -> int:
        return sum(int(torch.count_nonzero(self._rows(i, block))) for i in range(len(self.layers)))


class KVSecurityWorker:
    def __init__(self, *, num_blocks: int, inspect_path: str | None = None, tamper_flag: str | None = None,
                 step_delay_s: float = 0.0) -> None:
        self.num_blocks = num_blocks
        self.vault = Vault()
        self.pages: KVBlockPages | None = None
        self.inspect_path = inspect_path
        self.tamper_flag = Path(tamper_flag) if tamper_flag else None
        self.step_delay_s = step_delay_s
        self._failed: set[int] = set()

    def register(self, kv_caches: Mapping[str, torch.Tensor]) -> None:
        self.pages = KVBlockPages(kv_caches, self.num_blocks)
        first = self.pages.layers[0]
        log.info("slaq KV security: %d KV tensors, first %s %s, %d rows per block", len(self.pages.layers),
                 tuple(first.shape), first.dtype, self.pages.rows[0])

    def before_forward(self, plan: KVSecurityPlan) -> None:
        pages = self.pages
        if pages is None:
            return
        for order in plan.saves:
            for index, block in enumerate(order.block_ids):
                self.vault.seal(order.tenant, order.request_id, index, pages.read(block))
        for request_id in plan.drops:
            self.vault.drop(request_id)
        before = {r.block_id: pages.nonzero(r.block_id) for r in plan.reassigned} if self.inspect_path else {}
        if plan.erase:
            pages.erase(plan.erase)
        if self.inspect_path and plan.reassigned:
            with open(self.inspect_path, "a", encoding="utf-8") as out:
                for r in plan.reassigned:
                    out.write(json.dumps({"block": r.block_id, "previous": r.previous_tenant, "tenant": r.tenant,
                                          "nonzero_before": before[r.block_id], "nonzero_after": pages.nonzero(r.block_id)}) + "\n")

    def load(self, plan: KVSecurityPlan) -> None:
        if self.step_delay_s > 0:
            time.sleep(self.step_delay_s)
        pages = self.pages
        if pages is None:
            return
        for order in plan.loads:
            if self.tamper_flag is not None and self.tamper_flag.exists():
                for sealed in self.vault.sealed(order.request_id).values():
                    sealed.ciphertext[len(sealed.ciphertext) // 2] ^= 0x01
            for offset, block in enumerate(order.block_ids):
                try:
                    pages.write(block, self.vault.open(order.tenant, order.request_id, order.first_index + offset))
                except SealBroken as exc:
                    log.warning("slaq KV security: %s; the request recomputes it", exc)
                    self._failed.update(order.block_ids[offset:])
                    break
            self.vault.drop(order.request_id)

    def take_failed(self) -> set[int]:
        failed, self._failed = self._failed, set()
        return failed
