"""Failed authentication, slowed per client address, and its access lines sampled.

Each wrong key costs the pod a key lookup and, before this, an access line: 600 wrong keys in
0.7 s from one address were 600 answers and 600 lines. Two bounds, per client address (the
connection limits' key: an IPv4 address, an IPv6 /64; the client a trusted proxy names, else the
TCP peer), each a `slaq sidecar` flag:

    bound                                                default           flag                   past it
    failed authentications (401) in any window           10 per 10 s       --auth-failure-limit   429 auth_throttled + Retry-After,
                                                                          --auth-failure-window  before the key is looked at
    access lines of failed authentication (401 and 429   10 per window     --auth-failure-log-lines  counted, then one `access_suppressed`
      auth_throttled) per window                                                                    line per address and window

`AuthFailures` keeps the last `limit` failure times of each address: an address whose `limit`-th
latest failure is younger than the window is refused until it is not (Retry-After says when), so
a steady guesser gets `limit` tries per window and nothing else. Throttled requests are not
failures (their keys are never looked at). A correct key from a throttled address is refused
too: behind a gateway every client shares the gateway's address unless `--trusted-proxies` names
the gateway (then the address is the one it reports); `--auth-failure-limit 0` turns it off.

`FailureLines` decides which of those access lines are written: the first `lines` of an address
in a window (a fixed window from its first line), then none; when the window ends, one summary line
with the count by reason (`access.AccessLog.flush`, every second).
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

MAX_ADDRESSES = 100_000  # addresses remembered at once; the stalest go first past it


@dataclass(frozen=True, slots=True)
class AuthFailureLimits:
    limit: int = 10  # failed authentications per address in any window; 0: never throttled
    window_s: float = 10.0
    log_lines: int = 10  # access lines of failed authentication per address per window

    def __post_init__(self) -> None:
        if self.limit < 0 or self.log_lines < 0:
            raise ValueError(f"auth failure limit and log lines must be >= 0, got {self.limit} and {self.log_lines}")
        if not self.window_s > 0:
            raise ValueError(f"auth failure window must be > 0 seconds, got {self.window_s}")


class AuthFailures:
    """At most `limit` failed authentications per address in any `window_s`."""

    def __init__(self, limits: AuthFailureLimits = AuthFailureLimits(), max_addresses: int = MAX_ADDRESSES) -> None:
        self.limits = limits
        self.max_addresses = max_addresses
        self._times: dict[str, deque[float]] = {}  # address -> its latest failure times, oldest first

    def retry_after(self, address: str, now: float) -> float | None:
        """Seconds until `address` may try a key again; None when it may now."""
        times = self._times.get(address)
        if not self.limits.limit or times is None or len(times) < self.limits.limit:
            return None
        wait = times[0] + self.limits.window_s - now
        return wait if wait > 0 else None

    def failed(self, address: str, now: float) -> None:
        if not self.limits.limit:
            return
        times = self._times.pop(address, None)  # re-inserted last: the dict stays in order of latest failure
        if times is None:
            times = deque(maxlen=self.limits.limit)
        times.append(now)
        self._times[address] = times
        if len(self._times) > self.max_addresses:
            self.prune(now)
            while len(self._times) > self.max_addresses:
                del self._times[next(iter(self._times))]

    def prune(self, now: float) -> None:
        """Forget the addresses whose latest failure left the window."""
        for address in [a for a, times in self._times.items() if times[-1] + self.limits.window_s <= now]:
            del self._times[address]

    def __len__(self) -> int:
        return len(self._times)


@dataclass(slots=True)
class _Window:
    start: float
    written: int = 0
    suppressed: Counter[str] = field(default_factory=Counter)


class FailureLines:
    """Which access lines of failed authentication are written: `lines` per address per window."""

    def __init__(self, lines: int, window_s: float, max_addresses: int = MAX_ADDRESSES) -> None:
        self.lines = lines
        self.window_s = window_s
        self.max_addresses = max_addresses
        self._windows: dict[str, _Window] = {}
        self._ended: list[dict[str, Any]] = []

    def admit(self, address: str, now: float, reason: str) -> bool:
        """Whether this line is written; a line not written is counted for the window's summary."""
        window = self._windows.get(address)
        if window is None or now >= window.start + self.window_s:
            if window is not None:
                self._end(address, window)
            if len(self._windows) >= self.max_addresses:
                self._expire(now)
                while len(self._windows) >= self.max_addresses:  # the oldest windows end early
                    oldest = next(iter(self._windows))
                    self._end(oldest, self._windows.pop(oldest))
            window = self._windows[address] = _Window(start=now)
        if window.written < self.lines:
            window.written += 1
            return True
        window.suppressed[reason] += 1
        return False

    def _end(self, address: str, window: _Window) -> None:
        if window.suppressed:
            self._ended.append({"client": address, "from": window.start, "until": window.start + self.window_s,
                                "suppressed": sum(window.suppressed.values()), "reasons": dict(sorted(window.suppressed.items()))})

    def flush(self, now: float, everything: bool = False) -> list[dict[str, Any]]:
        """Summaries of the windows that ended by `now` (all of them with `everything`) with lines
        left out: client, from, until (wall-clock seconds), suppressed, reasons."""
        self._expire(now, everything)
        ended, self._ended = self._ended, []
        return ended

    def _expire(self, now: float, everything: bool = False) -> None:
        for address, window in list(self._windows.items()):
            if everything or now >= window.start + self.window_s:
                del self._windows[address]
                self._end(address, window)
