#!/usr/bin/env bash
# GPU readiness of slaq's KV security and step-time profile, on one CUDA GPU (issue 14, item 5).
#
#   scripts/gpu_check.sh [--dry-run] [--out DIR]
#
# 1. kernels:    the Triton erase/copy kernels against their torch references on CUDA, and the cost
#                of erasing a Llama-3-8B block (python -m slaq.kernels.check)          -> DIR/kernels.json
# 2. erase test: the real-engine KV erase test and its negative control on the GPU engine: Llama-3-8B
#                geometry with dummy weights (nothing downloaded), the tiny model's tokenizer (vocab
#                512, so answers detokenize), vLLM block size 128 as on CPU, 10 blocks -> DIR/erase-test.log
# 3. step times: measured prefill and decode steps beside tools/src/slaq/bench/models/h200-llama3-8b.yaml's
#                prediction, to calibrate it (scripts/gpu_step_times.py)                -> DIR/step_times.json
# 4. seal cost:  the KV connector worker's seal and open of a Llama-3-8B block, device-to-host copies
#                included, to calibrate the profile's gpu.host_seal_gb_s
#                (python -m slaq.engine.kv_security.seal_cost)                          -> DIR/seal_cost.json
# 5. pod:        the pod as shipped (scripts/gpu_pod_check.py): slaq engine with erase and swap on and
#                the swap rule at its default (by cost, seal throughput measured at start) behind the
#                sidecar, Llama-3-8B geometry with dummy weights, 512 blocks of 16 tokens, driven into
#                preemption; prints the rule's decisions (victims swapped / recomputed by tier), its
#                price per token on each side and the step-time model the scheduler learned -> DIR/pod.json
#
# --dry-run: no CUDA needed. Prints every command it would run and checks what can be checked on
# CPU: the kernels against their references (small, reference path), both model directories are
# written and read back by transformers as Llama-3-8B, the erase test's selection collects exactly
# its two tests with the GPU flags in place, the step-time script's arguments parse, and the pod
# check's plan (engine command and load) is the pod as shipped: GPU, dummy weights, swap on.
# Figures go to --out DIR (default for a GPU run: gpu-check/<UTC time>/ in the repository, to commit).
# Exit status: 0 when every step passed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DRY_RUN=0
OUT=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY_RUN=1; shift ;;
    --out) OUT="${2:?--out needs a directory}"; shift 2 ;;
    -h|--help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (known: --dry-run, --out DIR)" >&2; exit 2 ;;
  esac
done
PYTHON="${PYTHON:-python}"
if [[ $DRY_RUN == 0 ]]; then
  "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "gpu_check.sh: no CUDA device (use --dry-run on CPU)")'
fi
WORK="$(mktemp -d -t slaq-gpu-check-XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
if [[ -z $OUT ]]; then  # a GPU run's figures are kept under the repository; a dry run's are not
  if [[ $DRY_RUN == 1 ]]; then OUT="$WORK/out"; else OUT="$ROOT/gpu-check/$(date -u +%Y%m%dT%H%M%SZ)"; fi
fi
mkdir -p "$OUT"
cd "$ROOT"

ERASE_MODEL="$WORK/llama3-8b-vocab512"
STEP_MODEL="$WORK/llama3-8b"
ERASE_TESTS="zeroed_before_the_new_tenant_writes or negative_control"
# bf16 (the config's dtype; slaq engine passes --dtype auto for a model of its own). The host cache
# of the test (0.01 GiB) holds no 16 MiB Llama-3-8B block: swap stays off, as only erase is checked.
export SLAQ_TEST_ENGINE_ARGS="--model $ERASE_MODEL --load-format dummy --device gpu --served-model-name slaq-tiny"
export SLAQ_TEST_VLLM_ARGS="--block-size 128"
export SLAQ_TEST_ENGINE_START_S=540  # under the tests' 600 s pytest timeout

step() {  # step NAME COMMAND...: print it, then run it (the dry run runs only what is CPU-safe)
  echo "== $1: ${*:2}"
}

if [[ $DRY_RUN == 0 ]]; then
  step kernels "$PYTHON" -m slaq.kernels.check --device cuda
  "$PYTHON" -m slaq.kernels.check --device cuda | tee "$OUT/kernels.json"

  "$PYTHON" scripts/gpu_step_times.py "$ERASE_MODEL" --vocab 512 --write-model-only
  step erase-test "$PYTHON" -m pytest -q -p no:cacheprovider tests/engine/test_kv_security_engine.py -k "$ERASE_TESTS"
  "$PYTHON" -m pytest -q -p no:cacheprovider tests/engine/test_kv_security_engine.py -k "$ERASE_TESTS" 2>&1 | tee "$OUT/erase-test.log"

  step step-times "$PYTHON" scripts/gpu_step_times.py "$STEP_MODEL" --out "$OUT/step_times.json"
  "$PYTHON" scripts/gpu_step_times.py "$STEP_MODEL" --out "$OUT/step_times.json"

  step seal-cost "$PYTHON" -m slaq.engine.kv_security.seal_cost --device cuda
  "$PYTHON" -m slaq.engine.kv_security.seal_cost --device cuda | tee "$OUT/seal_cost.json"

  step pod "$PYTHON" scripts/gpu_pod_check.py "$ERASE_MODEL" --out "$OUT/pod.json"
  "$PYTHON" scripts/gpu_pod_check.py "$ERASE_MODEL" --out "$OUT/pod.json"
  "$PYTHON" - "$OUT/pod.json" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
