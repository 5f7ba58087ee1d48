"""A progress bar on stderr (drawn only on a terminal; elsewhere one line per finished run)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    def __init__(self, label: str, stream: TextIO | None = None, width: int = 30) -> None:
        self.label, self.width = label, width
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        if not self.tty:
            return
        filled = int(self.width * done / total) if total else self.width
        bar = "#" * filled + "-" * (self.width - filled)
        elapsed = time.monotonic() - self.started
        self.stream.write(f"\r{self.label} [{bar}] {done}/{total} finished, {elapsed:.0f}s")
        self.stream.flush()

    def close(self, summary: str) -> None:
        elapsed = time.monotonic() - self.started
        prefix = "\r" if self.tty else ""
        self.stream.write(f"{prefix}{self.label}: {summary} ({elapsed:.1f}s wall)".ljust(self.width + 40) + "\n")
        self.stream.flush()
