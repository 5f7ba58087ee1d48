"""Tenants' cluster-wide quota counters in Redis, shared by every sidecar of an install.

Each operation is one Lua script (EVALSHA, loaded on first use), so a check and its charge are
atomic across sidecars. Time is the store's (`TIME`), so sidecars' clocks never disagree.
Keys, per tenant (the `{tenant}` hash tag keeps them in one Redis Cluster slot):

- `<prefix>:{<tenant>}:rpm`, `:tpm` — token buckets as hashes {l: level, t: stamp in ms}, the same
  bucket as a sidecar's local one (admission.TokenBucket): one minute's worth of burst, refilled
  continuously at quota/60 per second, in debt when an overrun is committed. A full bucket is no
  key; a key expires when its bucket would be full again, so an expired key means exactly that.
- `<prefix>:{<tenant>}:held` — concurrency slots held, a hash {sidecar id: slots}, and
  `:leases` — a sorted set {sidecar id: lease deadline in ms}. Every admission and heartbeat
  renews the sidecar's lease; every script first drops the fields of sidecars whose lease ran
  out, so a sidecar that dies leaks nothing beyond its lease. A heartbeat rewrites the sidecar's
  field with the slots it actually holds, which heals any increment or release that was lost.

Reservation model (as Limitador's): `reserve` takes the estimate (1 request, the reserved tokens,
the slots) if all three fit, else nothing; `settle` commits the engine's reported tokens (gives
back reserved - used, or charges the overrun) and releases the slots.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from slaq.api.table import ClusterQuota

NO_LIMIT = -1  # a quota the tenant does not have, as the scripts take it
URL_SCHEMES = ("redis", "rediss", "unix")

_PRELUDE = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- A bucket's level now: refilled at cap per minute since its stamp, never above cap (a lowered quota clamps it).
local function level(key, cap, now)
  local v = redis.call('HMGET', key, 'l', 't')
  if not v[1] then return cap end
  local l, t = tonumber(v[1]), tonumber(v[2])
  if now > t then l = l + (now - t) * cap / 60000 end
  return math.min(l, cap)
end
local function save(key, cap, l, now)
  if l >= cap then redis.call('DEL', key) return end
  redis.call('HSET', key, 'l', tostring(l), 't', now)
  redis.call('PEXPIRE', key, math.ceil((cap - l) * 60000 / cap) + 1000)
end
-- Drop the slots of sidecars whose lease ran out; the slots held now.
local function held(hkey, lkey, now)
  local dead = redis.call('ZRANGEBYSCORE', lkey, '-inf', now)
  for _, id in ipairs(dead) do redis.call('HDEL', hkey, id) end
  if #dead > 0 then redis.call('ZREMRANGEBYSCORE', lkey, '-inf', now) end
  local total = 0
  for _, v in ipairs(redis.call('HVALS', hkey)) do total = total + tonumber(v) end
  return total
end
local function lease(hkey, lkey, id, now, lease_ms)
  redis.call('ZADD', lkey, now + lease_ms, id)
  redis.call('PEXPIRE', lkey, lease_ms * 2)
  redis.call('PEXPIRE', hkey, lease_ms * 2)
end
"""

# KEYS: rpm, tpm, held, leases. ARGV: sidecar id, rpm cap, tpm cap, concurrency cap (NO_LIMIT: none),
# tokens, slots, lease ms, charge (1: reserve; 0: only check concurrency and rate, as the precheck does).
# Returns {verdict, detail, retry_after_ms}: verdict 0 admitted; 1 concurrency (detail: slots held);
# 2 request rate; 3 token rate (detail: level). Order as admission.QuotaGate checks: concurrency, requests, tokens.
RESERVE = _PRELUDE + """
local id, rcap, tcap, ccap = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local tokens, slots, lease_ms, charge = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8] == '1'
local now = now_ms()
if ccap >= 0 then
  local h = held(KEYS[3], KEYS[4], now)
  if h + slots > ccap then return {1, h, 1000} end
end
local rl, tl
if rcap >= 0 then
  if rcap == 0 then return {2, 0, -1} end
  rl = level(KEYS[1], rcap, now)
  local need = math.min(1, rcap)
  if rl < need then return {2, 0, math.ceil((need - rl) * 60000 / rcap)} end
end
if charge and tcap >= 0 then
  if tcap == 0 then return {3, 0, -1} end
  tl = level(KEYS[2], tcap, now)
  local need = math.min(tokens, tcap)
  if tl < need then return {3, math.floor(tl), math.ceil((need - tl) * 60000 / tcap)} end
end
if not charge then return {0, 0, 0} end
if rcap >= 0 then save(KEYS[1], rcap, rl - 1, now) end
if tcap >= 0 then save(KEYS[2], tcap, tl - tokens, now) end
redis.call('HINCRBY', KEYS[3], id, slots)
lease(KEYS[3], KEYS[4], id, now, lease_ms)
return {0, 0, 0}
"""

# KEYS: rpm, tpm, held, leases. ARGV: sidecar id, rpm cap, tpm cap, requests, token delta (> 0 gives
# back, < 0 charges an overrun), slots released. Any of them may be 0.
SETTLE = _PRELUDE + """
local id, rcap, tcap = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local requests, delta, slots = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local now = now_ms()
if rcap > 0 and requests ~= 0 then save(KEYS[1], rcap, level(KEYS[1], rcap, now) - requests, now) end
if tcap > 0 and delta ~= 0 then save(KEYS[2], tcap, math.min(tcap, level(KEYS[2], tcap, now) + delta), now) end
if slots > 0 and redis.call('HINCRBY', KEYS[3], id, -slots) <= 0 then redis.call('HDEL', KEYS[3], id) end
return 0
"""

