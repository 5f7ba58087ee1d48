"""Building and running the sidecar: options → core + apps → uvicorn, with a graceful drain on SIGTERM.

One uvicorn server listens on two sockets: the tenant port (OpenAI API, /health, /ready) and the
metrics port (/metrics, /slaq/usage); `PortRouter` hands each connection to the app of the port
it arrived on, so both share one event loop, one core and one drain.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import uvicorn
import yaml
from pydantic import ValidationError

from slaq.api.pool import RequestLimitsSpec, SchedulerSpec
from slaq.api.runtime import METRICS_PORT
from slaq.sidecar.access import AccessLog, AccessLogFormat
from slaq.sidecar.addresses import TrustedProxies
from slaq.sidecar.app import SidecarApp, head_problem
from slaq.sidecar.auth_failures import AuthFailureLimits, AuthFailures, FailureLines
from slaq.sidecar.connections import ConnectionLimits, HeadTimeoutProtocol
from slaq.sidecar.errors import refusal
from slaq.sidecar.fields import MAX_TOKENS_LIMIT, BodyLimits
from slaq.sidecar.monitor import HEALTH_TIMEOUT_S

DEFAULT_LENGTH_TOKENS = 8192  # the length term's normaliser when the engine's context length is not known
from slaq.sidecar.proxy import EngineClient
from slaq.sidecar.quota_store import QuotaStore, StoreSettings
from slaq.sidecar.service import CoreConfig, SidecarCore
from slaq.sidecar.tenants import TenantDirectory
from slaq.sidecar.tokens import PromptCounter, counter_for

log = logging.getLogger(__name__)


class ConfigError(Exception):
    """A sidecar option is unusable; the message names the option."""


@dataclass(frozen=True)
class SidecarOptions:
    host: str
    port: int
    engine_url: str
    tenant_table: Path
    max_queue_depth: int = 1024
    drain_timeout_s: float = 30.0
    trust_gateway_headers: bool = False
    served_model_name: str | None = None
    scheduler: SchedulerSpec = field(default_factory=SchedulerSpec)
    tokenizer: str | None = None  # `--tokenizer`: the model's tokenizer (a hub id or a path), loaded in the background
    tokenizer_revision: str | None = None
    metrics_port: int = METRICS_PORT
    access_log: AccessLogFormat = "json"
    request_limits: RequestLimitsSpec = field(default_factory=RequestLimitsSpec)
    # The engine's shape, from the pool spec. max_model_len bounds max_tokens and the body, and
    # normalises the length term (None: not known; bodies up to the largest any pool may set,
    # the length term over DEFAULT_LENGTH_TOKENS).
    max_model_len: int | None = None
    max_num_seqs: int = 256  # the load's slot count
    max_num_batched_tokens: int = 8192  # the first-token lead's step size
    connection_limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    trusted_proxies: str | None = None  # `--trusted-proxies`: whose X-Forwarded-For names the client (addresses.py); none by default
    pod_name: str | None = None  # `--pod-name`: whose per-pod quota shares in the tenant table this replica enforces
    quota_store: StoreSettings | None = None  # `--quota-store*`: tenants' whole quotas in a shared Redis; None: this replica's shares
    auth_failures: AuthFailureLimits = field(default_factory=AuthFailureLimits)
    engine_health_timeout_s: float = HEALTH_TIMEOUT_S
    batch_handover_target: int | None = None  # release.py's handover bound on the batch tier; None: none (decision 0023)


def _parse_spec(flag: str, value: str | None, model: type[Any]) -> Any:
    """Inline JSON (starts with '{') or a JSON/YAML file holding a `model`."""
    if not value:
        return model()
    text = value
    if not value.lstrip().startswith("{"):
        try:
            text = Path(value).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{flag}: cannot read {value}: {exc.strerror or exc}") from exc
    try:
        data: Any = json.loads(text) if text.lstrip().startswith("{") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"{flag}: not JSON or YAML: {exc}") from exc
    try:
        return model.model_validate(data or {})
    except ValidationError as exc:
        raise ConfigError(f"{flag}: {exc}") from exc


def parse_scheduler_config(value: str | None) -> SchedulerSpec:
    """`--scheduler-config`: inline JSON (starts with '{') or a JSON/YAML file holding a SchedulerSpec."""
    return _parse_spec("--scheduler-config", value, SchedulerSpec)


def parse_request_limits(value: str | None) -> RequestLimitsSpec:
    """`--request-limits`: inline JSON or a JSON/YAML file holding the pool's RequestLimitsSpec."""
    return _parse_spec("--request-limits", value, RequestLimitsSpec)


def parse_quota_store(url: str | None, *, password_file: Path | None = None, password_env: str | None = None, prefix: str = "slaq",
                      timeout_s: float = 0.25, lease_s: float = 10.0) -> StoreSettings | None:
    """`--quota-store` and its companions; None without a URL."""
    if not url:
        return None
    if urlsplit(url).password:
        raise ConfigError("--quota-store: the URL holds a password (it would show in the pod spec); "
                          "give it by file (--quota-store-password-file) or environment (a Secret)")
    password = password_env or None
    if password_file is not None:
        try:
            password = password_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"--quota-store-password-file: cannot read {password_file}: {exc.strerror or exc}") from exc
    try:
        return StoreSettings(url=url, password=password, prefix=prefix, timeout_s=timeout_s, lease_s=lease_s)
    except ValueError as exc:
        raise ConfigError(f"--quota-store: {exc}") from exc


