"""Which tenant last wrote each KV block, and which blocks must be zeroed before the next step.

Pure bookkeeping (no vLLM object): the connector (connector.py) feeds it what each step's
scheduler output says and reads back the blocks to erase. A block is *fresh* for a request when
the request will write it (newly allocated, not a prefix-cache hit); a fresh block whose last
writer was another tenant is erased before the step's forward pass writes into it (onReuse). A
block a request only reads (its prefix-cache hit, possibly shared with a tenant of the same
prefix-cache group) is never erased while anyone holds it.

Erase reasons (the `reason` label of `slaq_engine_kv_erased_blocks_total`):
- `reuse`: handed to another tenant;
- `free`: freed by a request of an onFree tenant;
- `tenant_removed` / `salt_changed`: every block of a tenant that left the tenant table or whose
  cache salt changed, at once if nobody holds it, else as soon as its last holder frees it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

REASON_REUSE = "reuse"
REASON_FREE = "free"
REASON_TENANT_REMOVED = "tenant_removed"
REASON_SALT_CHANGED = "salt_changed"
REASONS = (REASON_REUSE, REASON_FREE, REASON_TENANT_REMOVED, REASON_SALT_CHANGED)


@dataclass(slots=True)
class HeldBlocks:
    """A request's blocks, in order, and how many of its tokens have KV once its last scheduled step ran."""

    tenant: str
    blocks: list[int]
    computed_tokens: int
    erased: dict[str, int] = field(default_factory=dict)  # blocks ordered zeroed when it let them go, by reason (`released`)


@dataclass(frozen=True, slots=True)
class Reassignment:
    block_id: int
    previous_tenant: str
    tenant: str


class BlockOwnership:
    """Last writer per block, holders per block, and the erase orders pending for the next step."""

    def __init__(self, num_blocks: int, block_size: int, *, erase_on_reuse: bool = True) -> None:
        self.block_size = block_size
        self.erase_on_reuse = erase_on_reuse  # False only for the negative control of the erase test
        self._owner: list[str | None] = [None] * num_blocks
        self._holders: list[int] = [0] * num_blocks
        self._doomed: dict[int, str] = {}  # block -> reason: erase when its last holder frees it
        self._held: dict[str, HeldBlocks] = {}
        self._erase: dict[int, str] = {}  # block -> reason, for the next step
        self._evict: set[int] = set()  # erased blocks whose prefix-cache entry must go
        self._reassigned: list[Reassignment] = []
        self.erase_when_freed: set[str] = set()  # onFree tenants

    # -- what the scheduler did ----------------------------------------------------------------
    def scheduled(self, request_id: str, tenant: str, block_ids: Sequence[int], num_computed: int, num_scheduled: int, *, replaces: bool) -> int:
        """A request was scheduled for `num_scheduled` tokens. `replaces`: `block_ids` is its whole
        block list (a new or resumed request, whose first `num_computed` tokens are prefix-cache
        hits it only reads); otherwise the blocks appended this step (all written). Returns how
        many blocks are to be zeroed for it (another tenant wrote them last)."""
        held = self._held.get(request_id)
        if replaces or held is None:
            if held is not None:
                self._drop_holder(held)
            held = self._held[request_id] = HeldBlocks(tenant, list(block_ids), 0)
            fresh = block_ids[-(-num_computed // self.block_size):]
            for block in block_ids:
                self._holders[block] += 1
        else:
            held.blocks.extend(block_ids)
            fresh = block_ids
            for block in block_ids:
                self._holders[block] += 1
        held.computed_tokens = num_computed + num_scheduled
        return self.written(tenant, fresh)

    def written(self, tenant: str, block_ids: Iterable[int]) -> int:
        """`tenant`'s data goes into these blocks this step (a forward pass, or a load from a host copy).
        Returns how many of them are newly ordered zeroed first (`reuse`)."""
        owner = self._owner
        erase = self._erase
        ordered = 0
        for block in block_ids:
            previous = owner[block]
            if previous is not None and previous != tenant:
                self._reassigned.append(Reassignment(block, previous, tenant))
                if self.erase_on_reuse and block not in erase:
                    erase[block] = REASON_REUSE
                    ordered += 1
            owner[block] = tenant
        return ordered

    def released(self, request_id: str) -> HeldBlocks | None:
        """A request freed its blocks (finished, aborted or preempted): blocks of an onFree tenant
        and doomed blocks are erased once nobody holds them. Returns what it held, with the erase
        orders its release made (`HeldBlocks.erased`)."""
        held = self._held.pop(request_id, None)
        if held is None:
            return None
        on_free = held.tenant in self.erase_when_freed
        for block in self._drop_holder(held):
            reason = self._doomed.pop(block, REASON_FREE if on_free and self._owner[block] == held.tenant else None)
            if reason is not None:
                self._order_erase(block, reason)
                held.erased[reason] = held.erased.get(reason, 0) + 1
        return held

    def retire(self, tenant: str, reason: str) -> int:
        """Every block `tenant` wrote is erased: now if free, else when its last holder frees it.
        Returns how many blocks were ordered erased or doomed."""
        count = 0
        for block, owner in enumerate(self._owner):
            if owner != tenant:
                continue
            count += 1
            if self._holders[block]:
                self._doomed[block] = reason
                self._evict.add(block)  # no new prefix hits on it, even while it is held
            else:
                self._order_erase(block, reason)
        return count

    # -- what the worker must do ---------------------------------------------------------------
    def take_erase_orders(self) -> dict[int, str]:
        """Blocks to zero before the next forward pass, with their reasons; clears them."""
        orders, self._erase = self._erase, {}
        return orders

    def take_evictions(self) -> set[int]:
        """Blocks whose prefix-cache entries must be dropped (their content is gone); clears them."""
        evict, self._evict = self._evict, set()
        return evict

    def take_reassignments(self) -> list[Reassignment]:
        reassigned, self._reassigned = self._reassigned, []
        return reassigned

    # -- views ------------------------------------------------------------------------------------
    def owner(self, block_id: int) -> str | None:
        return self._owner[block_id]

    def held(self, request_id: str) -> HeldBlocks | None:
        return self._held.get(request_id)

    def blocks_of(self, tenant: str) -> list[int]:
        return [block for block, owner in enumerate(self._owner) if owner == tenant]

    # -- internals --------------------------------------------------------------------------------
    def _drop_holder(self, held: HeldBlocks) -> Iterable[int]:
        """Blocks nobody holds any more once `held` lets go."""
        freed = []
        for block in held.blocks:
            self._holders[block] -= 1
            if self._holders[block] <= 0:
                self._holders[block] = 0
                freed.append(block)
        return freed

    def _order_erase(self, block: int, reason: str) -> None:
        self._erase[block] = reason
        self._evict.add(block)
        self._owner[block] = None  # nothing of anyone's left in it
