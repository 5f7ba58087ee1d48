"""The client's address for the audit log: the peer, unless the peer is a trusted proxy."""

from __future__ import annotations

import pytest

from slaq.sidecar.addresses import TrustedProxies


def forwarded(*values: str) -> list[tuple[bytes, bytes]]:
    return [(b"x-forwarded-for", value.encode()) for value in values] + [(b"host", b"pod")]


def test_by_default_no_proxy_is_trusted_and_the_client_is_the_peer() -> None:
    assert TrustedProxies().client("10.0.0.5", forwarded("203.0.113.9")) == "10.0.0.5"
    assert TrustedProxies.parse(None).client("127.0.0.1", forwarded("203.0.113.9")) == "127.0.0.1"


def test_a_trusted_proxy_names_the_client_and_an_untrusted_peer_does_not() -> None:
    proxies = TrustedProxies.parse("10.0.0.0/24, 2001:db8::/32")
    assert proxies.client("10.0.0.5", forwarded("203.0.113.9")) == "203.0.113.9"
    assert proxies.client("2001:db8::7", forwarded("203.0.113.9")) == "203.0.113.9"
    assert proxies.client("10.0.1.5", forwarded("203.0.113.9")) == "10.0.1.5"  # outside the network: the header is the client's own


def test_the_rightmost_untrusted_entry_wins_so_a_client_cannot_name_another_address() -> None:
    proxies = TrustedProxies.parse("10.0.0.0/24")
    # The client wrote "198.51.100.1" itself; the proxy appended the address it saw connect.
    assert proxies.client("10.0.0.5", forwarded("198.51.100.1, 203.0.113.9")) == "203.0.113.9"
    # Two trusted hops: both are skipped; several headers read as one list.
    assert proxies.client("10.0.0.5", forwarded("198.51.100.1", "203.0.113.9, 10.0.0.8")) == "203.0.113.9"


def test_a_malformed_entry_stops_the_walk_and_no_header_leaves_the_peer() -> None:
    proxies = TrustedProxies.parse("10.0.0.0/24")
    assert proxies.client("10.0.0.5", forwarded("203.0.113.9, not-an-address, 10.0.0.8")) == "10.0.0.8"
    assert proxies.client("10.0.0.5", [(b"host", b"pod")]) == "10.0.0.5"
    assert proxies.client(None, forwarded("203.0.113.9")) is None


def test_a_bad_network_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'10.0.0.300'"):
        TrustedProxies.parse("10.0.0.0/24,10.0.0.300")


def test_the_sidecar_refuses_to_start_with_a_bad_trusted_proxy(tmp_path) -> None:
    from pathlib import Path

    from slaq.sidecar.server import ConfigError, SidecarOptions, build_app

    options = SidecarOptions(host="127.0.0.1", port=0, engine_url="http://127.0.0.1:1", tenant_table=Path(tmp_path) / "t.json",
                             trusted_proxies="gateway.local")
    with pytest.raises(ConfigError, match="--trusted-proxies: not an IP address or network: 'gateway.local'"):
        build_app(options)
