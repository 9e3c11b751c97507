"""The stride policy (vLLM-free): formulas, choices, hysteresis, probing, the self-check."""

from __future__ import annotations

import random

import pytest

from vllm_idlm.adaptive import StridePolicy
from vllm_idlm.adaptive_config import AdaptiveConfig
from vllm_idlm.step_cost import StepCost


def policy(a, b, d=0.0, prior=0.8, **kw) -> StridePolicy:
    return StridePolicy(AdaptiveConfig(strides=(1, 2, 3), prior=prior, **kw), StepCost(a, b, d))


def test_acceptance_estimates_follow_what_the_request_accepts():
    p = policy(a=0.01, b=0.0001, prior=0.5)
    for _ in range(40):
        p.observe("r", num_drafts=3, num_accepted=1)  # position 1 passes, 2 fails
    a1, a2, a3 = p.requests["r"].conditional
    assert a1 > 0.95 and a2 < 0.05 and a3 == pytest.approx(0.5)  # 3 never observed


def test_hysteresis_and_dwell_keep_k_from_flapping_and_probes_look_further():
    p = policy(a=0.01, b=0.001, prior=0.9, min_dwell=4, probe_every=1000)
    assert p.choose(["r"]) == [3]
    for _ in range(60):  # position 2 stops passing: k comes down to 1, after the dwell
        p.observe("r", 3, 1)
    ks = [p.choose(["r"])[0] for _ in range(8)]
    assert ks[0] == 3 and ks[-1] == 1
    assert len({k for k in ks[3:]}) == 1  # settled, not oscillating
    q = policy(a=0.0001, b=0.001, probe_every=5)  # compute-bound: plain
    ks = [q.choose(["s"])[0] for _ in range(10)]
    assert ks.count(1) == 2 and ks.count(0) == 8  # a probe every 5 steps drafts one position


def test_a_batch_whose_plan_turns_plain_stops_drafting_at_once_dwell_or_not():
    """Two requests draft (their extra rows are cheap against a step's fixed cost); the
    batch fills up to 64, where every extra row is dear and the plan is plain decoding. The
    two that drafted stop on that very step, though they have not kept their k for
    `min_dwell` steps: one drafting request keeps the whole step on the speculative path.
    The way back up keeps its dwell."""
    never = 1 << 30
    config = AdaptiveConfig(
        strides=(1, 2, 3), prior=0.8, min_dwell=4, probe_every=never, max_probe_every=never
    )
    p = StridePolicy(config, StepCost(a=0.004, b=0.0001, d=0.0005, pinned=True))
    assert all(k > 0 for k in p.choose(["r0", "r1"]))
    full = p.choose(["r0", "r1"] + [f"s{i}" for i in range(62)])
    assert full == [0] * 64
    # Back at two, they draft again once they have kept k = 0 for the dwell.
    again = [p.choose(["r0", "r1"]) for _ in range(config.min_dwell + 1)]
    assert again[0] == [0, 0] and all(k > 0 for k in again[-1])


def test_plain_requests_probe_on_the_same_step():
    """A batch decoding plainly pays the speculative path on one step in probe_every, however
    the requests' own step counts are staggered."""
    q = policy(a=0.0001, b=0.001, probe_every=4, max_probe_every=4)  # plain, no back-off
    drafting_steps = []
    for step in range(16):
        # A new request joins every step: their own step counts all differ.
        ks = q.choose([f"r{i}" for i in range(step + 1)])
        if any(ks):
            drafting_steps.append(step)
            assert all(k == 1 for k in ks)  # everyone probes then, one position
    assert drafting_steps == [3, 7, 11, 15]
    # Counted apart (idlm_state reports them): 4 steps, each probing every request it had.
    assert q.probed == {"steps": 4, "request_steps": 4 + 8 + 12 + 16, "raises": 0, "plain_steps": 0}