for v in report["victims"]:
    print(f"   swap rule: {v['tier']} victims {v['choice']} ({v['reason']}): {v['value']:.0f}")
print("   price per token:", report["rule_s_per_token"], "; step-time model:", report["step_time_model"])
EOF
  echo "gpu_check.sh: all steps passed; figures in $OUT"
  exit 0
fi

echo "gpu_check.sh --dry-run: what a CUDA run does, checked on CPU"
step kernels "$PYTHON" -m slaq.kernels.check --device cuda
"$PYTHON" -m slaq.kernels.check --device cpu --dtype float32 --num-blocks 64 --batch 8 --repeats 1 --layers 32 > "$OUT/kernels-cpu.json"
"$PYTHON" - "$OUT/kernels-cpu.json" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
assert report["agreement_failures"] == [], report
assert report["erase"]["seconds_per_block_all_layers"] > 0, report
print("   kernels: references agree on CPU; erase timing runs")
EOF

"$PYTHON" scripts/gpu_step_times.py "$ERASE_MODEL" --vocab 512 --write-model-only > /dev/null
"$PYTHON" scripts/gpu_step_times.py "$STEP_MODEL" --write-model-only > /dev/null
"$PYTHON" - "$ERASE_MODEL" "$STEP_MODEL" <<'EOF'
import sys
from transformers import AutoConfig
for path, vocab in ((sys.argv[1], 512), (sys.argv[2], 128256)):
    config = AutoConfig.from_pretrained(path)
    geometry = (config.model_type, config.num_hidden_layers, config.hidden_size, config.num_key_value_heads, config.vocab_size)
    assert geometry == ("llama", 32, 4096, 8, vocab), (path, geometry)
print("   model directories: Llama-3-8B geometry, vocab 512 (erase test) and 128256 (step times)")
EOF

step erase-test "$PYTHON" -m pytest -q -p no:cacheprovider tests/engine/test_kv_security_engine.py -k "$ERASE_TESTS"
"$PYTHON" -m pytest -q -p no:cacheprovider --collect-only tests/engine/test_kv_security_engine.py -k "$ERASE_TESTS" > "$WORK/collected.txt"
"$PYTHON" - "$WORK/collected.txt" <<'EOF'
import sys
from tests.support.engine import engine_arguments
from tests.engine.test_kv_security_engine import ENGINE_ARGS
import os
lines = [l for l in open(sys.argv[1]) if "::test_" in l]
assert len(lines) == 2 and any("negative_control" in l for l in lines), lines
command = engine_arguments(ENGINE_ARGS, dict(os.environ))
ours, vllm = command[:command.index("--")], command[command.index("--") + 1:]
assert "--device" in ours and ours[ours.index("--device") + 1] == "gpu" and "--load-format" in ours, command
assert vllm[-2:] == ["--block-size", "128"] and "--num-gpu-blocks-override" in vllm, command
print("   erase test: 2 tests selected; engine command:", " ".join(command))
EOF

step step-times "$PYTHON" scripts/gpu_step_times.py "$STEP_MODEL" --out "$OUT/step_times.json"
"$PYTHON" scripts/gpu_step_times.py --help > /dev/null

step seal-cost "$PYTHON" -m slaq.engine.kv_security.seal_cost --device cuda
"$PYTHON" -m slaq.engine.kv_security.seal_cost --device cpu --layers 2 --blocks 4 --repeats 1 > "$OUT/seal_cost-cpu.json"
"$PYTHON" - "$OUT/seal_cost-cpu.json" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
assert report["seal_gb_s"] > 0 and report["open_gb_s"] > 0, report
print("   seal cost: the worker's seal and open path runs on CPU")
EOF
step pod "$PYTHON" scripts/gpu_pod_check.py "$ERASE_MODEL" --out "$OUT/pod.json"
"$PYTHON" scripts/gpu_pod_check.py "$ERASE_MODEL" --plan-only > "$WORK/pod-plan.json"
"$PYTHON" - "$WORK/pod-plan.json" <<'EOF'
import json, sys
plan = json.loads(open(sys.argv[1]).read().splitlines()[0])
engine = plan["engine"]
ours = engine[:engine.index("--", engine.index("engine"))]
assert ours[ours.index("--device") + 1] == "gpu" and ours[ours.index("--load-format") + 1] == "dummy", engine
assert "--kv-host-cache-gib" not in ours and "--kv-swap-choice" not in ours and "--kv-erase" not in ours, engine  # as shipped: swap on, by cost
assert "sidecar" in plan["sidecar"] and len(plan["load"]["batch"]) == 4 and plan["load"]["critical"], plan
print("   pod: engine command", " ".join(engine[engine.index("engine"):]))
EOF
echo "gpu_check.sh --dry-run: passed (no GPU used)"
