"""The step cost model (vLLM-free): the online fit, its floors and anchor, step timing."""

from __future__ import annotations

import pytest

from vllm_idlm.step_cost import StepCost, solve_floors


def test_step_cost_recovers_a_linear_model_from_observed_steps():
    cost = StepCost(a=1.0, b=1.0)
    for i in range(200):
        rows = 8 + (i * 37) % 120
        spec = i % 3 != 0
        cost.observe(rows, spec, 0.010 + 0.0002 * rows + (0.002 if spec else 0.0))
    assert cost.a == pytest.approx(0.010, rel=0.05)
    assert cost.b == pytest.approx(0.0002, rel=0.05)
    assert cost.d == pytest.approx(0.002, rel=0.1)


def test_prompt_tokens_are_fitted_apart_from_decode_rows():
    """Prefill chunks in a busy engine: prompt tokens are cheap rows; counted as decode rows
    they would drag the per-row cost down."""
    cost = StepCost(a=1.0, b=1.0)
    for i in range(300):
        rows = 64 + (i * 37) % 128
        spec = i % 4 != 0
        prompt = 32 * (i % 3)
        t = 0.007 + 0.0003 * rows + (0.001 if spec else 0.0) + 0.00002 * prompt
        cost.observe(rows, spec, t, prompt)
    assert cost.b == pytest.approx(0.0003, rel=0.02)
    assert cost.p == pytest.approx(0.00002, rel=0.05)
    assert cost.a == pytest.approx(0.007, rel=0.05) and cost.d == pytest.approx(0.001, rel=0.1)


def test_the_fit_never_puts_d_below_the_floor_measured_at_start():
    """Concurrency 1, as the real model saw it: plain steps of one row, speculative steps of
    3 to 7 rows, timings whose least-squares d is below what the engine measured at start.
    d stays at the floor and a, b are solved again with it held; above the floor the fit
    is free."""

    def fed(floor: float, d_true: float) -> StepCost:
        cost = StepCost(a=1.0, b=1.0)
        cost.floor_d(floor)
        assert cost.d == floor
        for i in range(400):
            spec = i % 4 == 0
            rows = 3 + 2 * (i % 3) if spec else 1
            noise = 0.0005 * ((i * 7919) % 11 - 5) / 5
            cost.observe(rows, spec, 0.040 + 0.002 * rows + (d_true if spec else 0.0) + noise)
        return cost

    held = fed(floor=0.008, d_true=0.0)
    assert held.d == 0.008
    assert held.a == pytest.approx(0.040, rel=0.05)
    # b absorbs what d was not: the slope through the speculative steps, given d = 0.008.
    assert held.b < 0.002
    assert fed(floor=0.0, d_true=0.0).d < 0.002  # with no floor the fit is free to say ~0
    assert fed(floor=0.008, d_true=0.015).d == pytest.approx(0.015, rel=0.1)