def test_probes_that_change_nothing_back_off_and_one_that_raises_k_resets_them():
    """Plain requests whose probes keep failing are probed at doubling intervals (up to the
    cap); once a probe finds drafting pays (a request raises its k), they come back to
    `probe_every`."""
    q = policy(a=0.0001, b=0.001, probe_every=4, max_probe_every=16, min_dwell=0)
    probe_steps = []
    for step in range(1, 61):
        ks = q.choose(["r", "s"])
        if any(ks):
            probe_steps.append(step)
            for r in ("r", "s"):
                q.observe(r, 1, 0)  # the probed draft is rejected
    assert probe_steps == [4, 8, 16, 32, 48]  # 4, 8, then 16: the cap
    q.cost.a, q.cost.b = 0.050, 0.00001  # drafting pays now: the requests raise their k
    assert q.choose(["r", "s"]) != [0, 0]
    q.cost.a, q.cost.b = 0.0001, 0.001  # and back to plain
    ks = [q.choose(["r", "s"]) for _ in range(20)]
    steps = [62 + i for i, k in enumerate(ks) if any(k)]
    assert steps[:3] == [64, 68, 76]  # the probe at 64 saw the raise: the base interval
    assert q.probed["raises"] == 2  # both requests raised their k once
    # (Without `relax`, which would bring the rejected position back by itself.)
    config = AdaptiveConfig(strides=(1, 3), prior=0.9, probe_every=2, max_probe_every=8, relax=0)
    d = StridePolicy(config, StepCost(a=0.050, b=0.00001))
    for _ in range(40):
        d.observe("r", 3, 1)  # position 1 always passes, position 2 always fails: k = 1
    ks = [d.choose(["r"])[0] for _ in range(40)]
    probes = [i + 1 for i, k in enumerate(ks) if k == 3]  # a drafting request probes k = 3
    assert set(ks) == {1, 3}
    assert probes == [2, 4, 8, 16, 24, 32, 40]  # on its own schedule, backing off too


def test_a_position_left_on_a_few_rejections_relaxes_back_and_is_drafted_again():
    """A request's estimate of a position beyond its stride gets no verdicts (probes aside):
    with `relax` it moves back toward the engine-wide estimate, so k comes back up where the
    engine says the position pays; without it the request stays down. Positions within the
    stride keep their own verdicts' estimate."""

    def run(relax):
        p = policy(a=0.050, b=0.00001, prior=0.95, min_dwell=0, probe_every=10**6, relax=relax)
        assert p.choose(["r"]) == [3]
        for _ in range(6):  # positions 1 and 2 pass, position 3 fails: a few unlucky verdicts
            p.observe("r", 3, 2)
        ks = [p.choose(["r"])[0] for _ in range(200)]
        return p, ks

    p, ks = run(relax=0.0)
    assert ks[0] == 2 and set(ks) == {2}  # down, for good
    p, ks = run(relax=0.05)
    assert ks[0] == 2 and ks[-1] == 3
    own, engine = p.requests["r"].conditional, p.engine_conditional
    assert 0.65 < own[2] < engine[2]  # from 0.36 most of the way back, until k = 3 again
    assert own[0] > engine[0] + 0.02  # position 1: its own estimate, not relaxed


def test_a_settled_request_relaxes_again_once_verdicts_move_the_engine_estimate():
    """A plain request whose estimates reached the engine-wide ones is not looked at again
    (`StridePolicy._relax`) until something moves them apart: here another request's verdicts
    pull the engine-wide estimate down, and the plain request follows it; a new request joining
    the batch starts from the engine's estimate too."""
    p = policy(a=0.001, b=0.001, prior=0.5, probe_every=10**6, relax=0.2, engine_ema=0.2)
    for _ in range(40):  # compute-bound: the batch decodes plainly, estimates settle
        assert p.choose(["plain"]) == [0]
    before = list(p.requests["plain"].conditional)
    assert before == pytest.approx(p.engine_conditional, abs=0.011)
    for _ in range(10):  # verdicts of a request that is not in this step's batch
        p.observe("other", num_drafts=1, num_accepted=0)
    assert p.engine_conditional[0] < before[0] - 0.3
    for _ in range(40):
        p.choose(["plain"])
    assert p.requests["plain"].conditional[0] == pytest.approx(p.engine_conditional[0], abs=0.011)
    p.forget(["plain"])
    p.requests["plain"] = type(p.requests["other"])([0.99] * 3, k=-1)  # id reused, far off
    for _ in range(40):
        p.choose(["plain"])
    assert p.requests["plain"].conditional[0] == pytest.approx(p.engine_conditional[0], abs=0.011)


