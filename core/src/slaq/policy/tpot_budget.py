"""Objective-driven step token budget: spend the running requests' TPOT slack, never more.

With async scheduling every decoding request gets one token per engine step, so a request's
time per output token is the duration of the steps it runs in. A step that carries a long
prefill chunk (vLLM's default budget, e.g. 8,192 tokens) takes far longer than a decode-only
step, and every decoding request in it waits that long for its token.

A TPOT objective is a mean over a request's output, so each decoding request carries a pace:
its i-th token is due at anchor + i x TPOT (anchored at its first token, and again when it
resumes after a preemption: the engine's `slaq.engine.tpot_budget.PaceClock`, which reads vLLM's
requests). The step planned now delivers every decoding request's next token after the steps
already in flight, so it may last

    target = min over decoding requests (pace deadline of that token - now)
             - steps in flight x the last planned step - (1 - safety) x T    (T: tightest objective)
    clamped to [safety x T, MAX_STEP_TPOTS x T]

A request ahead of its pace lets a step run long (big prefill chunks); one at its pace gets
steps of T, one behind gets steps of safety x T, which catch it up by (1 - safety) x T a step.
The upper clamp keeps a step short enough not to delay urgent arrivals' first tokens, except
for urgent prefill planning: while a request with a TTFT objective waits, the step may grow up
to the full pace slack to fit that request's prompt (`BatchView.urgent_tokens`).

The tightest TTFT class the pod serves (`BatchView.tight_ttft_s`, with its mean prompt of n tokens)
bounds the steps for other work twice over. A request of that class meets its objective only
when its whole prompt runs in one step, soon after it arrives: on a 32B model a 4,000-token prompt
takes ~0.33 s of a 0.5 s objective, and in steps paced to a 50 ms TPOT it took ~10 steps (0.5 s).

    own      = predicted step of the decodes and n prompt tokens (n^2 / 2 pairs)
    horizon  = (safety x TTFT - own) / (1 + AHEAD_STEPS)     if own < safety x TTFT, else no horizon
    reserve  = own - T                                       (with a horizon)

- The horizon caps every step that does not carry such a prompt (with or without a TPOT
  objective running): an arrival waits for the step running and the one already planned
  (vLLM's async scheduling) before its own, so each may last (TTFT - own) / 2, less the
  safety margin (the model's prediction of a long prompt's step runs ~10 % short).
- The reserve is pace slack that steps for other work leave unspent (they plan for
  ahead - reserve), so that the class's prompt finds the slack for its whole step; a request on
  its pace banks it at floor steps, (1 - safety) x T a token.
- A waiting request of that class (`BatchView.urgent_tight`) may stretch the step over the
  horizon to the whole slack (no TPOT objective running: to its whole prompt); another urgent
  request's prompt stretches it only to the horizon, leaving the reserve.
- When the slack is short of the class's whole prompt, the step may also spend the decoders'
  credit (`BatchView.pace_credit_s`: how far each may fall behind its pace, by the output it is
  still planned to deliver), if that lets the prompt run whole, and never on a chunk: a request
  that started decoding moments ago has not banked the reserve, and its credit stands in for it
  (decision 0028).

A class whose own step already exceeds its objective gets neither: holding other work back would
not save it.

    budget = (target - a - c * kv) / b   tokens, if some running request has a TPOT objective
           = vLLM's max_num_scheduled_tokens otherwise (throughput does not collapse)
    budget is clamped to [running + MIN_PREFILL_TOKENS, max_num_scheduled_tokens]: every decode
    keeps its token and admission always progresses (the scheduler also puts decodes ahead of
    prefill chunks whenever a cap applies)

where step time ≈ a + b * tokens + c * kv + d * pairs (kv: tokens of KV cache the running batch
holds, which its attention kernels read every step; pairs: the (query, key) pairs of the step's
prompt chunks, n x context + n^2 / 2 for a chunk of n tokens at `context`) is calibrated online from
measured step durations (`StepTimeModel`), starting from a prior. The KV term matters: at a burst's
peak a batch of long contexts spends most of a 50 ms step reading KV, and a model linear in tokens
alone is wrong by the difference. The pairs term prices long contexts' prompt chunks: a token of a
chunk at 100k tokens of context costs its attention over all of them (about 100 us on an H200,
three times the token's GEMMs), so a budget priced per token lets a long context's chunk outlast
the step it was planned for. When the step may carry a chunk at `BatchView.prefill_context_tokens`,
the budget's prompt tokens are priced at b + d x (context + n / 2) each (the decodes at b). A step's duration is measured as the time from the later of (its scheduling, the
previous step's completion) to its own completion, which is what a pipelined engine spends on it.
Without a pace (`BatchView.pace_slack_s` None) the target is safety x T, as before slack was spent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from slaq.policy.step_budget import STEP_BUDGETS, BatchView

SAFETY = 0.85  # fraction of the tightest objective a step may take (measurement noise, sampling, detokenisation)
MIN_PREFILL_TOKENS = 64  # prompt tokens a shaped step may always carry beyond the decodes: admission never stalls
# Features are scaled so the three coefficients are of similar size (seconds per feature unit).
TOKEN_UNIT = 1_000.0
KV_UNIT = 100_000.0
PAIR_UNIT = 1e7
PRIOR_WEIGHT = 0.2  # ridge pull towards the last estimate, in observations; keeps unexcited directions put
MAX_STEP_TPOTS = 2.0  # a step spends slack up to this many of the tightest objective (urgent prefills: up to all of it)
AHEAD_STEPS = 1  # steps already planned when an arrival is first seen (vLLM's async scheduling): it waits for them and the running one
CREDIT_MIN_OWN = 0.5  # the decoders lend their credit only to a class whose own step is at least this share of its objective (decision 0028)
MIN_HORIZON_FIXED = 4.0  # the horizon never holds a step under this many of its fixed cost (steps of overhead alone)


def _solve(m: list[list[float]], v: list[float]) -> list[float]:
    """Solve the system m x = v (m symmetric positive definite) by Gaussian elimination."""
    n = len(v)
    a = [row[:] + [v[i]] for i, row in enumerate(m)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            factor = a[r][col] / a[col][col]
            for c in range(col, n + 1):
                a[r][c] -= factor * a[col][c]
    x = [0.0] * n
    for r in reversed(range(n)):
        x[r] = (a[r][n] - sum(a[r][c] * x[c] for c in range(r + 1, n))) / a[r][r]
    return x


@dataclass
class StepTimeModel:
    """step seconds ≈ fixed + per_token * tokens + per_kv_token * kv_tokens, refined from observations.

    Exponentially weighted least squares (forgetting factor `forget`) with a ridge pull towards
    the last estimate (the initial coefficients before any step), solved afresh from the weighted
    sums after each observation. The ridge is what keeps the model stable when the steps stop
    exciting a direction (e.g. a run of decode-only steps of the same size): plain recursive least
    squares with forgetting winds its covariance up there and diverges. Pulled towards the last
    estimate, an unexcited coefficient stays where it was: what a prompt step costs survives a
    decode-only stretch, whose forgotten sums would otherwise hand it back to the initial guess
    (decision 0031).
    """

    fixed_s: float = 0.010
    per_token_s: float = 30e-6
    per_kv_token_s: float = 0.0
    per_pair_s: float = 0.0  # a (query, key) pair of a prompt chunk's attention
    forget: float = 0.98
    observations: int = 0
    _s: list[list[float]] = field(default_factory=lambda: [[0.0] * 4 for _ in range(4)])
    _r: list[float] = field(default_factory=lambda: [0.0] * 4)

    def predict(self, tokens: int, kv_tokens: int = 0, pairs: int = 0) -> float:
        return self.fixed_s + self.per_token_s * tokens + self.per_kv_token_s * kv_tokens + self.per_pair_s * pairs

    def prompt_step_s(self, prompt_tokens: int, decodes: int = 0, kv_tokens: int = 0) -> float:
        """A step that carries a whole prompt (its tokens attending over one another: n^2 / 2 pairs) beside `decodes`."""
        return self.predict(decodes + prompt_tokens, kv_tokens, prompt_tokens * prompt_tokens // 2)

    def tokens_within(self, seconds: float, kv_tokens: int = 0, *, decodes: int = 0, context: int = 0) -> float:
        """Tokens a step of `seconds` holds: `decodes` single tokens first (at the per-token cost), the rest
        a prompt chunk of n tokens at `context` tokens of KV, whose n x (context + n / 2) pairs count too."""
        per_token = max(self.per_token_s, 1e-9)
        spare = seconds - self.fixed_s - self.per_kv_token_s * kv_tokens - per_token * decodes
        pair = self.per_pair_s
        if spare <= 0.0 or pair <= 0.0:
            return decodes + spare / per_token
        linear = per_token + pair * context  # spare = linear n + pair n^2 / 2
        return decodes + 2.0 * spare / (linear + math.sqrt(linear * linear + 2.0 * pair * spare))

    def observe(self, tokens: int, seconds: float, kv_tokens: int = 0, pairs: int = 0) -> None:
        if tokens <= 0 or not 0.0 < seconds < math.inf:
            return
        x = (1.0, tokens / TOKEN_UNIT, kv_tokens / KV_UNIT, pairs / PAIR_UNIT)
        s, r, f = self._s, self._r, self.forget
        for i in range(4):
            r[i] = f * r[i] + x[i] * seconds
            row = s[i]
            for j in range(4):
                row[j] = f * row[j] + x[i] * x[j]
        lhs = [[s[i][j] + (PRIOR_WEIGHT if i == j else 0.0) for j in range(4)] for i in range(4)]
        last = (self.fixed_s, self.per_token_s * TOKEN_UNIT, self.per_kv_token_s * KV_UNIT, self.per_pair_s * PAIR_UNIT)
        rhs = [r[i] + PRIOR_WEIGHT * last[i] for i in range(4)]
        fixed, per_unit, per_kv_unit, per_pair_unit = _solve(lhs, rhs)
        if not all(math.isfinite(v) for v in (fixed, per_unit, per_kv_unit, per_pair_unit)):
            return  # an ill-conditioned solve keeps the last good fit rather than poisoning budgets
        self.fixed_s = max(0.0, fixed)
        self.per_token_s = max(1e-9, per_unit / TOKEN_UNIT)
        self.per_kv_token_s = max(0.0, per_kv_unit / KV_UNIT)
        self.per_pair_s = max(0.0, per_pair_unit / PAIR_UNIT)
        self.observations += 1


@dataclass
class TpotStepBudget:
    """The `StepBudget` of the rule above."""

    model: StepTimeModel = field(default_factory=StepTimeModel)
    safety: float = SAFETY
    max_step_tpots: float = MAX_STEP_TPOTS
    last_budget: int | None = None
    last_target_s: float = 0.0  # the step duration the last budget was planned for

    def tight_class(self, batch: BatchView) -> tuple[float, float] | None:
        """(own, horizon) of the tightest TTFT class: the predicted step of the running decodes and one of
        its prompts, and the longest a step that does not carry such a prompt may last; None: no bound."""
        if batch.tight_ttft_s is None or batch.tight_prompt_tokens <= 0:
            return None
        own = self.model.prompt_step_s(batch.tight_prompt_tokens, batch.running, batch.kv_tokens)
        if own >= self.safety * batch.tight_ttft_s:
            return None
        return own, max(MIN_HORIZON_FIXED * self.model.fixed_s, (self.safety * batch.tight_ttft_s - own) / (1 + AHEAD_STEPS))

    def horizon_s(self, batch: BatchView) -> float | None:
        """The longest a step that does not carry a prompt of the tightest TTFT class may last (None: no bound)."""
        tight = self.tight_class(batch)
        return None if tight is None else tight[1]

    def target_s(self, batch: BatchView) -> tuple[float, float]:
        """(the step duration to plan for, the longest an urgent prefill may stretch it to)."""
        tpot = batch.tightest_tpot_s
        assert tpot is not None
        floor = self.safety * tpot
        tight = self.tight_class(batch)
        cap = math.inf if tight is None else tight[1]
        if batch.pace_slack_s is None:
            return min(floor, cap), min(floor, cap)
        ahead = self._ahead_s(batch)
        reserve = 0.0 if tight is None else max(0.0, tight[0] - tpot)
        target = min(max(floor, min(ahead - reserve, self.max_step_tpots * tpot)), cap)
        if batch.urgent_tight:
            return target, max(floor, ahead)
        return target, min(max(floor, ahead - reserve), cap)

    def _ahead_s(self, batch: BatchView) -> float:
        """The pace slack a step planned now may spend: less the steps in flight and the margin."""
        assert batch.pace_slack_s is not None and batch.tightest_tpot_s is not None
        return batch.pace_slack_s - batch.steps_in_flight * self.last_target_s - (1.0 - self.safety) * batch.tightest_tpot_s

    def _credit_buys_whole(self, batch: BatchView, whole: int, reach: int, stretch_s: float, limit: int) -> bool:
        """Whether the tight class's prompt, in chunks of `reach` tokens (with the decodes) in steps of
        `stretch_s`, would miss its deadline, and the slack and the decoders' credit, up to the reserve
        it stands in for, fit it whole in this step."""
        tight = self.tight_class(batch)
        if not (batch.urgent_tight and batch.pace_credit_s > 0.0 and batch.pace_slack_s is not None and tight is not None
                and batch.urgent_slack_s is not None and batch.tight_ttft_s is not None):
            return False
        if tight[0] < CREDIT_MIN_OWN * batch.tight_ttft_s:
            return False  # a class with room in its objective meets it in chunks (decision 0028)
        chunk = max(reach - batch.running, MIN_PREFILL_TOKENS)
        chunked_s = batch.steps_in_flight * self.last_target_s + math.ceil(batch.urgent_tokens / chunk) * stretch_s
        if chunked_s <= self.safety * batch.urgent_slack_s:
            return False
        assert batch.tightest_tpot_s is not None
        credit = min(batch.pace_credit_s, tight[0] - batch.tightest_tpot_s)
        return credit > 0.0 and self._tokens_within(self._ahead_s(batch) + credit, batch, limit) >= whole

    def budget(self, batch: BatchView, limit: int, now: float) -> int | None:
        if batch.tightest_tpot_s is None:
            return self._horizon_budget(batch, limit)
        target, stretch = self.target_s(batch)
        tokens = self._tokens_within(target, batch, limit)
        if batch.urgent_tokens:
            # Urgent prefill planning: room for the urgent prompt (after the decodes), as far as the slack allows;
            # for the tight class's prompt, as far as the decoders' credit too, when that lets it run whole.
            whole = batch.running + batch.urgent_tokens + self._beside(batch)
            reach = self._tokens_within(stretch, batch, limit)
            if reach < whole and self._credit_buys_whole(batch, whole, reach, stretch, limit):
                reach = whole
            tokens = max(tokens, min(reach, whole))
            target = max(target, self.model.predict(tokens, batch.kv_tokens))
        self.last_budget = min(limit, max(batch.running + MIN_PREFILL_TOKENS, tokens))
        self.last_target_s = min(target, self.model.predict(self.last_budget, batch.kv_tokens))
        return self.last_budget

    @staticmethod
    def _beside(batch: BatchView) -> int:
        """Prompt tokens a step that carries a tight class's whole prompt also has room for: the
        MIN_PREFILL_TOKENS every shaped step carries, so a short prompt that fits beside it starts with it
        (the report's scenario 4.5: C beside A) instead of waiting a step behind whatever comes next."""
        return MIN_PREFILL_TOKENS if batch.urgent_tight else 0

    def _horizon_budget(self, batch: BatchView, limit: int) -> int | None:
        """No TPOT objective running: vLLM's budget, or the horizon's while a tight TTFT class is served
        (a waiting request of that class gets its whole prompt)."""
        horizon = self.horizon_s(batch)
        tokens = limit if horizon is None else self._tokens_within(horizon, batch, limit)
        if batch.urgent_tight:
            tokens = max(tokens, batch.running + batch.urgent_tokens + self._beside(batch))
        if tokens >= limit:  # the horizon leaves vLLM's budget as it is
            self.last_budget = None
            self.last_target_s = 0.0
            return None
        self.last_budget = min(limit, max(batch.running + MIN_PREFILL_TOKENS, tokens))
        self.last_target_s = self.model.predict(self.last_budget, batch.kv_tokens)
        return self.last_budget

    def _tokens_within(self, seconds: float, batch: BatchView, limit: int) -> int:
        if batch.prefill_context_tokens:
            estimate = self.model.tokens_within(seconds, batch.kv_tokens, decodes=batch.running, context=batch.prefill_context_tokens)
        else:
            estimate = self.model.tokens_within(seconds, batch.kv_tokens)
        return limit if math.isnan(estimate) else int(min(max(estimate, 0.0), limit))

    def observe(self, tokens: int, seconds: float, kv_tokens: int = 0, pairs: int = 0) -> None:
        self.model.observe(tokens, seconds, kv_tokens, pairs)


STEP_BUDGETS.register("tpot", TpotStepBudget)
