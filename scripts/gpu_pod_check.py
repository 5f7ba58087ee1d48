"""The pod as shipped on one machine: `slaq engine` (SLAScheduler, KV connector with erase and swap on,
the swap rule at its default: by cost, the seal throughput measured when the engine starts) behind
the sidecar with the example tenants (one per tier, quotas lifted), driven into preemption; prints what the swap rule decided and
the step-time model the scheduler learned.

    python scripts/gpu_pod_check.py [MODEL_DIR] [--device gpu|cpu] [--kv-blocks N] [--block-size N]
                                    [--out FILE] [--plan-only]

Without MODEL_DIR the tiny built-in model runs (on CPU: what the dry run of scripts/gpu_check.sh
plans, and a quick check of this script). MODEL_DIR is loaded with dummy weights (nothing is
downloaded); `scripts/gpu_check.sh` writes a Llama-3-8B one with the tiny tokenizer. The load: four
batch-tier requests that together need more KV than `--kv-blocks` blocks hold (vLLM preempts among
them), then, once two of them decode, two critical requests that do not fit beside them (the scheduler
preempts batch requests for them). The KV connector seals a victim only when the rule finds sealing
and opening cheaper than recomputing. Output (JSON): the victims by tier and choice
(`slaq_engine_kv_swap_victims_total`), preemptions by reason, blocks sealed and restored, the rule's
price per token on each side, the learned step-time model, and every request's outcome.
`--plan-only`: print the commands and the load without starting anything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

SERIES = ("slaq_engine_kv_swap_victims", "slaq_engine_preemptions", "slaq_engine_kv_swap_blocks",
          "slaq_engine_step_time_model_seconds", "slaq_engine_kv_swap_seal_seconds_per_token")


def load_plan(kv_tokens: int) -> dict[str, list[tuple[int, int]]]:
    """(prompt tokens, output tokens) per tier: batch requests of a third of the KV cache each, four of
    them; critical ones of a quarter, which fit only where a batch request made room."""
    batch = (kv_tokens // 5, kv_tokens // 3 - kv_tokens // 5)
    critical = (kv_tokens // 4, 16)
    return {"batch": [batch] * 4, "critical": [critical] * 2}


def collect(metrics_text: str) -> dict:
    """The series this check reports, from the sidecar's /metrics (which carries the engine's)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[dict]] = {name: [] for name in SERIES}
    for family in text_string_to_metric_families(metrics_text):
        if family.name not in out:
            continue
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            out[family.name].append({**sample.labels, "value": sample.value})
    model = {s["term"]: s["value"] for s in out["slaq_engine_step_time_model_seconds"]}
    seal = out["slaq_engine_kv_swap_seal_seconds_per_token"]
    return {
        "victims": out["slaq_engine_kv_swap_victims"],
        "preemptions": out["slaq_engine_preemptions"],
        "swap_blocks": out["slaq_engine_kv_swap_blocks"],
        "step_time_model": model,
        "rule_s_per_token": {"seal_and_open": seal[0]["value"] if seal else None, "recompute": model.get("per_token")},
    }