def test_the_kept_decision_follows_the_cost_the_estimates_and_the_batch():
    """The batch's best strides are kept between steps only while nothing they depend on
    changed: a new step cost, a new observation or a new request decides again."""
    p = policy(a=0.050, b=0.00001, min_dwell=0, hysteresis=0.0, probe_every=1000, relax=0)
    assert p.choose(["r"]) == [3]  # memory-bound: draft the most
    p.cost.a, p.cost.b = 0.0001, 0.001  # the refit finds the step compute-bound
    assert p.choose(["r"]) == [0]
    p.cost.a, p.cost.b = 0.050, 0.00001
    assert p.choose(["r"]) == [3]
    for _ in range(60):  # nothing is accepted any more: drafting stops paying
        p.observe("r", 3, 0)
    assert p.choose(["r"]) == [0]
    assert p.choose(["r", "s"]) == [0, 3]  # a new request, decided afresh (drafts nearly free)


def test_the_plan_is_made_anew_only_where_an_input_moved_past_the_tolerance():
    """Small moves of the estimates (a verdict near the estimate, the drift back toward the
    engine's) and of the step cost (a refit) keep the batch's plan; a move past
    `replan_tolerance` makes it anew, and so does any move with the tolerance at 0."""

    def moves(tolerance: float) -> list[bool]:
        p = policy(a=0.050, b=0.00001, min_dwell=0, probe_every=1000, relax=0)
        p.config = AdaptiveConfig(**{**p.config.__dict__, "replan_tolerance": tolerance})
        p.choose(["r", "s"])
        made = []
        for change in (
            lambda: p.observe("r", 1, 1),  # 0.8 -> 0.83 at position 1
            lambda: p.observe("r", 1, 1),  # 0.83 -> 0.855: 0.055 from the plan's
            lambda: setattr(p.cost, "a", p.cost.a * 1.005),  # the step's time moves 0.5%
            lambda: setattr(p.cost, "a", p.cost.a * 1.04),  # and 4.5% from the plan's
            lambda: None,
        ):
            plan = p.planner.decision
            change()
            p.choose(["r", "s"])
            made.append(p.planner.decision is not plan)
        return made

    assert moves(0.04) == [False, True, False, True, False]
    assert moves(0.0) == [True, True, True, True, False]


def test_the_adaptive_object_pins_the_cost_and_sets_the_knobs():
    from vllm_idlm.config import IsdOptions
    from vllm_idlm.engine.proposer import make_policy

    spec = {
        "method": "idlm",
        "num_speculative_tokens": 3,
        "adaptive": {
            "step-ms": 20,
            "row_ms": 0.1,
            "draft_path_ms": 1,
            "draft_request_ms": 0.5,
            "mask_slot_ms": 2,
            "probe_every": 8,
        },
    }
    options = IsdOptions.from_user(spec).resolved(mask_token_id=7, trained_strides=(2, 4))
    assert options.adaptive_on
    p = make_policy(options)
    assert p.cost.pinned
    assert (p.cost.a, p.cost.b, p.cost.d, p.cost.e, p.cost.m) == pytest.approx(
        (0.02, 1e-4, 1e-3, 5e-4, 2e-3)
    )
    assert p.config.probe_every == 8 and p.config.choices == (0, 1, 3)
    free = make_policy(IsdOptions(num_drafts=2, adaptive=True, strides=(1, 2)))
    assert not free.cost.pinned
    assert not IsdOptions(num_drafts=2, adaptive=False).adaptive_on