def sidecar_id() -> str:
    """This sidecar's name in the store: its pod and a random part (a restarted container is a new holder)."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}-{os.urandom(4).hex()}"


def build_counter(tokenizer: str | None, revision: str | None = None) -> PromptCounter:
    return counter_for(tokenizer, revision)  # a tokenizer that cannot be loaded degrades counting (logged), it does not stop the pod


def build_app(options: SidecarOptions, *, counter: PromptCounter | None = None) -> SidecarApp:
    config = CoreConfig(
        served_model_name=options.served_model_name,
        max_queue_depth=options.max_queue_depth,
        scheduler=options.scheduler,
        trust_gateway_headers=options.trust_gateway_headers,
        limits=BodyLimits(options.request_limits, options.max_model_len or MAX_TOKENS_LIMIT),
        max_length_tokens=options.max_model_len or DEFAULT_LENGTH_TOKENS,
        max_num_seqs=options.max_num_seqs,
        max_num_batched_tokens=options.max_num_batched_tokens,
        handover_target=options.batch_handover_target,
    )
    store = QuotaStore(options.quota_store, sidecar_id()) if options.quota_store is not None else None
    core = SidecarCore(config, TenantDirectory(options.tenant_table, pod=options.pod_name), counter=counter or build_counter(options.tokenizer, options.tokenizer_revision),
                       quota_store=store)
    limits = options.connection_limits
    try:
        proxies = TrustedProxies.parse(options.trusted_proxies)
    except ValueError as exc:
        raise ConfigError(f"--trusted-proxies: {exc}") from exc
    failures = options.auth_failures
    access = AccessLog(options.access_log, failure_lines=FailureLines(failures.log_lines, failures.window_s))
    return SidecarApp(core, EngineClient(options.engine_url, engine_idle_s=limits.engine_idle_s), access=access,
                      connection_limits=limits, trusted_proxies=proxies, auth_failures=AuthFailures(failures),
                      engine_health_timeout_s=options.engine_health_timeout_s)


class PortRouter:
    """ASGI: a connection goes to the app of the local port it arrived on; lifespan to the tenant app."""

    def __init__(self, tenant: SidecarApp, metrics_port: int) -> None:
        self.tenant = tenant
        self.metrics_port = metrics_port

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        server = scope.get("server")
        if scope["type"] == "http" and server is not None and server[1] == self.metrics_port:
            problem = head_problem(scope)  # the tenant app checks its own (and logs the refusal)
            if problem is not None:
                status, headers, body = refusal(problem)
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
            await self.tenant.metrics_app(scope, receive, send)
        else:
            await self.tenant(scope, receive, send)


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket (port 0: a free one), as uvicorn would bind it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.set_inheritable(True)
    return sock


class DrainingServer(uvicorn.Server):
    """On SIGTERM/SIGINT: refuse new requests and report not ready at once, then let uvicorn stop
    accepting and wait up to the drain timeout for in-flight requests (queued ones included)."""

    def __init__(self, config: uvicorn.Config, app: SidecarApp) -> None:
        super().__init__(config)
        self.sidecar = app

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.sidecar.core.draining = True
        super().handle_exit(sig, frame)


def connection_settings(limits: ConnectionLimits, metrics_port: int | None = None) -> dict[str, Any]:
    """uvicorn.Config arguments for the sidecar's connections: the protocol holding the head timeout
    and the connection limits (global, per client; the metrics port and probes are exempt from the
    global one), and no proxy headers: the client's address is the peer unless --trusted-proxies
    says otherwise (addresses.py), where uvicorn's default would believe X-Forwarded-For from
    127.0.0.1 or $FORWARDED_ALLOW_IPS and rewrite the peer itself."""
    exempt = frozenset() if metrics_port is None else frozenset({metrics_port})
    return {"http": HeadTimeoutProtocol.with_limits(limits, exempt), "limit_concurrency": limits.max_connections, "proxy_headers": False}


def serve(options: SidecarOptions) -> None:
    if options.metrics_port == options.port:
        raise ConfigError(f"--metrics-port must differ from --port (both {options.port}): metrics stay off the tenant port")
    app = build_app(options)
    if app.access.enabled:
        app.access.attach(sys.stdout)
    sockets = [bind(options.host, options.port), bind(options.host, options.metrics_port)]
    config = uvicorn.Config(
        PortRouter(app, sockets[1].getsockname()[1]),
        host=options.host,
        port=options.port,
        lifespan="on",
        timeout_graceful_shutdown=int(max(1, round(options.drain_timeout_s))),
        access_log=False,
        log_level="info",
        **connection_settings(options.connection_limits, sockets[1].getsockname()[1]),
    )
    # uvicorn re-raises the captured signal under the handler that was installed before it ran;
    # after a completed drain a SIGTERM has done its job, so the process exits 0, not 143.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    DrainingServer(config, app).run(sockets=sockets)
