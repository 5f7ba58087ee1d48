"""Errors of the engine plugin.

    EngineError
    ├── SchedulerConfigError   the pool's scheduler knobs or tenant table cannot be read
    └── LaunchError            `slaq engine` was given arguments it cannot run with
"""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error the engine plugin raises on purpose."""


class SchedulerConfigError(EngineError):
    pass


class LaunchError(EngineError):
    pass