def test_adaptive_is_on_unless_turned_off_or_the_query_length_is_uniform():
    from vllm_idlm.config import IsdOptions

    spec = {"method": "idlm", "num_speculative_tokens": 3}
    assert IsdOptions.from_user(spec).adaptive_on
    assert IsdOptions.from_user({**spec, "adaptive": None}).adaptive_on
    assert not IsdOptions.from_user({**spec, "adaptive": False}).adaptive_on
    uniform = IsdOptions.from_user({**spec, "uniform_query_len": True})
    assert not uniform.adaptive_on and uniform.adaptive is False
    with pytest.raises(ValueError, match="cannot be combined with uniform_query_len"):
        IsdOptions.from_user({**spec, "uniform_query_len": True, "adaptive": True})
    # The resolved value travels to the workers as it is.
    assert IsdOptions.from_dict(IsdOptions.from_user(spec).to_dict()).adaptive is True


def test_a_small_batch_drafts_where_its_extra_rows_cost_nothing_on_the_measured_curve():
    """The real model at concurrency 2 (RESULTS.md): fixed K = 1 ran 1.28x plain decoding,
    its 6-row steps as cheap as 2-row plain ones, while a line through 1-512 rows priced
    each extra row at 2.9 ms and the policy decoded plainly (0.85x of K = 1). With the bend
    measured at start, both requests draft, including two already decoding plainly (their
    switch is weighed at the bent price of a row)."""
    shape = [(1, 0.0135), (2, 0.019), (4, -0.0037), (6, -0.0077), (8, -0.0013), (12, 0.0)]
    config = AdaptiveConfig(
        strides=(1,), prior=0.45, min_dwell=0, probe_every=1 << 30, max_probe_every=1 << 30
    )
    line = StridePolicy(config, StepCost(a=0.035, b=0.0029, d=0.006, e=0.001, pinned=True))
    assert line.choose(["a", "b"]) == [0, 0]
    bent = StepCost(a=0.035, b=0.0029, d=0.006, e=0.001, pinned=True, shape=shape)
    line.cost, line.planner.decision = bent, None  # as calibration at engine start would
    assert line.choose(["a", "b"]) == [1, 1]  # both were decoding plainly and switch
    assert StridePolicy(config, bent).choose(["c", "d"]) == [1, 1]
    assert line.planner.row_cost == 0.0  # 2 -> 6 rows cost less on the curve: no price per row
    # At low acceptance the iteration, pricing rows on the line, settles on plain decoding;
    # the plan of one stride for both is weighed on the curve too.
    low = AdaptiveConfig(strides=(1, 2, 3), prior=0.3, probe_every=1 << 30, max_probe_every=1 << 30)
    assert StridePolicy(low, bent).choose(["e", "f"]) == [1, 1]


def test_a_lone_request_pays_for_its_mask_slots_where_the_adapter_costs_per_slot():
    """SmolLM2 in lossless mode, one request (`benchmarks/step_rows.py`): on the plain steps'
    curve 7 rows cost less than 3, so stride 3 looked nearly free, but the gated adapter
    opens on every MASK slot and a stride-3 step measured 56-77 ms against 49-51 ms at
    stride 1. With what a MASK slot costs measured at start (m), the request takes a shorter
    stride; with m = 0 it takes the longest."""
    shape = [(1, 0.0157), (2, 0.0221), (3, 0.0055), (4, -0.0014), (6, -0.0093), (8, -0.0007)]
    config = AdaptiveConfig(
        strides=(1, 2, 3), prior=0.6, min_dwell=0, probe_every=1 << 30, max_probe_every=1 << 30
    )

    def cost(m: float) -> StepCost:
        return StepCost(a=0.032, b=0.00284, d=0.0063, m=m, pinned=True, shape=shape)

    assert StridePolicy(config, cost(0.0)).choose(["a"]) == [3]
    assert StridePolicy(config, cost(0.005)).choose(["a"]) == [2]


