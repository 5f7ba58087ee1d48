"""The tightest TTFT class the engine serves lately, and its mean prompt: what the step budget keeps room for.

A request whose TTFT objective is near its own prefill time (a 4,000-token prompt on a 32B model
takes ~0.33 s of a 0.5 s objective) meets it only when the steps ahead of it are short and its
whole prompt runs in one step (`slaq.policy.tpot_budget`, the horizon and the reserve). The step
budget cannot wait to see such a request to shorten the steps: the steps already planned when it
arrives are what it waits for. So the engine remembers the classes it served: each TTFT objective
seen within `window_s`, with an exponentially weighted mean of its prompts.

A class is an objective, not a tier: tenants' objectives come from their TenantSLA (the operator's,
never the request's), so a tenant cannot make the steps shorter than its platform gave it.
"""

from __future__ import annotations

from dataclasses import dataclass

WINDOW_S = 600.0  # a class not seen for this long no longer bounds the steps
PROMPT_WEIGHT = 0.1  # weight of each arrival in its class's mean prompt
MAX_CLASSES = 32  # objectives remembered; past it, stale ones go, then the loosest


@dataclass(slots=True)
class _Class:
    seen_s: float
    prompt_tokens: float


class TightestTtft:
    def __init__(self, window_s: float = WINDOW_S) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        self.window_s = window_s
        self._classes: dict[float, _Class] = {}

    def arrived(self, ttft_s: float | None, prompt_tokens: int, now: float) -> None:
        if ttft_s is None:
            return
        known = self._classes.get(ttft_s)
        if known is not None:
            known.seen_s = now
            known.prompt_tokens += PROMPT_WEIGHT * (prompt_tokens - known.prompt_tokens)
            return
        if len(self._classes) >= MAX_CLASSES:
            self._forget(now)
            if len(self._classes) >= MAX_CLASSES:
                del self._classes[max(self._classes)]
        self._classes[ttft_s] = _Class(now, float(prompt_tokens))

    def tightest(self, now: float) -> tuple[float, int] | None:
        """(TTFT objective, mean prompt tokens) of the tightest class seen within the window, or None."""
        horizon = now - self.window_s
        best = None
        for ttft_s, known in self._classes.items():
            if known.seen_s >= horizon and (best is None or ttft_s < best[0]):
                best = (ttft_s, known)
        return None if best is None else (best[0], round(best[1].prompt_tokens))

    def _forget(self, now: float) -> None:
        horizon = now - self.window_s
        for ttft_s in [t for t, known in self._classes.items() if known.seen_s < horizon]:
            del self._classes[ttft_s]
