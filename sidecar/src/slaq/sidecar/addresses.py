"""Who sent a request, for the audit log: the TCP peer, or what trusted proxies say in X-Forwarded-For.

By default no proxy is trusted and the client is the peer: a tenant reaching the sidecar directly
could write any X-Forwarded-For it likes. Behind a gateway, `--trusted-proxies CIDR,...` names the
gateway's addresses; for a request whose peer is one of them, the header is read right to left,
skipping trusted addresses, and the first other address is the client (what the proxy nearest the
sidecar saw connect to it; entries further left were written by whoever sent the request and are
not believed). A malformed entry stops the walk at the last address read. uvicorn's own
proxy-header handling is off (`server.serve`), so nothing else rewrites the peer.
"""

from __future__ import annotations

import ipaddress
from typing import Iterable, Sequence

FORWARDED_FOR = b"x-forwarded-for"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


class TrustedProxies:
    """The networks whose X-Forwarded-For the sidecar believes (none by default)."""

    def __init__(self, networks: Iterable[str] = ()) -> None:
        self.networks: tuple[Network, ...] = tuple(ipaddress.ip_network(n.strip(), strict=False) for n in networks if n.strip())

    @classmethod
    def parse(cls, value: str | None) -> "TrustedProxies":
        """`--trusted-proxies`: comma-separated addresses or CIDR networks (ValueError names a bad one)."""
        items = [item for item in (value or "").split(",") if item.strip()]
        for item in items:
            try:
                ipaddress.ip_network(item.strip(), strict=False)
            except ValueError:
                raise ValueError(f"not an IP address or network: {item.strip()!r}") from None
        return cls(items)

    def trusts(self, address: str | None) -> bool:
        if not self.networks or address is None:
            return False
        parsed = _address(address)
        return parsed is not None and any(parsed in network for network in self.networks)

    def client(self, peer: str | None, headers: Sequence[tuple[bytes, bytes]]) -> str | None:
        """The client's address for a request from `peer` with these raw headers."""
        if not self.trusts(peer):
            return peer
        entries = [entry for name, value in headers if name.lower() == FORWARDED_FOR
                   for entry in value.decode("latin-1").split(",")]
        client = peer
        for entry in reversed(entries):
            parsed = _address(entry)
            if parsed is None:
                break
            client = str(parsed)
            if not any(parsed in network for network in self.networks):
                break
        return client


def peer_address(scope: dict) -> str | None:
    """The TCP peer's address (None on a socket without one)."""
    client = scope.get("client")
    return client[0] if client else None
