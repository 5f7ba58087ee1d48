"""Errors of `slaq up` and the demo.

LocalError
├── TenantFileError   the --tenants manifests cannot make a tenant table (names file and field)
├── StartupError      a child process exited or did not get ready (carries the child, for its log)
└── ScenarioError     the demo's scenario 4.5 did not find the state it sets up (says which)
"""

from __future__ import annotations

from typing import Any


class LocalError(Exception):
    """Anything that stops `slaq up`; the message says what to fix."""


class TenantFileError(LocalError):
    pass


class StartupError(LocalError):
    def __init__(self, child: Any, message: str) -> None:
        super().__init__(message)
        self.child = child


class ScenarioError(LocalError):
    pass
