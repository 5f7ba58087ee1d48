"""Every way the sidecar refuses a request, and the one place refusals become HTTP.

    SidecarError                      reason          status
    ├── BadRequest                                    400
    │   ├── MalformedJSON             malformed_json
    │   ├── InvalidField              invalid_field   (the field is named in the message)
    │   ├── UnknownModel              unknown_model   404
    │   ├── BodyTooLarge              body_too_large  413
    │   ├── BodyTimeout               body_timeout    408 (connection closed: the rest of the body would read as a next request)
    │   ├── UnsupportedMediaType      unsupported_media_type 415
    │   ├── DuplicateHeader           duplicate_header (a header that must appear once, e.g. Authorization, came twice)
    │   └── HeadersTooLarge           headers_too_large 431 (the request head's bytes or header count over its cap; connection closed)
    ├── NotFound                      not_found       404
    ├── MethodNotAllowed              method_not_allowed 405
    ├── Unauthorized                  unauthorized    401
    ├── AuthThrottled                 auth_throttled  429 + Retry-After (too many failed authentications from the client's address)
    ├── QuotaExceeded (tenant-level, retry later)    429 + Retry-After
    │   ├── RequestRateExceeded       request_rate
    │   ├── TokenRateExceeded         token_rate
    │   └── ConcurrencyExceeded       concurrency
    └── Unavailable (pod-level, another replica may serve it) 503
        ├── Shedding                  shedding        (+ Retry-After)
        ├── QueueFull                 queue_full      (+ Retry-After)
        ├── DeadlineUnreachable       ttft_unreachable (+ Retry-After)
        ├── Draining                  draining
        └── EngineUnavailable         engine_unavailable
            └── EngineTimeout         engine_timeout  504 (the engine took the request and went silent: its reservation stands)

Tenant-level refusals are 429 because the tenant's own rate is the cause; pod-level ones are 503
because the pod, not the tenant, is the cause and a gateway may retry on another replica.
AuthThrottled is 429 too: the client's own failures are the cause.
"""

from __future__ import annotations

import json
import math

from typing import ClassVar


class SidecarError(Exception):
    """A refusal: a machine-readable `reason`, a human message, and optionally when to retry."""

    reason: ClassVar[str] = "internal_error"

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s

    def __reduce__(self) -> tuple:
        # Picklable whatever a subclass's __init__ takes: a refusal found in a parsing worker process
        # comes back whole (`payload.ParserPool`).
        return (_restore, (type(self), self.message, self.__dict__))


def _restore(cls: type[SidecarError], message: str, state: dict) -> SidecarError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class BadRequest(SidecarError):
    reason = "bad_request"


class MalformedJSON(BadRequest):
    reason = "malformed_json"


class InvalidField(BadRequest):
    reason = "invalid_field"

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


class UnknownModel(BadRequest):
    reason = "unknown_model"


class BodyTooLarge(BadRequest):
    reason = "body_too_large"


class BodyTimeout(BadRequest):
    reason = "body_timeout"


class UnsupportedMediaType(BadRequest):
    reason = "unsupported_media_type"


class DuplicateHeader(BadRequest):
    reason = "duplicate_header"


class HeadersTooLarge(BadRequest):
    reason = "headers_too_large"


class NotFound(SidecarError):
    reason = "not_found"


class MethodNotAllowed(SidecarError):
    reason = "method_not_allowed"


class Unauthorized(SidecarError):
    reason = "unauthorized"


class AuthThrottled(SidecarError):
    """The client's address failed authentication too often lately (`auth_failures.AuthFailures`):
    refused before its key is looked at, until the oldest failure leaves the window."""

    reason = "auth_throttled"


class QuotaExceeded(SidecarError):
    reason = "quota_exceeded"


class RequestRateExceeded(QuotaExceeded):
    reason = "request_rate"


class TokenRateExceeded(QuotaExceeded):
    reason = "token_rate"


class ConcurrencyExceeded(QuotaExceeded):
    reason = "concurrency"


class Unavailable(SidecarError):
    reason = "unavailable"


class Shedding(Unavailable):
    reason = "shedding"


class QueueFull(Unavailable):
    reason = "queue_full"


class DeadlineUnreachable(Unavailable):
    reason = "ttft_unreachable"


class Draining(Unavailable):
    reason = "draining"


class EngineUnavailable(Unavailable):
    reason = "engine_unavailable"


class EngineTimeout(EngineUnavailable):
    """The engine took the request and sent nothing back for the engine-idle timeout: unlike an
    unreachable engine it may have worked on it all that while, so the reservation is not refunded."""

    reason = "engine_timeout"


# The only mapping from refusals to HTTP status codes; the most specific class wins.
_STATUS: dict[type[SidecarError], int] = {
    SidecarError: 500,
    BadRequest: 400,
    UnknownModel: 404,
    BodyTooLarge: 413,
    BodyTimeout: 408,
    EngineTimeout: 504,
    UnsupportedMediaType: 415,
    HeadersTooLarge: 431,
    AuthThrottled: 429,
    NotFound: 404,
    MethodNotAllowed: 405,
    Unauthorized: 401,
    QuotaExceeded: 429,
    Unavailable: 503,
}


def http_status(error: SidecarError) -> int:
    for cls in type(error).__mro__:
        if cls in _STATUS:
            return _STATUS[cls]
    return 500


def refusal(error: SidecarError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """(status, headers, body) for a refusal: an OpenAI-style error object with our `reason`."""
    status = http_status(error)
    body = json.dumps(
        {"error": {"message": error.message, "type": type(error).__name__, "code": status}, "reason": error.reason}
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if error.retry_after_s is not None:
        headers.append((b"retry-after", str(max(1, math.ceil(error.retry_after_s))).encode()))
    if isinstance(error, Unauthorized):
        headers.append((b"www-authenticate", b"Bearer"))
    if isinstance(error, (HeadersTooLarge, BodyTimeout)):
        headers.append((b"connection", b"close"))  # what is left of the head (the body) is not worth reading
    return status, headers, body
