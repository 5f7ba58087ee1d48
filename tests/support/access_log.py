"""The sidecar's access log captured in a test: attach a buffer, read its JSON lines."""

from __future__ import annotations

import io
import json


def capture(sidecar) -> io.StringIO:
    """A buffer the running sidecar's access log also writes to."""
    buffer = io.StringIO()
    sidecar.app.access.attach(buffer)
    return buffer


def access_lines(buffer: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in buffer.getvalue().splitlines()]
