"""Choosing K per request and per step: the most expected tokens per second for the batch.

vLLM-free. A request at stride k (k drafts verified and k MASK slots appended per warm step)
alternates warm steps (drafts available: 1 + 2k query rows) and cold ones (after a
rejection: 1 + k rows). With r_j = P(the first j drafts are accepted), S_k = r_1 + .. + r_k,
it stays warm with probability r_k, so per forward (ADAPTIVE.md):

    tokens(k) = (2 + S_k - r_k) / (2 - r_k)
    rows(k)   = (2k + 1 + (1 - r_k)(k + 1)) / (2 - r_k)

and k = 0 is plain decoding: one row, one token. A step costs c(R, n, M) = a + b R (+ d + e n
+ m M when n > 0 requests carry draft slots: vLLM's speculative path is not free, each
drafting request adds its own work, and each of the M MASK slots its own, k per request at
stride k), R the decode rows of the batch (prompt tokens of prefill chunks are fitted as a
term of their own). The policy maximises G = sum_i tokens_i(k_i) / c(sum_i rows_i(k_i), n,
sum_i k_i) with Dinkelbach's iteration: given G, each request independently takes the k
maximising tokens_i(k) - G (b rows_i(k) + [k > 0] e + m k);
G is recomputed until it stops moving. The all-plain batch (no speculative path, no d) is
the alternative it must beat, by a margin: 15% for a batch whose last plan was plain to start
drafting (`enter_margin`), 5% for one that drafts to go on (`plain_margin`).

The acceptance estimates are per request and per position (an exponential moving average,
weight `ema`, of the conditional acceptance a_j = r_j / r_{j-1}, started from the engine-wide
estimate, a slower average of weight `engine_ema` over all requests' verdicts), and the
policy keeps a request's k unless the change gains more than `hysteresis` and the request
has kept its k for `min_dwell` steps. Positions a request no longer drafts are not left
unobserved: their estimates move back toward the engine-wide one (a fraction `relax` per
step), so that a request that left a position on a few unlucky rejections drafts it again and
its verdicts decide anew, and every `probe_every` steps it drafts one position more than it
chose (plain requests all on the same step; where a plain batch stays plain after it, greedy
requests score the probe's drafts against the tokens they then emit instead of verifying
them, which would take the speculative path, see `IsdProposer._plain_step`). A probe that
changes nothing (no request raises its k before the next one) doubles the interval, up to
`max_probe_every`: a batch where drafting does not pay stops paying for probes that keep
saying so; a probe after which a request raises its k brings the interval back to
`probe_every`. The step cost is probed the other way too: a batch that drafts on every step
shows the cost fit no plain step, and every `plain_probe_every` steps it decodes one step
plainly, unless drafting wins however the steps' time splits between a and d
(`_plain_probe_due`).

The model may misprice what the engine spends around a step, and its strides then lose to
plain decoding: with `self_check` they are checked against plain decoding as measured
(`vllm_idlm.self_check`), and plain decoding is held where it delivered more tokens per second.
Exactness does not depend on any of this: whatever is drafted is verified exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from vllm_idlm.adaptive_config import AdaptiveConfig
from vllm_idlm.self_check import MODEL, PLAIN, SelfCheck
from vllm_idlm.step_cost import StepCost, StepRecord


def cumulative(conditional: Sequence[float]) -> list[float]:
    """r_j = a_1 * .. * a_j."""
    out, r = [], 1.0
    for a in conditional:
        r *= a
        out.append(r)
    return out


def tokens_per_forward(rates: Sequence[float], k: int) -> float:
    if k == 0:
        return 1.0
    r_k = rates[k - 1]
    return (2.0 + sum(rates[:k]) - r_k) / (2.0 - r_k)


def rows_per_forward(rates: Sequence[float], k: int) -> float:
    if k == 0:
        return 1.0
    r_k = rates[k - 1]
    return (2 * k + 1 + (1.0 - r_k) * (k + 1)) / (2.0 - r_k)


@dataclass
class _RequestState:
    conditional: list[float]
    k: int
    dwell: int = 0
    steps: int = 0
    probes: _ProbeSchedule | None = None  # a drafting request's own (plain ones share one)


class _Plan(NamedTuple):
    """The batch's best strides (`StridePolicy._best`) and what they were made from."""

    req_ids: tuple[str, ...]
    strides: list[int]
    goodput: float
    tables: tuple[np.ndarray, np.ndarray]  # tokens and rows per request and choice
    cost: tuple[float, ...]  # (a, b, d, e, m) of the step cost
    conditional: np.ndarray  # the requests' acceptance estimates


