"""Choosing K per request and per step: the most expected tokens per second for the batch.

vLLM-free. The batch's plan (`vllm_idlm.stride_plan`: the tokens and rows a stride yields per
forward, Dinkelbach's iteration over the batch, the margin over plain decoding) is made from
the estimates kept here, and turned here into each request's stride for the next step.

The acceptance estimates are per request and per position (an exponential moving average,
weight `ema`, of the conditional acceptance a_j = r_j / r_{j-1}, started from the engine-wide
estimate, a slower average of weight `engine_ema` over all requests' verdicts), and the
policy keeps a request's k unless the change gains more than `hysteresis` and the request
has kept its k for `min_dwell` steps (but where the batch's plan is plain decoding, every
request stops drafting at once). Positions a request no longer drafts are not left
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

from vllm_idlm.adaptive_config import AdaptiveConfig
from vllm_idlm.self_check import MODEL, PLAIN, SelfCheck
from vllm_idlm.step_cost import StepCost, StepRecord
from vllm_idlm.stride_plan import BatchPlanner, cumulative


@dataclass
class _RequestState:
    """A request's estimates and stride. Its steps are counted in the policy's steps (one
    per `choose`): `first` the step it was first chosen for, `since` the step its k was set
    on (it has kept k for `step - since` steps since), so that a step need not touch the
    requests whose k it keeps."""

    conditional: list[float]
    k: int
    since: int = 0
    first: int = 0
    probes: _ProbeSchedule | None = None  # a drafting request's own (plain ones share one)
    # (the policy's `verdicts`, k) when the estimates beyond k were last found within reach
    # of the engine-wide ones (`StridePolicy._relax`): until either changes, nothing to do.
    settled: tuple[int, int] = (-1, -1)


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
        # The batch's plan, kept while the batch is the same and neither its requests'
        # estimates nor the step cost moved by more than `replan_tolerance`.
        self.planner = BatchPlanner(config, cost)
        self.engine_conditional = [config.prior] * config.max_drafts
        self.observed = [0] * config.max_drafts  # verdicts seen per position, engine-wide
        self.verdicts = 0  # verify steps observed (each moves the engine-wide estimates)
        self._k_changes = 0  # times some request's k was set (`_relax`'s memo)
        self._relaxed: tuple | None = None  # (verdicts, k changes, batch) found all settled
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

    @property
    def config(self) -> AdaptiveConfig:
        return self.planner.config

    @config.setter
    def config(self, config: AdaptiveConfig) -> None:
        self.planner.config = config

    @property
    def cost(self) -> StepCost:
        return self.planner.cost

    @cost.setter
    def cost(self, cost: StepCost) -> None:
        self.planner.cost = cost

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
        self.verdicts += 1
        self.planner.estimates_moved = True

    def forget(self, req_ids) -> None:
        for req_id in req_ids:
            if self.requests.pop(req_id, None) is not None:
                self.planner.decision = None
                self._relaxed = None

    def rates(self, req_id: str) -> list[float]:
        return cumulative(self._state(req_id).conditional)

    def choose(self, req_ids: Sequence[str]) -> list[int]:
        """The stride of every request for its next step (in `req_ids` order)."""
        self.probing_plain = False
        if not req_ids:
            return []
        known = self.requests.get
        states = [known(r) or self._state(r) for r in req_ids]
        batch = tuple(req_ids)
        if self.config.relax:
            self._relax(batch, states)
        plan = self.planner.plan(batch, lambda: _estimates(states))
        best, goodput, (tokens, rows) = plan.strides, plan.goodput, plan.tables
        net, row_cost = self.planner.net, self.planner.row_cost  # to weigh a switch
        choices, max_drafts = self.config.choices, self.config.max_drafts
        self.step += 1
        step = self.step
        band = SelfCheck.band(len(req_ids)) if self.check is not None else 0
        plain = self.check is not None and self.check.arm(band) == PLAIN
        if not any(best):
            chosen = self._choose_plain(states)
            if self.check is not None:
                self.planned = (band, PLAIN if plain else MODEL, False)
            return chosen
        probe_plain = not plain and self._plain_probe_due(best, goodput)
        self.probing_plain = probe_plain
        chosen, probed, drafted = [], 0, False
        for i, (state, k_new) in enumerate(zip(states, best, strict=True)):
            if state.k < 0:  # a new request starts at the batch's best choice
                state.k, state.since, state.first = k_new, step, step
                self._k_changes += 1
            elif k_new != state.k and step - state.since >= self.config.min_dwell:
                old = net(tokens, rows, goodput, i, state.k, row_cost)
                new = net(tokens, rows, goodput, i, k_new, row_cost)
                if new > old + self.config.hysteresis * max(abs(old), 1e-9):
                    if k_new > state.k:  # what the last probe was looking for
                        schedule = state.probes if state.k > 0 else self.plain_probes
                        if schedule is not None:
                            schedule.raised = True
                        self.probed["raises"] += 1
                    state.k, state.since = k_new, step
                    self._k_changes += 1
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

    def _choose_plain(self, states: Sequence[_RequestState]) -> list[int]:
        """`choose` where the batch's plan is plain decoding: every request stops drafting
        at once, dwell or not. One that kept its k would keep every step of the whole batch
        on the speculative path, which the plan weighed only as a whole
        (`BatchPlanner.best`, with its own margins against flapping). On the demo models at
        concurrency 64 the fit put those steps at ~7 ms over their rows, a plain step at
        ~14 ms; at concurrency 32 then 64, with the dwell kept here the engine ran 139
        speculative steps of 2141 and 0.89x plain decoding at 64, without it 72 of 2144 and
        0.99x (RESULTS.md, twenty-eighth session). The requests probe together (`_probes`).
        Most steps of a busy engine that does not draft come here: each request's k is
        looked at, and set where it is not 0 yet; the plan is not read per request."""
        step = self.step
        self._plain_since = step  # no plain probe while the plan is plain
        for state in states:
            if state.k:
                if state.k < 0:
                    state.first = step
                state.k, state.since = 0, step
                self._k_changes += 1
        self.chose_plain = True
        n = len(states)
        k = self.config.choices[1] if self._plain_probe_due_now() else 0
        if k:
            self.probed["steps"] += 1
            self.probed["request_steps"] += n
        self.chosen[k] = self.chosen.get(k, 0) + n
        return [k] * n

    def _relax(self, batch: tuple[str, ...], states: Sequence[_RequestState]) -> None:
        """Estimates of positions beyond a request's stride get no verdicts (but a probe's):
        each step they move a fraction `relax` of the way back to the engine-wide estimate,
        so a request that left a position on a few unlucky rejections comes back to it,
        where the verdicts it then gets decide again. Within 0.01 of the engine's they stay;
        a request found so is not looked at again until a verdict moves the engine's
        estimates or its k changes."""
        w, engine, verdicts = self.config.relax, self.engine_conditional, self.verdicts
        memo = (verdicts, self._k_changes, batch)
        if self._relaxed == memo:  # every request of this batch found settled, nothing since
            return
        everyone = True
        for state in states:
            mark = (verdicts, state.k)
            if state.settled == mark:
                continue
            conditional, settled = state.conditional, True
            for j in range(max(state.k, 0), len(conditional)):
                gap = engine[j] - conditional[j]
                if abs(gap) > 0.01:
                    conditional[j] += w * gap
                    self.planner.estimates_moved = True
                    settled = False
            if settled:
                state.settled = mark
            everyone = everyone and settled
        self._relaxed = memo if everyone else None

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
            steps = self.step - state.first + 1
            if state.probes is None:
                state.probes = _ProbeSchedule(steps - 1)
            return state.probes.due(steps, self.config)
        return self._plain_probe_due_now()

    def _plain_probe_due_now(self) -> bool:
        """Whether plain requests probe on this step (asked once per step, for all of them)."""
        if self._plain_probe[0] != self.step:
            self._plain_probe = (self.step, self.plain_probes.due(self.step, self.config))
        return self._plain_probe[1]


def _estimates(states: Sequence[_RequestState]) -> list[list[float]]:
    """The requests' conditional acceptance estimates, per request and position (the lists
    the estimates are kept in: `BatchPlanner.plan` copies them)."""
    return [s.conditional for s in states]
