"""`slaq sidecar`: the pod's front door (flags rendered by the operator; see sidecar/README.md)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from slaq.api.runtime import ENGINE_HOST, ENGINE_PORT, METRICS_PORT, QUOTA_STORE_PASSWORD_ENV, TENANT_TABLE_DIR, TENANT_TABLE_KEY
from slaq.arguments import count, positive_int, seconds


def register(subparsers: argparse._SubParsersAction) -> None:
    from slaq.sidecar.auth_failures import AuthFailureLimits
    from slaq.sidecar.connections import ConnectionLimits
    from slaq.api.runtime import ENGINE_HEALTH_TIMEOUT_S as HEALTH_TIMEOUT_S

    defaults, failures = ConnectionLimits(), AuthFailureLimits()
    parser = subparsers.add_parser("sidecar", help="Run the priority-scheduling sidecar in front of an engine.", description=__doc__)
    parser.add_argument("--host", default="0.0.0.0", help="Address to listen on (default 0.0.0.0).")
    parser.add_argument("--port", type=positive_int, default=8000, help="Tenant port: the OpenAI API, /health and /ready (default 8000).")
    parser.add_argument("--metrics-port", type=positive_int, default=METRICS_PORT,
                        help=f"Metrics port: /metrics (the sidecar's and the engine's series) and /slaq/usage, kept off the tenant port (default {METRICS_PORT}).")
    parser.add_argument("--access-log", choices=("json", "off"), default="json",
                        help="One JSON line per answered or refused request on standard output (default json); never prompt or output text, never the key.")
    parser.add_argument("--engine-url", default=f"http://{ENGINE_HOST}:{ENGINE_PORT}", help="The engine's OpenAI server.")
    parser.add_argument("--tenant-table", type=Path, default=Path(TENANT_TABLE_DIR) / TENANT_TABLE_KEY, help="Tenant table JSON file; reloaded when it changes.")
    parser.add_argument("--pod-name", default=os.environ.get("POD_NAME") or None,
                        help="This pod's name: the replica enforces its own quota shares from the tenant table (default: $POD_NAME, "
                             "which the operator sets; without it the pool-wide share).")
    parser.add_argument("--max-queue-depth", type=positive_int, default=1024, help="Most requests queued here before refusing (503 queue_full).")
    parser.add_argument("--drain-timeout", type=seconds, default=30.0, help="Seconds to finish in-flight requests after SIGTERM.")
    parser.add_argument("--trusted-proxies", default=None, metavar="CIDR[,CIDR...]",
                        help="Proxies (addresses or networks) whose X-Forwarded-For names the client in the access log; "
                        "default none: the client is the TCP peer, whatever the request says.")
    parser.add_argument("--trust-gateway-headers", action="store_true", help="Trust x-llm-d-* fairness and SLO headers (only behind a gateway that sets them).")
    parser.add_argument("--served-model-name", default=None, help="Model name clients must send; other names get 404 unknown_model.")
    parser.add_argument("--scheduler-config", default=None, help="SchedulerSpec as inline JSON or a JSON/YAML file (score weights, aging bound).")
    parser.add_argument("--max-num-seqs", type=positive_int, default=256,
                        help="The engine's batch limit (the pool's engine.maxNumSeqs): the load's slot count until the engine's running gauge shows its own.")
    parser.add_argument("--max-num-batched-tokens", type=positive_int, default=8192,
                        help="The engine's step token limit (the pool's engine.maxNumBatchedTokens): the first-token lead counts prefill steps of it.")
    parser.add_argument("--batch-handover-target", type=count, default=0, metavar="N",
                        help="Release a batch request only while fewer than N batch requests are released and not yet started by "
                             "the engine, so protected tiers find at most N ahead of them in vLLM's API server (decision 0023); "
                             "0, the default: no bound of its own.")
    parser.add_argument("--tokenizer", default=None,
                        help="The served model's Hugging Face tokenizer (hub id or path; the operator passes the pool's model): prompt tokens "
                             "counted as the engine counts them, chat through its chat template. Loaded in the background; estimated "
                             "(4 ASCII characters or 1 other per token) until then, without it, or when it cannot be loaded.")
    parser.add_argument("--tokenizer-revision", default=None, help="The tokenizer's revision on the hub (the pool's model.revision).")
    parser.add_argument("--request-limits", default=None,
                        help="The pool's RequestLimitsSpec as inline JSON or a JSON/YAML file (n, prompt batch, beam search, stop, logprobs, body cap...).")
    parser.add_argument("--max-model-len", type=positive_int, default=None,
                        help="The engine's context length (the pool's model.maxModelLen): the bound on max_tokens and, times bytesPerToken, on the body, "
                             "and the prompt + output that scores 0 on the length term, as in the engine (default: bodies up to the largest "
                             "any pool may set, the length term over 8192 tokens).")
    parser.add_argument("--header-timeout", type=seconds, default=defaults.header_s, help=f"Seconds a connection may take to send a request head (default {defaults.header_s:g}).")
    parser.add_argument("--body-timeout", type=seconds, default=defaults.body_s, help=f"Seconds a request body may take to arrive; then 408 (default {defaults.body_s:g}).")
    parser.add_argument("--write-timeout", type=seconds, default=defaults.write_idle_s,
                        help=f"Seconds one write to a client that does not read may wait; then the connection is closed (default {defaults.write_idle_s:g}).")
    parser.add_argument("--engine-idle-timeout", type=seconds, default=defaults.engine_idle_s,
                        help=f"Seconds the engine may stay silent within a request; then it ends (default {defaults.engine_idle_s:g}).")
    parser.add_argument("--max-connections", type=positive_int, default=defaults.max_connections,
                        help=f"Most open connections and requests on both ports; more get 503 (default {defaults.max_connections}).")
    parser.add_argument("--max-connections-per-client", type=count, default=defaults.max_connections_per_client,
                        help=f"Most open connections from one client address (an IPv6 /64), both ports; more get 503 and are closed, "
                             f"except /health and /ready. Behind a gateway raise it to the gateway's pool, or 0 for no cap "
                             f"(default {defaults.max_connections_per_client}).")
    parser.add_argument("--quota-store", default=None, metavar="URL",
                        help="Count tenants' whole quotas in this Redis (redis://host:port/db, rediss://..., unix://...), shared by every "
                             "sidecar, instead of this replica's share of them; the shares decide while it does not answer. The password "
                             f"comes from ${QUOTA_STORE_PASSWORD_ENV} or --quota-store-password-file, never the URL (default: none, the shares decide).")
    parser.add_argument("--quota-store-password-file", type=Path, default=None, help="A file holding the store's password (a mounted Secret).")
    parser.add_argument("--quota-store-prefix", default="slaq", help="Prefix of the store's keys: installs sharing one Redis set different ones (default slaq).")
    parser.add_argument("--quota-store-timeout", type=seconds, default=0.25,
                        help="Seconds one store call may take, connecting included, before the request is decided on the shares (at most 1; default 0.25).")
    parser.add_argument("--quota-store-lease", type=seconds, default=10.0,
                        help="Seconds a sidecar's in-flight slots outlive it in the store if it dies; renewed every third of it (default 10).")
    parser.add_argument("--max-header-bytes", type=positive_int, default=defaults.max_header_bytes,
                        help=f"Most bytes of a request head (request line and headers); more get 431 and the connection is closed "
                             f"(default {defaults.max_header_bytes}).")
    parser.add_argument("--max-headers", type=positive_int, default=defaults.max_headers,
                        help=f"Most headers in a request; more get 431 and the connection is closed (default {defaults.max_headers}).")
    parser.add_argument("--auth-failure-limit", type=count, default=failures.limit,
                        help=f"Failed authentications one client address (an IPv6 /64) may have within --auth-failure-window; past it "
                             f"its requests get 429 auth_throttled with Retry-After, before their key is looked at. Behind a gateway "
                             f"name it in --trusted-proxies, or 0 to turn this off (default {failures.limit}).")
    parser.add_argument("--auth-failure-window", type=seconds, default=failures.window_s,
                        help=f"The window of --auth-failure-limit and --auth-failure-log-lines, in seconds (default {failures.window_s:g}).")
    parser.add_argument("--auth-failure-log-lines", type=count, default=failures.log_lines,
                        help=f"Access lines of failed authentication (401, 429 auth_throttled) written per client address per window; "
                             f"the rest are counted into one access_suppressed line when the window ends (default {failures.log_lines}).")
    parser.add_argument("--engine-health-timeout", type=seconds, default=HEALTH_TIMEOUT_S,
                        help=f"Seconds the engine's /health may take; past it the pod is not ready and refuses new requests with 503 "
                             f"until the engine answers again (default {HEALTH_TIMEOUT_S:g}).")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    import logging

    from slaq.sidecar.auth_failures import AuthFailureLimits
    from slaq.sidecar.connections import ConnectionLimits
    from slaq.sidecar.fields import MAX_TOKENS_LIMIT
    from slaq.sidecar.server import ConfigError, SidecarOptions, parse_quota_store, parse_request_limits, parse_scheduler_config, serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per proxied request costs latency
    try:
        if not args.auth_failure_window > 0:
            raise ConfigError(f"--auth-failure-window must be > 0 seconds, got {args.auth_failure_window:g}")
        auth_failures = AuthFailureLimits(limit=args.auth_failure_limit, window_s=args.auth_failure_window, log_lines=args.auth_failure_log_lines)
        scheduler = parse_scheduler_config(args.scheduler_config)
        request_limits = parse_request_limits(args.request_limits)
        quota_store = parse_quota_store(args.quota_store, password_file=args.quota_store_password_file,
                                        password_env=os.environ.get(QUOTA_STORE_PASSWORD_ENV), prefix=args.quota_store_prefix,
                                        timeout_s=args.quota_store_timeout, lease_s=args.quota_store_lease)
        serve(SidecarOptions(
            host=args.host,
            port=args.port,
            engine_url=args.engine_url,
            tenant_table=args.tenant_table,
            pod_name=args.pod_name,
            max_queue_depth=args.max_queue_depth,
            drain_timeout_s=args.drain_timeout,
            trust_gateway_headers=args.trust_gateway_headers,
            trusted_proxies=args.trusted_proxies,
            served_model_name=args.served_model_name,
            scheduler=scheduler,
            tokenizer=args.tokenizer,
            tokenizer_revision=args.tokenizer_revision,
            metrics_port=args.metrics_port,
            access_log=args.access_log,
            request_limits=request_limits,
            quota_store=quota_store,
            max_model_len=args.max_model_len,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            connection_limits=ConnectionLimits(header_s=args.header_timeout, body_s=args.body_timeout, write_idle_s=args.write_timeout,
                                               engine_idle_s=args.engine_idle_timeout, max_connections=args.max_connections,
                                               max_connections_per_client=args.max_connections_per_client,
                                               max_header_bytes=args.max_header_bytes, max_headers=args.max_headers),
            auth_failures=auth_failures,
            engine_health_timeout_s=args.engine_health_timeout,
            batch_handover_target=args.batch_handover_target or None,
        ))
    except ConfigError as exc:
        print(f"slaq sidecar: {exc}", file=sys.stderr)
        return 2
    return 0
