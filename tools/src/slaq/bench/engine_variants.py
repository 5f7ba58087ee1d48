"""Variants of slaq's engine scheduler that the benchmark compares against the one that ships."""

from __future__ import annotations

from slaq.engine.scheduler import SLAScheduler


class MaxTokensSLAScheduler(SLAScheduler):
    """`slaq-max-tokens`: plans every request on its `max_tokens` (the rest of the context when the client
    set none) instead of the sidecar's predicted output (`slaq.engine.output_plan`)."""

    plans_on_prediction = False
