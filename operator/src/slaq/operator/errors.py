"""The operator's exceptions, one tree:

    OperatorError
    ├── SpecError            a spec the user must fix (handlers raise kopf.PermanentError, field named)
    └── ApiError             the Kubernetes API refused or failed a request (.status, .reason)
        ├── NotFound         404
        └── RetryableApiError  409, 429, 5xx and unreachable servers: kopf retries the handler
"""

from __future__ import annotations


class OperatorError(Exception):
    """Base of every error the slaq operator raises on purpose."""


class SpecError(OperatorError):
    """An InferencePool or TenantSLA spec that cannot be served; `field` names what to fix."""

    def __init__(self, kind: str, name: str, field: str, message: str) -> None:
        super().__init__(f"{kind} {name}: {field}: {message}")
        self.kind, self.name, self.field, self.message = kind, name, field, message


class ApiError(OperatorError):
    def __init__(self, status: int, reason: str, message: str, *, method: str = "", url: str = "") -> None:
        super().__init__(f"{method} {url}: {status} {reason}: {message}".strip())
        self.status, self.reason, self.message = status, reason, message


class NotFound(ApiError):
    pass


class RetryableApiError(ApiError):
    """Conflicts, throttling, server errors and connection failures: worth trying again."""


def api_error(status: int, reason: str, message: str, *, method: str = "", url: str = "") -> ApiError:
    """The right ApiError subclass for an HTTP status."""
    if status == 404:
        return NotFound(status, reason, message, method=method, url=url)
    if status in (409, 429) or status >= 500:
        return RetryableApiError(status, reason, message, method=method, url=url)
    return ApiError(status, reason, message, method=method, url=url)