async def drive(url: str, model: str, keys: dict[str, str], plan: dict[str, list[tuple[int, int]]], seed: int) -> list[dict]:
    from slaq.local.loadgen import PlannedRequest, stream_one

    origin = time.monotonic()
    started = [asyncio.Event() for _ in plan["batch"]]
    batch = [asyncio.create_task(stream_one(url, model, PlannedRequest(0.0, "batch", keys["batch"], p, o, seed + i), origin, event))
             for i, ((p, o), event) in enumerate(zip(plan["batch"], started))]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started[:2])), 600)  # two decode: the cache is nearly full
    critical = [asyncio.create_task(stream_one(url, model, PlannedRequest(0.0, "critical", keys["critical"], p, o, seed + 100 + i), origin))
                for i, (p, o) in enumerate(plan["critical"])]
    outcomes = await asyncio.wait_for(asyncio.gather(*batch, *critical), 1200)
    return [{"tier": o.letter, "status": o.status, "ttft_s": o.ttft_s, "finished": o.finished} for o in outcomes]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu_pod_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", nargs="?", default=None, help="default: the tiny built-in model")
    parser.add_argument("--device", choices=("gpu", "cpu"), default=None, help="default: gpu with MODEL_DIR, cpu for the tiny model")
    parser.add_argument("--kv-blocks", type=int, default=None, help="KV cache blocks (default: 512 on GPU, 16 on CPU)")
    parser.add_argument("--block-size", type=int, default=None, help="vLLM block size (default: 16 on GPU, 128 on CPU)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--plan-only", action="store_true")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    from slaq.api.common import Tier
    from slaq.local.demo import demo_tenants, scaled_tenant
    from slaq.local.stack import LocalStack, StackOptions, new_workdir
    from slaq.local.tenants import LocalTenants, local_pool, plan_local_table, read_tenants, write_table
    from slaq.local.up import default_tenants

    device = args.device or ("gpu" if args.model_dir else "cpu")
    blocks = args.kv_blocks or (512 if device == "gpu" else 16)
    block_size = args.block_size or (16 if device == "gpu" else 128)
    plan = load_plan(blocks * block_size)
    served = "slaq-pod-check" if args.model_dir else None
    engine_args = ["--device", device, "--max-num-seqs", "8"]
    if args.model_dir:
        engine_args += ["--load-format", "dummy", "--max-model-len", str(blocks * block_size)]
    engine_args += ["--", "--block-size", str(block_size), "--num-gpu-blocks-override", str(blocks)]
    local = read_tenants([default_tenants()])
    by_tier = demo_tenants(local)
    keys = {"batch": local.keys[by_tier[Tier.BATCH].metadata.name][0], "critical": local.keys[by_tier[Tier.CRITICAL].metadata.name][0]}
    workdir = new_workdir("slaq-pod-check-")
    # The example tenants without their quotas (a concurrency cap would queue the batch requests in the
    # sidecar one at a time, and nothing would be preempted), their TTFT objectives kept.
    unquoted = LocalTenants([scaled_tenant(t, None if t.spec.objectives.ttft_ms is None else t.spec.objectives.ttft_ms / 1000.0)
                             for t in by_tier.values()], {t.metadata.name: local.keys[t.metadata.name] for t in by_tier.values()})
    table = write_table(plan_local_table(unquoted, local_pool(served or "slaq-tiny")), workdir / "tenants.json")
    stack = LocalStack(StackOptions(port=0, model=args.model_dir, served_model_name=served, engine_args=tuple(engine_args),
                                    tenant_table=table, start_timeout_s=900.0), workdir)
    print(json.dumps({"engine": stack.engine_command(), "sidecar": "slaq sidecar in front (tenant table " + str(table) + ")",
                      "load": plan, "tenants": {t: by_tier[Tier(t)].metadata.name for t in ("batch", "critical")}}), flush=True)
    if args.plan_only:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
        return 0
    with stack:
        t0 = time.monotonic()
        stack.start()
        print(f"pod ready in {time.monotonic() - t0:.0f}s; logs in {workdir}", file=sys.stderr, flush=True)
        outcomes = asyncio.run(drive(stack.url, stack.served_model_name, keys, plan, args.seed))
        import httpx

        report = {"device": device, "kv_blocks": blocks, "block_size": block_size, **collect(httpx.get(stack.metrics_url + "/metrics", timeout=30).text),
                  "requests": outcomes}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    bad = [o for o in outcomes if not o["finished"]]
    if bad:
        print(f"gpu_pod_check: {len(bad)} request(s) did not finish: {bad}", file=sys.stderr)
        return 1
    if not report["victims"]:
        print("gpu_pod_check: nothing was preempted: the load did not pose the question", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