def _engine(policy: StridePolicy, truth, acceptance: float, steps: int = 600) -> None:
    """`policy` driving an engine of four requests whose steps cost `truth(rows, drafting)`
    seconds (2% noise), every draft accepted with probability `acceptance`, as the proposer
    lays steps out: a step verifies every draft the step before proposed from its MASK slots
    (none after a rejection, none on a plain probe) and appends k MASK slots."""
    rnd = random.Random(0)
    ids = ["r0", "r1", "r2", "r3"]
    pending = dict.fromkeys(ids, 0)  # drafts each request carries into the step
    ks = policy.choose(ids)
    for _ in range(steps):
        if policy.probing_plain:
            pending = dict.fromkeys(ids, 0)
        rows = sum(1 + pending[r] + k for r, k in zip(ids, ks, strict=True))
        drafting = sum(1 for r, k in zip(ids, ks, strict=True) if k or pending[r])
        seconds = truth(rows, drafting) * (1 + 0.02 * rnd.gauss(0, 1))
        policy.cost.observe(rows, drafting, seconds, masks=sum(ks))
        for r, k in zip(ids, ks, strict=True):
            accepted = 0
            while accepted < pending[r] and rnd.random() < acceptance:
                accepted += 1
            policy.observe(r, pending[r], accepted)
            pending[r] = k if accepted == pending[r] else 0
        ks = policy.choose(ids)


def _measured_at_start(a: float, b: float, d: float) -> StepCost:
    """A step cost as calibration leaves it: a, b (anchored) and d's floor timed on dummy
    steps, refined online from there."""
    cost = StepCost(a=a, b=b)
    cost.a_start = a
    cost.anchor_b(b, 1e5)
    cost.floor_d(d)
    return cost


def test_plain_probes_find_what_the_speculative_path_costs_where_every_step_drafts():
    """The demo models at concurrency 4 (RESULTS.md), made starker: dummy steps at start put
    the speculative path at 0.4 ms and every step at 2 ms, real steps cost 4 ms plus 3.8 ms
    when four requests draft. While every step drafts, the fit cannot tell d from a: a
    absorbs the difference, plain steps look as dear as speculative ones, and the batch
    drafts on at acceptance 0.7 where plain decoding is 15% faster. A plain step now and then
    shows the fit what plain steps cost: d is found, and the batch decodes plainly. (The
    entry margin is the stay margin here: the blind engine's first plans are a few percent
    ahead.)"""

    def truth(rows: int, drafting: int) -> float:
        return 0.004 + 0.00005 * rows + (0.003 + 0.0002 * drafting if drafting else 0.0)

    def run(plain_probe_every: int) -> StridePolicy:
        config = AdaptiveConfig(
            strides=(1, 2, 3), plain_probe_every=plain_probe_every, enter_margin=0.05
        )
        policy = StridePolicy(config, _measured_at_start(0.002, 0.00005, 0.0004))
        _engine(policy, truth, acceptance=0.7)
        return policy

    probing, blind = run(32), run(1 << 30)
    assert blind.probed["plain_steps"] == 0 and blind.chosen.get(0, 0) == 0
    assert blind.cost.d == pytest.approx(0.0004)  # held at its floor; a took the rest
    assert probing.probed["plain_steps"] >= 1
    # d and the four drafting requests' e together: n does not vary while the batch drafts.
    assert probing.cost.d == pytest.approx(0.003 + 4 * 0.0002, rel=0.25)
    assert probing.chosen[0] > 0.5 * sum(probing.chosen.values())


def test_no_plain_probe_where_drafting_wins_however_the_steps_cost_splits():
    """Real steps cost what the dummy steps at start did (a has not grown): plain decoding
    cannot be dearer than priced, and at acceptance 0.9 drafting beats it; the batch is
    never held plain to find out."""

    def truth(rows: int, drafting: int) -> float:
        return 0.002 + 0.00005 * rows + (0.0004 if drafting else 0.0)

    config = AdaptiveConfig(strides=(1, 2, 3), plain_probe_every=4, prior=0.9)
    policy = StridePolicy(config, _measured_at_start(0.002, 0.00005, 0.0004))
    _engine(policy, truth, acceptance=0.9, steps=300)
    assert policy.probed["plain_steps"] == 0
    assert policy.chosen.get(0, 0) == 0  # every request-step drafted