# KEYS: held, leases. ARGV: sidecar id, slots this sidecar holds, lease ms.
HEARTBEAT = _PRELUDE + """
local id, slots, lease_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
if slots > 0 then
  redis.call('HSET', KEYS[1], id, slots)
  lease(KEYS[1], KEYS[2], id, now, lease_ms)
else
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
end
return held(KEYS[1], KEYS[2], now)
"""


class Verdict(enum.IntEnum):
    ADMITTED = 0
    CONCURRENCY = 1
    REQUEST_RATE = 2
    TOKEN_RATE = 3


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    detail: int  # concurrency: slots held cluster-wide; token rate: the bucket's level
    retry_after_s: float | None  # None: never (a zero quota)


@dataclass(frozen=True)
class StoreSettings:
    """Where the store is and how long the sidecar waits for it (`--quota-store*` flags)."""

    url: str
    password: str | None = None
    prefix: str = "slaq"
    timeout_s: float = 0.25  # one command, connecting included: a request waits at most this for the store
    lease_s: float = 10.0  # a sidecar's slots outlive it by at most this; heartbeats every lease_s / 3
    failures_to_open: int = 2  # store calls failed in a row before every decision goes local at once
    probe_after_s: float = 1.0  # while open, one call (a probe) each this long

    def __post_init__(self) -> None:
        scheme = urlsplit(self.url).scheme
        if scheme not in URL_SCHEMES:
            raise ValueError(f"quota store URL {self.url!r}: scheme must be one of {', '.join(s + '://' for s in URL_SCHEMES)}")
        if not (0 < self.timeout_s <= 1.0):
            raise ValueError(f"quota store timeout must be in (0, 1] seconds (the fallback promise), got {self.timeout_s}")
        if self.lease_s < 3 * self.timeout_s:
            raise ValueError(f"quota store lease ({self.lease_s} s) must be at least 3 store timeouts ({3 * self.timeout_s} s)")
        if self.failures_to_open < 1 or self.probe_after_s <= 0:
            raise ValueError(f"quota store breaker: failures_to_open must be >= 1 and probe_after_s > 0, got {self.failures_to_open}, {self.probe_after_s}")
        if not self.prefix or any(c in self.prefix for c in "{} "):
            raise ValueError(f"quota store key prefix {self.prefix!r}: must be non-empty, without braces or spaces")


def _cap(limit: float | int | None) -> float:
    return NO_LIMIT if limit is None else limit


class QuotaStore:
    """The scripts over one redis-py asyncio client. Errors (unreachable, timed out) propagate:
    the caller (`shared_quotas.SharedQuotaGate`) owns the fallback."""

    def __init__(self, settings: StoreSettings, sidecar_id: str, client: redis.Redis | None = None) -> None:
        self.settings = settings
        self.sidecar_id = sidecar_id
        # No retries: a retry would multiply the wait a request pays before its local fallback.
        self.client = client or redis.Redis.from_url(
            settings.url, password=settings.password, socket_timeout=settings.timeout_s, socket_connect_timeout=settings.timeout_s,
            retry=Retry(NoBackoff(), 0), health_check_interval=0)
        self._reserve = self.client.register_script(RESERVE)
        self._settle = self.client.register_script(SETTLE)
        self._heartbeat = self.client.register_script(HEARTBEAT)
        self._lease_ms = int(settings.lease_s * 1000)

    def keys(self, tenant: str) -> list[str]:
        base = f"{self.settings.prefix}:{{{tenant}}}"
        return [f"{base}:rpm", f"{base}:tpm", f"{base}:held", f"{base}:leases"]

    async def reserve(self, tenant: str, quota: ClusterQuota, tokens: int, slots: int, *, charge: bool = True) -> Decision:
        reply: Any = await self._reserve(keys=self.keys(tenant), args=[
            self.sidecar_id, _cap(quota.requests_per_minute), _cap(quota.tokens_per_minute), _cap(quota.max_concurrency),
            tokens, slots, self._lease_ms, 1 if charge else 0])
        verdict, detail, retry_ms = (int(x) for x in reply)
        return Decision(Verdict(verdict), detail, None if retry_ms < 0 else retry_ms / 1000.0)

    async def settle(self, tenant: str, quota: ClusterQuota, *, requests: int = 0, token_delta: float = 0, slots: int = 0) -> None:
        await self._settle(keys=self.keys(tenant), args=[
            self.sidecar_id, _cap(quota.requests_per_minute), _cap(quota.tokens_per_minute), requests, token_delta, slots])

    async def heartbeat(self, tenant: str, slots: int) -> int:
        """Set this sidecar's slots for `tenant` (0: drop them) and renew its lease; returns the
        slots held cluster-wide."""
        return int(await self._heartbeat(keys=self.keys(tenant)[2:], args=[self.sidecar_id, slots, self._lease_ms]))

    async def ping(self) -> None:
        await self.client.ping()

    async def aclose(self) -> None:
        await self.client.aclose()

