"""`slaq engine`: run vLLM's OpenAI server with the slaq scheduler (see slaq.engine.launcher)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from slaq.api.runtime import ENGINE_HOST, ENGINE_PORT

if TYPE_CHECKING:
    from slaq.engine.launcher import EngineOptions


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "engine",
        allow_abbrev=False,
        help="run vLLM's OpenAI server with the slaq SLA-aware scheduler",
        description="Run vLLM's OpenAI server in-process with scheduler_cls=SLAScheduler and scheduling_policy=priority. "
        "Without --model, a tiny built-in model (random weights) runs on CPU. Arguments after -- go to vLLM unchanged.",
    )
    parser.add_argument("--host", default=ENGINE_HOST, help=f"address to bind (default {ENGINE_HOST})")
    parser.add_argument("--port", type=int, default=ENGINE_PORT, help=f"port (default {ENGINE_PORT})")
    parser.add_argument("--model", default=None, help="any vLLM model (default: the tiny built-in model)")
    parser.add_argument("--device", choices=("gpu", "cpu"), default=None, help="default: cpu for the tiny model, gpu otherwise")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--tensor-parallel-size", type=int, default=None)
    parser.add_argument("--gpu-memory-utilization", type=float, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--load-format", default=None, help="default: dummy for the tiny model, auto otherwise")
    parser.add_argument("--served-model-name", default=None, help="default: slaq-tiny for the tiny model, else the model")
    parser.add_argument("--revision", default=None)
    parser.add_argument("--scheduler-config", default=None, metavar="JSON|FILE", help="the pool's spec.scheduler (wire JSON, or a file holding it)")
    parser.add_argument("--scheduler", choices=("slaq", "stock", "stock-priority"), default="slaq",
                        help="slaq (default): SLAScheduler with priority policy; stock: vLLM's own scheduler, FCFS, as a baseline; "
                        "stock-priority: vLLM's own scheduler with its static priority policy (the request's `priority` field)")
    parser.add_argument("--kv-erase", choices=("on", "off"), default="on",
                        help="on (default): zero a KV block before another tenant's request gets it (kvErase onFree tenants: as soon as freed); "
                        "off: only for comparisons")
    parser.add_argument("--kv-host-cache-gib", type=float, default=None, metavar="GIB",
                        help="host memory holding preempted requests' KV, sealed with AES-GCM, so readmission does not recompute it "
                        "(default 1; 0: recompute)")
    parser.add_argument("--kv-seal-gb-s", type=float, default=None, metavar="GB_S",
                        help="the host's seal and open throughput (GB/s each way) the swap rule charges a preempted request's KV "
                        "(default: measured when the engine starts; python -m slaq.engine.kv_security.seal_cost measures it on a GPU)")
    parser.add_argument("--kv-swap-choice", choices=("cost", "always"), default="cost",
                        help="cost (default): seal a preempted request's KV to host memory only when sealing and restoring it cost less "
                        "than recomputing it (the scheduler's learned step time against the seal throughput); always: every one that fits")
    parser.add_argument("--request-log", choices=("json", "off"), default="json",
                        help="json (default): one JSON line per finished request on standard output (event engine_request: the "
                        "sidecar's request_id, queue waits, preemptions by reason, KV blocks erased and swapped); off: none")
    parser.add_argument("--kv-test-hooks", default=None, metavar="JSON", help=argparse.SUPPRESS)  # tests only: inspectPath, tamperFlag, stepDelayS
    parser.add_argument("vllm_args", nargs=argparse.REMAINDER, help="-- then further vLLM server arguments")
    parser.set_defaults(handler=_engine)


def engine_options(args: argparse.Namespace) -> "EngineOptions":
    """The launcher's options from `slaq engine`'s parsed arguments (EngineError for a bad value)."""
    from slaq.cli import passthrough_args
    from slaq.engine.config import read_scheduler_config_argument
    from slaq.engine.launcher import KV_HOST_CACHE_GIB_DEFAULT, EngineOptions

    return EngineOptions(
        host=args.host,
        port=args.port,
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        tensor_parallel_size=args.tensor_parallel_size,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        load_format=args.load_format,
        served_model_name=args.served_model_name,
        revision=args.revision,
        scheduler_config=read_scheduler_config_argument(args.scheduler_config) if args.scheduler_config else None,
        scheduler=args.scheduler,
        kv_erase=args.kv_erase == "on",
        kv_host_cache_gib=KV_HOST_CACHE_GIB_DEFAULT if args.kv_host_cache_gib is None else args.kv_host_cache_gib,
        kv_seal_gb_s=args.kv_seal_gb_s,
        kv_swap_choice=args.kv_swap_choice,
        kv_test_hooks=json.loads(args.kv_test_hooks) if args.kv_test_hooks else {},
        request_log=args.request_log,
        extra=tuple(passthrough_args(args.vllm_args)),
    )


def _engine(args: argparse.Namespace) -> int:
    from slaq.engine.errors import EngineError
    from slaq.engine.launcher import run

    try:
        run(engine_options(args))
    except EngineError as exc:
        print(f"slaq engine: {exc}", file=sys.stderr)
        return 2
    return 0
