"""The policy registry: a policy name to the scheduler class the simulator drives.

- `fcfs`, `priority`: stock vLLM 0.32 `AsyncScheduler` with that scheduling policy, loaded through
  the vLLM seam (`slaq.engine.vllm_compat`) like every other use of vLLM;
- `slaq`: `slaq.engine.scheduler.SLAScheduler` (vLLM policy `priority`), loaded by name so the
  benchmark never imports a scheduler that is not there: when it is absent the policy fails
  with a message saying so, it is never replaced by something else;
- `slaq-max-tokens`: the same scheduler planning a request without a client `max_tokens` on the rest of
  the context, as before it planned on the sidecar's predicted output (`slaq.engine.output_plan`): the
  same run with and without the prediction;
- `oracle`: `slaq.bench.oracle.OracleScheduler`, which knows every request's true output
  length and the exact step-time model: a bound, not a deployable policy.

With `--pod` the policies whose pod ships a sidecar (`behind_sidecar`: `slaq`) run behind the real
sidecar core (`slaq.bench.pod`); stock vLLM's pod has none, and the oracle stays a bound on the
engine alone. The policies whose engine ships slaq's KV connector (`ships_kv_connector`: `slaq`)
swap their preemption victims' KV to host memory unless `--kv-swap off` (`slaq.bench.kv_swap`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from slaq.bench.errors import PolicyUnavailable


@dataclass(frozen=True)
class PolicySpec:
    name: str
    scheduling_policy: str
    summary: str
    module: str
    attribute: str
    knows_true_lengths: bool = False
    behind_sidecar: bool = False  # --pod: its pod runs the slaq sidecar in front of the engine
    ships_kv_connector: bool = False  # its engine loads slaq's KV connector (KV swap: slaq.bench.kv_swap)

    def load(self) -> type:
        try:
            module = importlib.import_module(self.module)
        except ImportError as exc:
            raise PolicyUnavailable(
                f"policy {self.name!r} needs {self.module}.{self.attribute}, which cannot be imported here ({exc}); "
                f"run the other policies or install the component that provides it"
            ) from exc
        try:
            return getattr(module, self.attribute)
        except AttributeError as exc:
            raise PolicyUnavailable(f"policy {self.name!r}: {self.module} has no {self.attribute}") from exc


POLICIES: dict[str, PolicySpec] = {
    spec.name: spec
    for spec in (
        PolicySpec("fcfs", "fcfs", "stock vLLM AsyncScheduler, first come first served", "slaq.engine.vllm_compat", "AsyncScheduler"),
        PolicySpec("priority", "priority", "stock vLLM AsyncScheduler, request priority = tier rank", "slaq.engine.vllm_compat", "AsyncScheduler"),
        PolicySpec("slaq", "priority", "slaq SLAScheduler (engine/src/slaq/engine/)", "slaq.engine.scheduler", "SLAScheduler", behind_sidecar=True,
                   ships_kv_connector=True),
        PolicySpec("slaq-max-tokens", "priority", "slaq SLAScheduler planning on max_tokens, not the sidecar's predicted output "
                   "(for comparison, slaq.bench.engine_variants)", "slaq.bench.engine_variants", "MaxTokensSLAScheduler",
                   behind_sidecar=True, ships_kv_connector=True),
        PolicySpec("oracle", "priority", "bound: knows true output lengths and the step-time model", "slaq.bench.oracle", "OracleScheduler", knows_true_lengths=True),
    )
}


def policy(name: str) -> PolicySpec:
    try:
        return POLICIES[name]
    except KeyError:
        raise PolicyUnavailable(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None


def parse_policies(text: str) -> list[PolicySpec]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise PolicyUnavailable("no policy given (e.g. --policies fcfs,priority,slaq,oracle)")
    if len(set(names)) != len(names):
        raise PolicyUnavailable(f"policy listed twice in {text!r}")
    return [policy(n) for n in names]


