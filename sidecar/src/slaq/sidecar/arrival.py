"""When a request arrived: the moment the host received its first bytes, not when the sidecar got to them.

A sidecar short of CPU leaves requests in the kernel (the listen backlog, the socket's receive
buffer) before it accepts, reads and parses them; a stamp taken when the app is called, or once
the body is read, leaves that wait out of the sidecar's TTFT, its access log and its SLO outcomes
while clients wait for seconds (issue 39: up to 3.9 s on the demo's 2 cores). So the connection's
protocol (`connections.HeadTimeoutProtocol`) stamps a request when the parser meets its first
byte, backdated by how long ago the host's TCP stack received data on the socket
(`tcpi_last_data_recv` of Linux's `TCP_INFO`, in milliseconds at the kernel's clock tick): a
request that sat in the kernel for 2 s while the event loop was busy is stamped 2 s earlier.
Where the socket has no `TCP_INFO` (not Linux, not TCP), the stamp is the read. Either is a lower
bound of the wait: the kernel's figure is the latest data received, which may be later than the
request's first segment.

The stamp is on `time.monotonic()` (scope key `ARRIVED`); `door_wait_s` turns it into the seconds
the request has been at the door when the app looks, which the app subtracts from its own clock.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any, Mapping

ARRIVED = "slaq.arrived"  # scope key: time.monotonic() when the request's first byte reached the host
TCP_INFO_LAST_DATA_RECV = 52  # offset of `__u32 tcpi_last_data_recv` (ms) in Linux's `struct tcp_info`
TCP_INFO_BYTES = TCP_INFO_LAST_DATA_RECV + 4


def since_last_data_s(sock: Any) -> float | None:
    """Seconds since the host's TCP stack last received data on `sock`; None where it cannot say."""
    option = getattr(socket, "TCP_INFO", None)
    if sock is None or option is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, option, TCP_INFO_BYTES)
    except (OSError, ValueError):
        return None  # not a TCP socket (a Unix socket), or closed meanwhile
    if len(info) < TCP_INFO_BYTES:
        return None
    return struct.unpack_from("=I", info, TCP_INFO_LAST_DATA_RECV)[0] / 1000.0


def first_byte_stamp(sock: Any) -> float:
    """The `time.monotonic()` stamp of a request whose first byte the parser meets now."""
    now = time.monotonic()
    since = since_last_data_s(sock)
    return now if since is None else now - since


def door_wait_s(scope: Mapping[str, Any]) -> float:
    """Seconds since the request's first byte reached the host (0 when no protocol stamped it)."""
    arrived = scope.get(ARRIVED)
    return 0.0 if arrived is None else max(0.0, time.monotonic() - arrived)
