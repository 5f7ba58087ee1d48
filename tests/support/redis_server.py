"""The `redis_server` fixture: a real `redis-server` on 127.0.0.1 (slaq.testing.redis_server), skipped
where none is installed (scripts/setup.sh installs Debian's)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from slaq.testing.redis_server import RedisServer

__all__ = ["RedisServer", "redis_server"]


@pytest.fixture
def redis_server(tmp_path: Path):
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (scripts/setup.sh installs Debian's redis-server)")
    server = RedisServer(tmp_path, binary).start()
    try:
        yield server
    finally:
        server.stop()