class _ProbeSchedule:
    """When to probe next: every `interval` steps, the interval doubling (up to the cap)
    after each probe that raised no k, back to the base after one that did."""

    def __init__(self, start: int) -> None:
        self.start = start  # the step counted from
        self.interval = 0  # the base, until the first probe
        self.next: int | None = None
        self.raised = False  # some k was raised since the last probe

    def due(self, step: int, config: AdaptiveConfig) -> bool:
        if self.next is None:
            self.next = self.start + config.probe_every
        if step < self.next:
            return False
        if self.raised or not self.interval:
            self.interval = config.probe_every
        else:
            self.interval = min(2 * self.interval, config.probe_cap)
        self.raised = False
        self.next = step + self.interval
        return True


class StridePolicy:
    """Per-request acceptance estimates and the per-step choice of k."""

    def __init__(self, config: AdaptiveConfig, cost: StepCost) -> None:
        self.config = config
        self.cost = cost
        self.engine_conditional = [config.prior] * config.max_drafts
        self.observed = [0] * config.max_drafts  # verdicts seen per position, engine-wide
        self.requests: dict[str, _RequestState] = {}
        self.chosen: dict[int, int] = {}  # k -> how many request-steps were given it
        # Probing counted apart: engine steps with a probe, request-steps probed, and the
        # raises of k the estimates then made.
        self.probed = {"steps": 0, "request_steps": 0, "raises": 0, "plain_steps": 0}
        # The last step planned plain or probed plain (`_plain_probe_due`).
        self._plain_since = 0
        self.step = 0  # engine steps chosen for
        self.plain_probes = _ProbeSchedule(0)
        self._plain_probe: tuple[int, bool] = (0, False)  # (step, probing) memo
        # The batch's best strides, kept while the batch is the same and neither its requests'
        # estimates nor the step cost moved by more than `replan_tolerance`.
        self._decision: _Plan | None = None
        self._estimates_moved = False  # some estimate changed since the plan was made
        self._plan_drafts = False  # the last plan (`_best`) drafted
        self.row_cost = cost.b  # b, or the bent cost of a row at the last plan (`_best`)
        # The check against plain decoding (not with a pinned cost: strides then do not
        # depend on the machine's timings) and, with it on, what the next step was planned
        # as: (band, arm, whether the model drafted).
        self.check = SelfCheck(config) if config.self_check and not cost.pinned else None
        self.planned: tuple[int, str, bool] | None = None
        # Whether the strides just chosen are a plain probe: the drafts in hand are dropped
        # too (the proposer reads this), so that the step is a plain one.
        self.probing_plain = False
        # Whether the strides last chosen were all 0 but for probes: the drafts the step
        # after holds are probes' only (the proposer scores those, `IsdProposer._plain_step`).
        self.chose_plain = True

    def _state(self, req_id: str) -> _RequestState:
        state = self.requests.get(req_id)
        if state is None:
            state = _RequestState(list(self.engine_conditional), k=-1)  # undecided
            self.requests[req_id] = state
        return state

    def observe(self, req_id: str, num_drafts: int, num_accepted: int) -> None:
        """One verify step: drafts 1..num_drafts were offered, the first num_accepted passed."""
        if num_drafts <= 0:
            return
        state = self._state(req_id)
        w, we = self.config.ema, self.config.engine_ema
        for j in range(min(num_accepted + 1, num_drafts)):
            hit = 1.0 if j < num_accepted else 0.0
            state.conditional[j] += w * (hit - state.conditional[j])
            self.engine_conditional[j] += we * (hit - self.engine_conditional[j])
            self.observed[j] += 1
        self._estimates_moved = True

    def forget(self, req_ids) -> None:
        for req_id in req_ids:
            if self.requests.pop(req_id, None) is not None:
                self._decision = None

    def rates(self, req_id: str) -> list[float]:
        return cumulative(self._state(req_id).conditional)

    def choose(self, req_ids: Sequence[str]) -> list[int]:
        """The stride of every request for its next step (in `req_ids` order)."""
        self.probing_plain = False
        if not req_ids:
            return []
        states = [self._state(r) for r in req_ids]
        if self.config.relax:
            self._relax(states)
        plan = self._plan(tuple(req_ids), states)
        best, goodput, (tokens, rows) = plan.strides, plan.goodput, plan.tables
        net = None  # what each choice nets each request, when a switch is weighed
        choices, max_drafts = self.config.choices, self.config.max_drafts
        self.step += 1
        band = SelfCheck.band(len(req_ids)) if self.check is not None else 0
        plain = self.check is not None and self.check.arm(band) == PLAIN
        probe_plain = not plain and self._plain_probe_due(best, goodput)
        self.probing_plain = probe_plain
        chosen, probed, drafted = [], 0, False
        for i, (state, k_new) in enumerate(zip(states, best, strict=True)):
            state.steps += 1
            state.dwell += 1
            if state.k < 0:  # a new request starts at the batch's best choice
                state.k, state.dwell = k_new, 0
            elif k_new != state.k and state.dwell >= self.config.min_dwell:
                if net is None:
                    net = self._net(tokens, rows, goodput, self.row_cost)
                old = float(net[i, choices.index(state.k)])
                new = float(net[i, choices.index(k_new)])
                if new > old + self.config.hysteresis * max(abs(old), 1e-9):
                    if k_new > state.k:  # what the last probe was looking for
                        schedule = state.probes if state.k > 0 else self.plain_probes
                        if schedule is not None:
                            schedule.raised = True
                        self.probed["raises"] += 1
                    state.k, state.dwell = k_new, 0
            # The model's k, unless the check holds plain or the batch probes plain.
            k = 0 if plain or probe_plain else state.k
            drafted = drafted or k > 0
            if not probe_plain and k < max_drafts and self._probes(state, k):
                k = next(c for c in choices if c > k)  # probe one position more
                probed += 1
            chosen.append(k)
            self.chosen[k] = self.chosen.get(k, 0) + 1
        self.chose_plain = not drafted
        if probed:
            self.probed["steps"] += 1
            self.probed["request_steps"] += probed
        if self.check is not None:
            self.planned = (band, PLAIN if plain else MODEL, any(s.k > 0 for s in states))
        return chosen

    def _plan(self, req_ids: tuple[str, ...], states: Sequence[_RequestState]) -> _Plan:
        """The batch's plan: the last one while it still holds (`_holds`), else made anew."""
        cost = self.cost
        coefficients = (cost.a, cost.b, cost.d, cost.e, cost.m)
        plan, conditional = self._decision, None
        if plan is not None and plan.req_ids == req_ids:
            if self._estimates_moved:
                conditional = _estimates(states)
            if self._holds(plan, coefficients, conditional):
                return plan
        if conditional is None:
            conditional = _estimates(states)
        tokens, rows = forward_tables(np.cumprod(conditional, axis=1), self.config.choices)
        strides, goodput = self._best(tokens, rows)
        self._estimates_moved = False
        self._decision = _Plan(req_ids, strides, goodput, (tokens, rows), coefficients, conditional)
        return self._decision

    def _holds(
        self, plan: _Plan, coefficients: tuple[float, ...], conditional: np.ndarray | None
    ) -> bool:
        """Whether `plan` still stands: no acceptance estimate moved by more than
        `replan_tolerance` since it was made (`conditional`: the estimates now, None where none
        changed), nor the predicted time of any step of the batch by more than that fraction.
        A step of n requests has at most n (2K + 1) rows, n drafting requests and n K MASK
        slots, so the coefficients' changes bound how far any plan's time moved."""
        tolerance = self.config.replan_tolerance
        moved = (
            0.0 if conditional is None else float(np.max(np.abs(conditional - plan.conditional)))
        )
        if moved > tolerance:
            return False
        if coefficients == plan.cost:
            return True
        n, k = len(plan.req_ids), self.config.max_drafts
        da, db, dd, de, dm = (abs(x - y) for x, y in zip(coefficients, plan.cost, strict=True))
        shift = da + db * n * (2 * k + 1) + dd + de * n + dm * n * k
        return shift <= tolerance * self.cost(n, 0)

    def _relax(self, states: Sequence[_RequestState]) -> None:
        """Estimates of positions beyond a request's stride get no verdicts (but a probe's):
        each step they move a fraction `relax` of the way back to the engine-wide estimate,
        so a request that left a position on a few unlucky rejections comes back to it,
        where the verdicts it then gets decide again. Within 0.01 of the engine's they stay."""
        w, engine = self.config.relax, self.engine_conditional
        for state in states:
            conditional = state.conditional
            for j in range(max(state.k, 0), len(conditional)):
                gap = engine[j] - conditional[j]
                if abs(gap) > 0.01:
                    conditional[j] += w * gap
                    self._estimates_moved = True

    def measured(self, step: StepRecord, seconds: float) -> None:
        """A finished step, for the self-check: its plan, the tokens it emitted, its time."""
        if self.check is None or step.plan is None or step.tokens is None:
            return
        if step.prompt_tokens == 0:
            self.check.observe(*step.plan, step.tokens, seconds)

    def _plain_probe_due(self, best: Sequence[int], goodput: float) -> bool:
        """Whether the batch decodes plainly this step although its plan drafts: a plain
        probe. While every step drafts, the step-cost fit sees no plain step and cannot tell
        the speculative path's fixed cost d from what every step costs, a: whatever real
        steps cost beyond the dummy steps timed at start lands on a, a plain step is priced
        as dear as a speculative one, and the plan keeps drafting where it loses (the demo
        models at concurrency 4: d fitted at its floor, 0.6 ms, while every step drafted,
        1.7 ms once plain steps came in). So every `plain_probe_every` steps the batch
        decodes one step plainly, unless the plan beats plain decoding even if all that a
        has grown since start belonged to the speculative path. The interval does not back
        off: the fit forgets (`StepCost.forget`), and a plan that drafts because d is priced
        too low would otherwise starve the fit of the plain steps that correct it.
        On that step the drafts in hand are dropped as well (`probing_plain`): verifying
        them would keep the step on the speculative path. Never with a pinned cost, nor
        before the cost was measured at start."""
        cost = self.cost
        if cost.pinned or not cost.a_start or not any(best):
            self._plain_since = self.step
            return False
        if self.step - self._plain_since < self.config.plain_probe_every:
            return False
        self._plain_since = self.step
        n = len(best)
        excess = max(cost.a - cost.a_start, 0.0)
        plain_at_least = n / max(cost(n, 0) - excess, 1e-12)
        if goodput > plain_at_least:  # drafting wins whichever way a splits
            return False
        self.probed["plain_steps"] += 1
        return True

    def _probes(self, state: _RequestState, k: int) -> bool:
        """Whether a request looks one position further this step. A drafting request probes
        on its own schedule (its step pays the speculative path anyway); plain requests probe
        together, on the same engine step, so that a batch decoding plainly pays the
        speculative path on one step in `probe_every` (and the verify step after it), not on
        every step that one of its requests happens to probe."""
        if k > 0:
            if state.probes is None:
                state.probes = _ProbeSchedule(state.steps - 1)
            return state.probes.due(state.steps, self.config)
        if self._plain_probe[0] != self.step:  # once per engine step, for all of them
            self._plain_probe = (self.step, self.plain_probes.due(self.step, self.config))
        return self._plain_probe[1]

    def best_strides(self, rates: Sequence[Sequence[float]]) -> tuple[list[int], float]:
        """Dinkelbach's iteration for the strides of most expected tokens per second of the
        batch; the all-plain batch as the alternative."""
        if not len(rates):
            return [], 0.0
        table = np.asarray(rates, dtype=float).reshape(len(rates), -1)
        return self._best(*forward_tables(table, self.config.choices))

    def _net(
        self, tokens: np.ndarray, rows: np.ndarray, goodput: float, row_cost: float | None = None
    ) -> np.ndarray:
        """What each choice of k nets a request at the batch's goodput G (tokens and rows per
        choice, in the last axis): tokens(k) - G (b rows(k) + [k > 0] e + m k), e being what
        each drafting request adds to the step beyond its rows and m what each of its k MASK
        slots adds; `row_cost` in place of b."""
        b = self.cost.b if row_cost is None else row_cost
        return tokens - goodput * (b * rows + self._per_request())

    def _per_request(self) -> np.ndarray:
        """[k > 0] e + m k for each choice of k."""
        per_request = self.cost.e + self.cost.m * np.asarray(self.config.choices, dtype=float)
        per_request[0] = 0.0
        return per_request

    def _best(self, tokens: np.ndarray, rows: np.ndarray) -> tuple[list[int], float]:
        """`best_strides` over per-request tokens and rows per choice ([requests, choices])."""
        choices, cost = self.config.choices, self.cost
        if not len(tokens):
            return [], 0.0
        at = np.arange(len(tokens))
        strides = np.asarray(choices)

        def value(picks: np.ndarray) -> float:
            drafting = int(np.count_nonzero(picks))
            return float(tokens[at, picks].sum()) / cost(
                float(rows[at, picks].sum()), drafting, float(strides[picks].sum())
            )

        picks = np.full(len(tokens), len(choices) - 1)
        goodput = value(picks)
        priced = cost.b * rows + self._per_request()  # what the net weighs at G
        for _ in range(16):
            picks = np.argmax(tokens - goodput * priced, axis=1)
            new = value(picks)
            if abs(new - goodput) <= 1e-9 * goodput:
                break
            goodput = new
        # The iteration prices rows on the line (b per row); the step cost also bends away
        # from it at small batches (`StepCost.bend`), which only whole plans show: one stride
        # for every request is weighed too.
        n, token_sums, row_sums = len(tokens), tokens.sum(axis=0), rows.sum(axis=0)
        for j in range(1, len(choices)):
            uniform = float(token_sums[j]) / cost(float(row_sums[j]), n, float(choices[j] * n))
            if uniform > goodput:
                picks, goodput = np.full(n, j), uniform
        # What a row costs between the all-plain batch and this plan, bend included (>= 0):
        # the price a request's switch of stride is weighed at (`choose`).
        plain_rows, plan_rows = float(len(tokens)), float(rows[at, picks].sum())
        self.row_cost = self.cost.b
        if plan_rows > plain_rows:
            extra = self.cost(plan_rows, 0) - self.cost(plain_rows, 0)
            self.row_cost = max(extra / (plan_rows - plain_rows), 0.0)
        # Drafting must win by a margin: where the model sees a few percent in it, what it
        # does not price (a batch whose requests finish apart and prefill their successors
        # one step at a time, cold first steps, the verify path's own jitter) has turned the
        # few percent into a loss (the demo models at concurrency 8: 3% expected, 8% lost).
        # A batch that decodes plainly needs more to start (`enter_margin`): at concurrency
        # 16 joint probes nudged plans 5-6% over plain, the whole batch drafted, the cost fit
        # raised d, and it went back within 15 steps, paying the switches both ways.
        plain = len(tokens) / self.cost(len(tokens), 0)
        margin = self.config.plain_margin if self._plan_drafts else self.config.enter_margin
        self._plan_drafts = plain * (1.0 + margin) < goodput
        if not self._plan_drafts:
            return [0] * len(tokens), plain
        return [choices[i] for i in picks.tolist()], goodput


def _estimates(states: Sequence[_RequestState]) -> np.ndarray:
    """The requests' conditional acceptance estimates, [requests, positions]."""
    return np.array([s.conditional for s in states]).reshape(len(states), -1)


def forward_tables(rates: np.ndarray, choices: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """`tokens_per_forward` and `rows_per_forward` of every request (rows of `rates`, r_j per
    position) at every choice of k, as [requests, choices] arrays: the whole batch at once."""
    n = len(rates)
    tokens, rows = np.ones((n, len(choices))), np.ones((n, len(choices)))
    if n:
        prefix = np.cumsum(rates, axis=1)  # S_k
        for i, k in enumerate(choices):
            if k:
                r = rates[:, k - 1]
                tokens[:, i] = (2.0 + prefix[:, k - 1] - r) / (2.0 - r)
                rows[:, i] = (2 * k + 1 + (1.0 - r) * (k + 1)) / (2.0 - r)
    return tokens, rows
