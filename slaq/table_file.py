"""A mounted table file, re-read when it changes: the one watcher behind the sidecar's tenant
table and the engine's table.

Kubernetes updates a Secret volume by swapping a symlink to a new directory, so a change shows up
as a new (inode, mtime, size) of the resolved path; `poll()` only stats the file unless that
signature moved. A file that cannot be read or parsed is reported once per change (`TableChange`
with `error`), so the caller keeps what it had and the next change is picked up.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from pydantic import BaseModel, ValidationError

Table = TypeVar("Table", bound=BaseModel)
Signature = tuple[int, int, int] | None  # (inode, mtime ns, size); None: the file is not there
NEVER_LOOKED = (-1, -1, -1)


@dataclass(frozen=True)
class TableChange(Generic[Table]):
    """What a changed file now holds: `table`, or the `error` that kept it from being read."""

    table: Table | None
    error: str | None = None


class TableFile(Generic[Table]):
    """`poll()`: None while the file is unchanged, else a TableChange.

    With `interval_s` > 0 it looks at the file at most that often (callers that poll every engine
    step); the first poll always reports, unless `mark_seen()` said the current file is known.
    """

    def __init__(self, path: Path, model: type[Table], *, what: str = "tenant table", interval_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.model = model
        self.what = what
        self.interval_s = interval_s
        self._clock = clock
        self._next_look = clock()
        self._seen: Signature = NEVER_LOOKED

    def signature(self) -> Signature:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def mark_seen(self) -> None:
        """The file as it is now is already known (read at startup): report only later changes."""
        self._seen = self.signature()
        self._next_look = self._clock() + self.interval_s

    def read(self) -> Table:
        """The table now; ValueError naming the file and the problem."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"cannot read {self.what} {self.path}: {exc.strerror or exc}") from exc
        try:
            return self.model.model_validate_json(text)
        except ValidationError as exc:
            raise ValueError(f"invalid {self.what} {self.path}: {exc}") from exc

    def poll(self) -> TableChange[Table] | None:
        if self.interval_s > 0:
            now = self._clock()
            if now < self._next_look:
                return None
            self._next_look = now + self.interval_s
        signature = self.signature()
        if signature == self._seen:
            return None
        self._seen = signature
        if signature is None:
            return TableChange(None, f"{self.what} {self.path} is missing")
        try:
            return TableChange(self.read())
        except ValueError as exc:
            return TableChange(None, str(exc))
