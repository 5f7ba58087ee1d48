"""The audit trail joins: a preempted request's access line leads, by its request id, to the
engine's line for it, which says it was preempted, how long it waited, and what its KV went through.

The real pod on this machine (`slaq.local.stack`: `slaq engine` on CPU with the tiny model behind
`slaq sidecar`, the example tenants). The preemption is forced by the KV cache's size, not by
timing: 9 usable blocks of 128 tokens, and two requests of 64 + 640 tokens (6 blocks each) from
the standard and the batch tenant, so they cannot both finish without one being preempted once
both run, and vLLM's KV-exhaustion preemption picks the lower tier (batch). Each tenant's KV share
admits its one request (a request larger than the share runs while the tenant holds nothing else),
and both are admitted at once (a 1-block prompt fits), so arrival order does not matter as long as
both run together. To make sure they do, the engine sleeps 10 ms per forward step (the KV
connector's `stepDelayS` test hook): each request's 640 steps then last over 6 s, where vLLM's API
server, short of CPU on two cores, can take most of a second to hand the second request over; the
tiny model alone finishes one in about 1.4 s, and in one CI run the first finished before the
second had grown past the 3 blocks left free. The batch tenant's freed blocks then go to the standard request, which the engine
zeroes first: its line counts them erased.
"""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from slaq.api.table import TenantTable, hash_api_key, key_fingerprint
from slaq.local.stack import LocalStack, StackOptions
from slaq.local.tenants import local_pool, plan_local_table, read_tenants, write_table
from tests.support.polling import wait_for

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

EXAMPLES = Path(__file__).resolve().parents[1] / "crds" / "examples"
KEYS = {"standard": "sk-demo-standard-0123456789abcdef", "free": "sk-demo-free-0123456789abcdef"}
PROMPT_TOKENS, OUTPUT_TOKENS = 64, 640  # 704 tokens: 6 blocks of 128 each, 12 for both against 9
STEP_DELAY_S = 0.01
ENGINE_ARGS = ("--max-model-len", "1024", "--max-num-seqs", "4", "--kv-test-hooks", json.dumps({"stepDelayS": STEP_DELAY_S}),
               "--", "--num-gpu-blocks-override", "10")
START_TIMEOUT_S = 420.0
ANSWER_TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalStack, TenantTable]]:
    workdir = tmp_path_factory.mktemp("audit-pod")
    table = plan_local_table(read_tenants([EXAMPLES]), local_pool("slaq-tiny"))
    write_table(table, workdir / "tenants.json")
    stack = LocalStack(StackOptions(port=0, tenant_table=workdir / "tenants.json", engine_args=ENGINE_ARGS,
                                    start_timeout_s=START_TIMEOUT_S), workdir)
    with stack:
        stack.start()
        yield stack, table


def _json_lines(path: Path, event: str) -> list[dict]:
    records = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("event") == event:
                records.append(record)
    return records


def _complete(url: str, tenant: str, seed: int, answers: dict[str, httpx.Response]) -> None:
    rng = random.Random(seed)
    body = {"model": "slaq-tiny", "prompt": [rng.randrange(3, 500) for _ in range(PROMPT_TOKENS)], "max_tokens": OUTPUT_TOKENS,
            "ignore_eos": True, "temperature": 0.0}
    answers[tenant] = httpx.post(url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEYS[tenant]}"},
                                 timeout=ANSWER_TIMEOUT_S)


def test_the_access_line_of_a_preempted_request_leads_to_the_engines_facts_for_it(pod: tuple[LocalStack, TenantTable]) -> None:
    stack, table = pod
    answers: dict[str, httpx.Response] = {}
    threads = [threading.Thread(target=_complete, args=(stack.url, tenant, seed, answers)) for seed, tenant in enumerate(KEYS)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(ANSWER_TIMEOUT_S + 10)
    assert set(answers) == set(KEYS), f"answers after {time.monotonic() - started:.0f}s: {sorted(answers)}"
    for tenant, answer in answers.items():
        assert answer.status_code == 200, (tenant, answer.text)
        assert answer.json()["usage"]["completion_tokens"] == OUTPUT_TOKENS
    ids = {tenant: answer.headers["x-request-id"] for tenant, answer in answers.items()}

    sidecar_log, engine_log = stack.workdir / "sidecar.log", stack.workdir / "engine-slaq.log"
    access = wait_for(lambda: (found := {r["request_id"]: r for r in _json_lines(sidecar_log, "request")}).keys() >= set(ids.values()) and found,
                      30, "the sidecar's access lines for both requests")
    engine = wait_for(lambda: (found := {r["request_id"]: r for r in _json_lines(engine_log, "engine_request")}).keys() >= set(ids.values()) and found,
                      30, "the engine's lines for both requests")

    # The batch request was preempted: its access line, followed by its request id, finds it.
    line = access[ids["free"]]
    assert (line["tenant"], line["tier"], line["status"], line["output_tokens"]) == ("free", "batch", 200, OUTPUT_TOKENS)
    assert line["client"] == line["peer"] == "127.0.0.1"
    stored = hash_api_key(KEYS["free"], table.hash_key())
    assert line["key_fingerprint"] == key_fingerprint(stored)  # computable from the key and the table ...
    raw = sidecar_log.read_text() + engine_log.read_text()
    assert KEYS["free"] not in raw and stored.split(":", 1)[1] not in raw  # ... but neither the key nor its hash is logged
    facts = engine[line["request_id"]]
    # vLLM's own id for it is built from the x-request-id header the sidecar sent it
    assert facts["engine_request_id"].startswith(f"cmpl-{line['request_id']}-0-"), facts["engine_request_id"]
    assert (facts["tenant"], facts["tier"], facts["finish"], facts["output_tokens"]) == ("free", "batch", "length", OUTPUT_TOKENS)
    assert facts["preemptions"] >= 1 and facts["preemptions_by_reason"].get("kv_exhausted", 0) >= 1, facts
    assert facts["queue_wait_s"] >= 0.0 and facts["requeue_wait_s"] > 0.0 and facts["engine_s"] > facts["requeue_wait_s"], facts
    assert isinstance(facts["kv_swap_out_blocks"], int) and isinstance(facts["kv_swap_in_blocks"], int)  # slaq's KV connector ran
    assert facts["kv_swap_in_blocks"] <= facts["kv_swap_out_blocks"]

    # The standard request was not preempted; it got the batch request's blocks, zeroed first.
    standard = engine[ids["standard"]]
    assert standard["engine_s"] >= OUTPUT_TOKENS * STEP_DELAY_S, standard  # the step delay held both in the engine together
    assert access[ids["standard"]]["tier"] == "standard" and standard["tier"] == "standard"
    assert standard["preemptions"] == 0 and standard["preemptions_by_reason"] == {}, standard
    assert standard["kv_erased_by_reason"].get("reuse", 0) >= 1 and standard["kv_erased_blocks"] >= 1, standard
    assert access[ids["standard"]]["key_fingerprint"] != line["key_fingerprint"]