def test_b_is_held_near_its_measurement_where_the_rows_vary_little():
    """Concurrency 1: a step of more rows is a step that drafts more and emits more tokens,
    and pays for them outside the forward (0.4 ms per emitted token here), and a few slow
    steps land on long strides. A free fit lays all of it on b; anchored at what calibration
    measured (five sizes of 1 .. 512 rows), b stays near it. Rows that vary widely (a busy
    engine) move b to what they say."""
    calibrated = [1, 8, 32, 128, 512]
    spread = sum((r - sum(calibrated) / 5) ** 2 for r in calibrated)

    def fed(anchored: bool, rows_of) -> StepCost:
        cost = StepCost(a=1.0, b=1.0)
        if anchored:
            cost.anchor_b(0.0001, spread)
        cost.floor_d(0.0006)
        for i in range(400):
            rows, tokens = rows_of(i)
            slow = 0.005 if i % 13 == 0 and rows >= 7 else 0.0
            t = 0.012 + 0.0001 * rows + 0.0006 * (rows > 1) + 0.0004 * tokens + slow
            cost.observe(rows, rows > 1, t)
        return cost

    def one_request(i):  # strides 0..3, warm: 1 + 2k rows, 1 + k tokens at best
        k = (i // 5) % 4
        return 1 + 2 * k, 1 + (k * (i % 3)) // 2

    assert fed(False, one_request).b > 2 * 0.0001
    assert fed(True, one_request).b == pytest.approx(0.0001, rel=0.25)

    def busy(i):
        rows = 64 + (i * 37) % 384
        return rows, 0

    assert fed(True, busy).b == pytest.approx(0.0001, rel=0.05)  # what the busy steps say too
    wide = StepCost(a=1.0, b=1.0)
    wide.anchor_b(0.0001, spread)
    for i in range(400):
        rows = 64 + (i * 37) % 384
        wide.observe(rows, True, 0.012 + 0.0003 * rows)
    assert wide.b == pytest.approx(0.0003, rel=0.2)


def test_the_fit_finds_what_each_drafting_request_costs():
    """Batches of 8 whose requests draft or not, step by step: the speculative path costs d
    once and e per drafting request. With the number of drafting requests varying, both are
    solved; e never goes below its floor; and where every speculative step carried the same
    number of drafting requests, e and d cannot be told apart and e keeps its value."""

    def fed(drafting_of, floor_e: float = 0.0, e_true: float = 0.0003) -> StepCost:
        cost = StepCost(a=1.0, b=1.0, e=0.0001)
        if floor_e:
            cost.floor_e(floor_e)
        for i in range(400):
            n = drafting_of(i)
            rows = 8 + 2 * n + (i * 7) % 5 * (n > 0)
            noise = 0.0001 * ((i * 7919) % 11 - 5) / 5
            t = 0.007 + 0.0001 * rows + (0.001 + e_true * n if n else 0.0) + noise
            cost.observe(rows, n, t)
        return cost

    def mixed(i):
        return (i * 5) % 9  # 0 .. 8 requests drafting

    free = fed(mixed)
    assert free.e == pytest.approx(0.0003, rel=0.1) and free.d == pytest.approx(0.001, rel=0.2)
    assert free.a == pytest.approx(0.007, rel=0.05)
    held = fed(mixed, floor_e=0.0005)
    assert held.e == 0.0005  # the others absorb the difference
    assert fed(mixed, e_true=0.0).e < 0.00005  # no floor: the fit may say ~0

    def all_or_none(i):
        return 8 * (i % 3 == 0)

    collinear = fed(all_or_none)
    assert collinear.e == 0.0001  # not solved: n is 8 on every speculative step
    assert collinear.d == pytest.approx(0.001 + 0.0003 * 8 - 0.0001 * 8, rel=0.1)


def test_a_pinned_step_cost_ignores_what_steps_measure():
    cost = StepCost(a=0.010, b=0.0002, pinned=True)
    for i in range(50):
        cost.observe(8 + i, True, 1.0)  # a very different machine
    assert (cost.a, cost.b, cost.d) == (0.010, 0.0002, 0.0)


def test_a_step_is_timed_to_the_next_steps_start_unless_the_engine_idled():
    """What the engine does between forwards counts in a step's cost; idle time does not."""
    from types import SimpleNamespace

    from vllm_idlm.step_cost import IDLE_GAP_S, StepRecord, observe_step

    seen = []

    def observe(rows, spec, seconds, prompt, masks):
        seen.append((rows, spec, seconds, prompt, masks))

    cost = SimpleNamespace(observe=observe)
    busy = StepRecord(10.0, 7, True, 0, masks=3, sampled=10.008)
    observe_step(cost, busy, now=10.011)  # sampled after 8 ms, next 3 ms later
    idled = StepRecord(20.0, 1, False, 32, sampled=20.006)
    observe_step(cost, idled, now=20.006 + 2 * IDLE_GAP_S)  # the engine idled
    observe_step(cost, StepRecord(30.0, 1, False), now=30.01)  # never sampled: nothing learnt
    observe_step(cost, None, now=40.0)  # the first step
    assert [(r, s, p, m) for r, s, _, p, m in seen] == [(7, True, 0, 3), (1, False, 32, 0)]
    assert seen[0][2] == pytest.approx(0.011) and seen[1][2] == pytest.approx(0.006)


def test_the_bend_measured_at_start_prices_small_batches_and_stays_out_of_the_online_fit():
    """SmolLM2 on this CPU (`benchmarks/step_rows.py`): 1 and 2 rows cost more than 4 and 6.
    The bend is what each measured row count leaves over the line, interpolated between
    them and none outside; steps that follow the bent curve leave a and b where they are."""
    shape = [(1, 0.0135), (2, 0.019), (4, -0.0037), (6, -0.0077), (8, 0.0)]
    cost = StepCost(a=0.035, b=0.0029, shape=shape)
    assert cost(2, 0) == pytest.approx(0.035 + 2 * 0.0029 + 0.019)
    assert cost(3, 0) == pytest.approx(0.035 + 3 * 0.0029 + (0.019 - 0.0037) / 2)
    assert cost(6, 0) < cost(2, 0)  # the measured curve, not the line
    assert cost(64, 0) == pytest.approx(0.035 + 64 * 0.0029)  # beyond the measured rows: the line
    for i in range(400):
        rows = 1 + i % 8
        cost.observe(rows, 0, 0.035 + 0.0029 * rows + cost.bend(rows))
    assert cost.a == pytest.approx(0.035, rel=1e-3) and cost.b == pytest.approx(0.0029, rel=1e-3)


def test_mask_slots_are_priced_as_measured_at_start_and_stay_out_of_the_online_fit():
    """In lossless mode the gated adapter opens on every MASK slot, so a drafting step costs
    m per MASK slot beyond its rows. m is held as measured at start: the online fit takes it
    out of each step's time, and a, b and d stay where they are."""
    cost = StepCost(a=0.035, b=0.0029, d=0.002, m=0.004)
    assert cost(7, 1, 3) == pytest.approx(0.035 + 7 * 0.0029 + 0.002 + 3 * 0.004)
    assert cost(7, 0) == pytest.approx(0.035 + 7 * 0.0029)
    for i in range(400):
        k = i % 4
        rows, drafting = 1 + 2 * k, int(k > 0)
        cost.observe(rows, drafting, 0.035 + 0.0029 * rows + 0.002 * drafting + 0.004 * k, masks=k)
    assert (cost.a, cost.b, cost.d) == pytest.approx((0.035, 0.0029, 0.002), rel=1e-3)
    assert cost.m == 0.004


def test_the_floors_measured_at_start_split_into_the_path_the_request_and_the_mask_slot():
    """Calibration times one request at each trained stride (d + e + m k) and many at the
    smallest (d + e n + m k n); the three solve back, and none is ever negative."""
    d, e, m = 0.002, 0.0003, 0.004
    one = {k: d + e + m * k for k in (1, 2, 3)}
    assert solve_floors(one, 8, d + 8 * e + 8 * m) == pytest.approx((d, e, m))
    assert solve_floors({2: 0.01}) == pytest.approx((0.01, 0.0, 0.0))  # one stride: no slope
    # MASK slots no dearer than plain rows (no adapter): m is 0, not negative.
    assert solve_floors({k: 0.003 - 0.0001 * k for k in (1, 2, 3)}) == pytest.approx(
        (0.0029, 0.0, 0.0)
    )
