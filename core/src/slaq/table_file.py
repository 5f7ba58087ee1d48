"""A mounted table file, re-read when it changes: the one watcher behind the sidecar's tenant
table and the engine's table.

Kubernetes updates a Secret volume by swapping a symlink to a new directory, so a change shows up
as a new (inode, mtime, size) of the resolved path; `poll()` only stats the files unless that
signature moved.

A table split over several Secrets (each at most 1 MiB) arrives as several files in one
projected volume: `tenants.json` (part 0, saying how many parts there are), `tenants-1.json`...
`read()` joins them into one table. Parts that disagree (the kubelet had not yet synced every
Secret of a new split) are reported as an error, and the next change of any file is read again. A file that cannot be read or parsed is reported once per change (`TableChange`
with `error`), so the caller keeps what it had and the next change is picked up.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from pydantic import BaseModel, ValidationError

from slaq.api.runtime import MAX_TABLE_PARTS
from slaq.api.table import part_file_name

Table = TypeVar("Table", bound=BaseModel)
Signature = tuple[tuple[int, int, int], ...] | None  # (inode, mtime ns, size) of each part; None: no part 0
NEVER_LOOKED = ((-1, -1, -1),)


def part_path(path: Path, part: int) -> Path:
    return path.with_name(part_file_name(path.name, part))


def join_parts(parts: Sequence[Table], what: str = "table") -> Table:
    """One table from the parts of a split one (each with `part`, `parts`, `pool`, `revision`, `tenants`).

    ValueError when they do not make one table: a part missing, from another split or pool."""
    first = parts[0]
    count = getattr(first, "parts", None) or 1
    if len(parts) != count:
        raise ValueError(f"{what}: {len(parts)} of {count} parts present")
    for index, part in enumerate(parts):
        if (getattr(part, "parts", None) or 1) != count or (getattr(part, "part", None) or 0) != index or part.pool != first.pool:
            raise ValueError(f"{what}: part {index} is from another split (part {getattr(part, 'part', None)} of "
                             f"{getattr(part, 'parts', None)}, pool {part.pool!r}); waiting for every part to be synced")
    if count == 1:
        return first
    tenants = sorted((t for part in parts for t in part.tenants), key=lambda t: t.name)
    update = {"part": None, "parts": None, "tenants": tenants, "revision": "+".join(part.revision for part in parts)}
    if hasattr(first, "key_hash_key"):  # a tenant table: parts written during an upgrade may lack it
        update["key_hash_key"] = next((p.key_hash_key for p in parts if p.key_hash_key), None)
    return first.model_copy(update=update)


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
        """Part 0's and every following part's stat, up to the first missing one."""
        found = []
        for part in range(MAX_TABLE_PARTS):
            try:
                st = os.stat(part_path(self.path, part))
            except OSError:
                break
            found.append((st.st_ino, st.st_mtime_ns, st.st_size))
        return tuple(found) or None

    def mark_seen(self) -> None:
        """The file as it is now is already known (read at startup): report only later changes."""
        self._seen = self.signature()
        self._next_look = self._clock() + self.interval_s

    def _read_one(self, path: Path) -> Table:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"cannot read {self.what} {path}: {exc.strerror or exc}") from exc
        try:
            return self.model.model_validate_json(text)
        except ValidationError as exc:
            raise ValueError(f"invalid {self.what} {path}: {exc}") from exc

    def read(self) -> Table:
        """The table now, its parts joined; ValueError naming the file and the problem."""
        first = self._read_one(self.path)
        count = getattr(first, "parts", None) or 1
        if count > MAX_TABLE_PARTS:
            raise ValueError(f"{self.what} {self.path}: {count} parts, more than the {MAX_TABLE_PARTS} a pod mounts")
        return join_parts([first, *(self._read_one(part_path(self.path, i)) for i in range(1, count))], f"{self.what} {self.path}")

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
