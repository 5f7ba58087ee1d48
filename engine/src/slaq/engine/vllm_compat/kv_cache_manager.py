"""The methods of vLLM 0.32's `KVCacheManager` that slaq's block budget changes, in vLLM's own signatures.

vLLM's scheduler calls them:
- `allocate_slots` for every request it schedules, every step: a waiting request's admission
  (with its prefix-cache hits as `num_new_computed_tokens` and `new_computed_blocks`), a prefill
  chunk, a decode. None refuses: vLLM leaves a waiting request waiting, or preempts a running one.
- `free` when a request finishes or is preempted and its blocks can go back to the pool now;
- `pop_blocks_for_free` instead, when a step in flight may still write them (vLLM frees them later,
  in bulk).

`BudgetedKVCacheManager` overrides those three and nothing else, each by a call of slaq's hook
with plain values (`slaq_allocate_slots`, `slaq_free`, `slaq_pop_blocks_for_free`), and gives the
hooks vLLM's own behaviour as `vllm_allocate_slots`, `vllm_free`, `vllm_pop_blocks_for_free`.
One exception, for the hot path: a decode that stays within the tokens the hooks have already
approved for its request (`slaq_decode_room`, which the hooks keep) goes straight to vLLM's
allocation: it is most of the calls (every running request, every step) and the hook has nothing to
check or record for it, so it costs one dict lookup instead of three Python calls.
What slaq does not read (`new_computed_blocks` and vLLM's other keywords) travels through the
hooks untouched, as one `VllmArgs` value. `slaq.engine.blocks.SLABlockManager` implements the
hooks; alone, this class behaves as vLLM's. tests/engine/test_vllm_seam.py pins the three
signatures against the installed vLLM and fails when a class outside this package overrides a
`KVCacheManager` method itself.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping

from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.request import Request

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.kv_cache_utils import KVCacheBlock

VllmArgs = tuple[Any, dict[str, Any]]  # (new_computed_blocks, vLLM's other keywords), passed through

# Bound once: the allocation is called for every scheduled request every step.
_stock_allocate_slots = KVCacheManager.allocate_slots
_stock_free = KVCacheManager.free
_stock_pop_blocks_for_free = KVCacheManager.pop_blocks_for_free


class BudgetedKVCacheManager(KVCacheManager):
    """vLLM's KVCacheManager with its three allocation and release points handed to slaq's hooks."""

    # Request id -> tokens of KV the hooks approved for it: an allocation of at most one new token,
    # without prefix hits, that ends within them is vLLM's own, with no hook call. The hooks keep it
    # (an instance dict); empty, every allocation goes to the hook.
    slaq_decode_room: Mapping[str, int] = MappingProxyType({})

    # -- vLLM's side: the overrides --------------------------------------------------------------
    def allocate_slots(  # type: ignore[override]
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: "KVCacheBlocks | None" = None,
        num_lookahead_tokens: int = 0,
        **kwargs: Any,
    ) -> "KVCacheBlocks | None":
        # (No keywords beyond these: vLLM's running loop passes none, and a positional call skips
        # building them again; with any, the hook gives the same answer.)
        if (num_new_tokens <= 1 and not num_new_computed_tokens and not kwargs
                and request.num_computed_tokens + num_new_tokens + num_lookahead_tokens <= self.slaq_decode_room.get(request.request_id, -1)):
            return _stock_allocate_slots(self, request, num_new_tokens, 0, new_computed_blocks, num_lookahead_tokens)
        return self.slaq_allocate_slots(request, num_new_tokens, num_new_computed_tokens, num_lookahead_tokens, (new_computed_blocks, kwargs))

    def free(self, request: Request) -> None:
        self.slaq_free(request)

    def pop_blocks_for_free(self, request: Request) -> "list[KVCacheBlock]":
        return self.slaq_pop_blocks_for_free(request)

    # -- slaq's hooks (overridden by the block budget) ---------------------------------------------
    def slaq_allocate_slots(self, request: Request, new_tokens: int, new_computed_tokens: int, lookahead_tokens: int,
                            passed: VllmArgs) -> "KVCacheBlocks | None":
        """Blocks for `new_tokens` more tokens of `request` (after `new_computed_tokens` prefix-cache
        hits, with `lookahead_tokens` of speculative room), or None to refuse."""
        return self.vllm_allocate_slots(request, new_tokens, new_computed_tokens, lookahead_tokens, passed)

    def slaq_free(self, request: Request) -> None:
        """The request gives its blocks back to the pool (it finished, or was preempted)."""
        self.vllm_free(request)

    def slaq_pop_blocks_for_free(self, request: Request) -> "list[KVCacheBlock]":
        """The request gives its blocks up; vLLM returns them to the pool later."""
        return self.vllm_pop_blocks_for_free(request)

    # -- vLLM's own behaviour, for the hooks ---------------------------------------------------------
    def vllm_allocate_slots(self, request: Request, new_tokens: int, new_computed_tokens: int, lookahead_tokens: int,
                            passed: VllmArgs) -> "KVCacheBlocks | None":
        new_computed_blocks, kwargs = passed
        return _stock_allocate_slots(self, request, new_tokens, new_computed_tokens, new_computed_blocks, lookahead_tokens, **kwargs)

    def vllm_free(self, request: Request) -> None:
        _stock_free(self, request)

    def vllm_pop_blocks_for_free(self, request: Request) -> "list[KVCacheBlock]":
        return _stock_pop_blocks_for_free(self, request)
