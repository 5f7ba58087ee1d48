"""The quota store's circuit breaker and the `--quota-store` options (no store needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slaq.sidecar.breaker import BreakerState, CircuitBreaker
from slaq.sidecar.quota_store import StoreSettings
from slaq.sidecar.server import ConfigError, parse_quota_store


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_failures_in_a_row_and_a_success_resets_the_count() -> None:
    breaker = CircuitBreaker(failure_threshold=2, reset_after_s=1.0, clock=Clock())
    breaker.failed()
    breaker.succeeded()
    breaker.failed()
    assert breaker.state is BreakerState.CLOSED and breaker.allow()
    breaker.failed()
    assert breaker.state is BreakerState.OPEN and not breaker.allow() and breaker.openings == 1


def test_half_open_lets_one_probe_through_and_its_outcome_decides() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failure_threshold=1, reset_after_s=1.0, clock=clock)
    breaker.failed()
    clock.now = 0.99
    assert not breaker.allow()
    clock.now = 1.0
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.allow() and not breaker.allow()  # one probe at a time
    breaker.failed()  # the probe failed: open for another period
    assert breaker.state is BreakerState.OPEN and breaker.openings == 2
    clock.now = 2.0
    assert breaker.allow()
    breaker.succeeded()
    assert breaker.state is BreakerState.CLOSED and breaker.allow() and breaker.allow()


def test_an_abandoned_probe_frees_the_half_open_place_and_counts_nothing() -> None:
    """A probe whose task was cancelled (its client disconnected) reports no outcome: the next call
    probes. Held, the place would leave the breaker half-open, refusing every call for good."""
    clock = Clock()
    breaker = CircuitBreaker(failure_threshold=1, reset_after_s=1.0, clock=clock)
    breaker.failed()
    clock.now = 1.0
    assert breaker.allow() and not breaker.allow()
    breaker.abandoned()
    assert breaker.state is BreakerState.HALF_OPEN and breaker.openings == 1
    assert breaker.allow()  # the next call is the probe
    breaker.succeeded()
    assert breaker.state is BreakerState.CLOSED
    breaker.abandoned()  # closed: nothing changes
    assert breaker.state is BreakerState.CLOSED and breaker.allow()


def test_store_settings_name_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="scheme must be one of"):
        StoreSettings(url="http://redis:6379")
    with pytest.raises(ValueError, match=r"timeout must be in \(0, 1\]"):
        StoreSettings(url="redis://redis:6379", timeout_s=2.0)
    with pytest.raises(ValueError, match="lease"):
        StoreSettings(url="redis://redis:6379", lease_s=0.5)
    with pytest.raises(ValueError, match="prefix"):
        StoreSettings(url="redis://redis:6379", prefix="a{b}")


def test_quota_store_flags(tmp_path: Path) -> None:
    assert parse_quota_store(None) is None
    with pytest.raises(ConfigError, match="holds a password"):
        parse_quota_store("redis://:hunter2@redis:6379/0")
    with pytest.raises(ConfigError, match="--quota-store-password-file: cannot read"):
        parse_quota_store("redis://redis:6379/0", password_file=tmp_path / "missing")
    with pytest.raises(ConfigError, match="--quota-store: .*scheme"):
        parse_quota_store("redis-host:6379")
    (tmp_path / "password").write_text("s3cret\n")
    settings = parse_quota_store("redis://redis:6379/2", password_file=tmp_path / "password", password_env="from-env", timeout_s=0.1)
    assert settings == StoreSettings(url="redis://redis:6379/2", password="s3cret", timeout_s=0.1)
    assert parse_quota_store("redis://redis:6379/2", password_env="from-env").password == "from-env"
