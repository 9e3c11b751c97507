"""The batch's plan (vLLM-free): tokens and rows per forward, Dinkelbach's iteration over the
batch's strides, the margins over plain decoding."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_idlm.adaptive_config import AdaptiveConfig
from vllm_idlm.step_cost import StepCost
from vllm_idlm.stride_plan import (
    SMALL_BATCH,
    BatchPlanner,
    cumulative,
    forward_lists,
    forward_tables,
    rows_per_forward,
    tokens_per_forward,
)


def planner(a, b, d=0.0, **kw) -> BatchPlanner:
    return BatchPlanner(AdaptiveConfig(strides=(1, 2, 3), **kw), StepCost(a, b, d))


def test_tokens_and_rows_per_forward_match_the_hand_formulas():
    rates = cumulative([0.9, 0.9, 0.9])  # i.i.d. acceptance 0.9
    assert tokens_per_forward(rates, 3) == pytest.approx(2.919, abs=1e-3)  # ISD.md, N = 4
    assert tokens_per_forward([1.0] * 3, 3) == pytest.approx(4.0)  # the ceiling N
    assert tokens_per_forward([0.0] * 3, 2) == pytest.approx(1.0)  # every step a cold start
    assert rows_per_forward([1.0] * 3, 3) == pytest.approx(7.0)  # always warm: 2K + 1
    assert rows_per_forward([0.0] * 3, 3) == pytest.approx(5.5)  # warm, cold, warm: (7 + 4) / 2
    assert tokens_per_forward(rates, 0) == rows_per_forward(rates, 0) == 1.0


def test_a_cost_per_drafting_request_moves_a_middling_batch_to_plain():
    """The demo models at concurrency 8 (RESULTS.md): priced by rows and d alone, strides of
    2 looked 6% better than plain decoding at conditional acceptance 0.6, where the measured
    runs were slower; 0.4 ms per drafting request (what the steps' fit found) makes plain
    the choice there, keeps high acceptance drafting, and leaves one request drafting. (The
    entry margin is the stay margin here: what is weighed is e, not the margins.)"""
    rates = cumulative([0.6] * 3)
    config = AdaptiveConfig(strides=(1, 2, 3), enter_margin=0.05)

    def chosen(e: float, batch: int, rates=rates) -> list[int]:
        cost = StepCost(a=0.00676, b=0.000079, d=0.00166, e=e, pinned=True)
        return BatchPlanner(config, cost).best_strides([rates] * batch)[0]

    assert chosen(0.0, 8) == [2] * 8
    assert chosen(0.0004, 8) == [0] * 8
    assert chosen(0.0004, 8, cumulative([0.8] * 3)) == [3] * 8
    assert chosen(0.0004, 1) == [3]


def test_drafting_must_win_by_the_margin():
    """Eight requests at conditional acceptance 0.7 on a 4 ms step: strides of 1 are expected
    to beat plain decoding by 2% with the speculative path at 1 ms, by 10% at 0.5 ms, by about
    19% at 0. A new policy's last plan is plain, so the entry margin (15%) decides: it drafts
    the third only; with both margins 0 it drafts all three."""
    rates = [cumulative([0.7] * 3)] * 8

    def chosen(d: float, **margin) -> list[int]:
        cost = StepCost(a=0.004, b=0.0001, d=d, pinned=True)
        return BatchPlanner(AdaptiveConfig(strides=(1, 2, 3), **margin), cost).best_strides(rates)[
            0
        ]

    none = {"plain_margin": 0.0, "enter_margin": 0.0}
    assert chosen(0.001) == chosen(0.0005) == [0] * 8
    assert chosen(0.0) == [1] * 8
    assert chosen(0.001, **none) == chosen(0.0005, **none) == [1] * 8
    with pytest.raises(ValueError, match="plain_margin"):
        AdaptiveConfig(strides=(1,), plain_margin=1.0)


def test_a_plain_batch_must_win_by_the_entry_margin_to_draft():
    """The same eight requests: a batch whose last plan was plain does not draft for the 10%
    its plan expects at d = 0.5 ms; at d = 0 (about 19% ahead) it drafts, and then it keeps
    drafting at 10%, where only `plain_margin` (5%) applies; at 2% it stops, and 10% no longer
    brings it back."""
    rates = [cumulative([0.7] * 3)] * 8
    cost = StepCost(a=0.004, b=0.0001, d=0.0005, pinned=True)
    entering = BatchPlanner(AdaptiveConfig(strides=(1, 2, 3)), cost)
    plans = []
    for d in (0.0005, 0.0, 0.0005, 0.001, 0.0005):
        cost.d = d
        plans.append(entering.best_strides(rates)[0])
    assert plans == [[0] * 8, [1] * 8, [1] * 8, [0] * 8, [0] * 8]
    with pytest.raises(ValueError, match="enter_margin"):
        AdaptiveConfig(strides=(1,), enter_margin=-0.1)


def test_the_batchs_tables_at_once_are_the_per_request_formulas():
    """`forward_tables` (what `choose` prices a whole batch with) gives, for every request and
    every choice of k, what `tokens_per_forward` and `rows_per_forward` give one at a time."""
    conditional = np.random.default_rng(0).uniform(0.0, 1.0, size=(37, 4))
    conditional[0], conditional[1] = 1.0, 0.0  # the ends: always warm, every step cold
    rates = [cumulative(row) for row in conditional.tolist()]
    choices = (0, 1, 2, 4)
    tokens, rows = forward_tables(np.array(rates), choices)
    assert tokens.shape == rows.shape == (37, 4)
    for i, r in enumerate(rates):
        assert tokens[i].tolist() == pytest.approx([tokens_per_forward(r, k) for k in choices])
        assert rows[i].tolist() == pytest.approx([rows_per_forward(r, k) for k in choices])
    assert [t.shape for t in forward_tables(np.zeros((0, 4)), choices)] == [(0, 4), (0, 4)]
    list_tokens, list_rows = forward_lists(rates, choices)  # small batches' tables
    assert np.array(list_tokens) == pytest.approx(tokens, rel=1e-12)
    assert np.array(list_rows) == pytest.approx(rows, rel=1e-12)


def test_small_batches_are_planned_on_lists_as_on_arrays():
    """The plan of a batch of up to `SMALL_BATCH` requests is made on Python lists: the same
    strides and goodput as the numpy iteration gives the same batch, over random estimates
    and step costs (the bend, drafting requests' and MASK slots' costs included), and both
    margins."""
    rng = np.random.default_rng(1)
    config = AdaptiveConfig(strides=(1, 2, 3))
    agreed, drafted, mixed = 0, 0, 0
    for trial in range(400):
        n = int(rng.integers(1, SMALL_BATCH + 1))
        conditional = rng.uniform(0.05, 0.99, size=(n, 3))
        rates = [cumulative(row) for row in conditional.tolist()]
        cost = StepCost(
            a=float(rng.uniform(1e-3, 1e-2)),
            b=float(rng.uniform(1e-5, 1e-3)),
            d=float(rng.uniform(0, 1e-3)),
            e=float(rng.uniform(0, 5e-4)),
            m=float(rng.uniform(0, 1e-4)),
            shape=[(1, 3e-4), (2, 1e-4), (4, -2e-4), (8, 0.0), (32, 1e-4)] if trial % 2 else [],
        )
        plans = []
        for path in ("lists", "arrays"):
            planner = BatchPlanner(config, cost)
            planner.drafts = bool(trial % 3)  # which margin applies
            tokens, rows = forward_tables(np.array(rates), config.choices)
            if path == "lists":
                picks = planner._iterate_lists(tokens.tolist(), rows.tolist())
            else:
                picks = planner._iterate_arrays(tokens, rows)
            plans.append(planner._settle(n, *picks, rows.tolist()) + (planner.row_cost,))
        (strides, goodput, row_cost), (want_strides, want_goodput, want_row_cost) = plans
        assert strides == want_strides, (trial, conditional, cost)
        assert goodput == pytest.approx(want_goodput, rel=1e-12)
        assert row_cost == pytest.approx(want_row_cost, rel=1e-9, abs=1e-15)
        agreed += 1
        drafted += any(strides)
        mixed += len(set(strides)) > 1
    # The trials reach plain plans, drafting plans and plans that mix strides.
    assert agreed == 400 and 40 < drafted < 360 and mixed > 20, (drafted, mixed)
    small = BatchPlanner(config, StepCost(a=0.004, b=5e-5, d=2e-4))
    rates = [cumulative([0.7] * 3)] * 3
    assert small.best_strides(rates) == small.best(*forward_lists(rates, config.choices))


def test_memory_bound_steps_draft_the_most_compute_bound_steps_decode_plainly():
    rates = [cumulative([0.8] * 3)] * 16
    assert planner(a=0.050, b=0.00001).best_strides(rates)[0] == [3] * 16
    assert planner(a=0.0001, b=0.001).best_strides(rates)[0] == [0] * 16


def test_the_speculative_paths_fixed_cost_must_be_earned():
    """Low acceptance at low load: drafting barely pays, and a fixed cost of the
    speculative path (d) tips the batch to plain decoding (margins 0: what is weighed is d)."""
    rates = [cumulative([0.3] * 3)] * 4
    none = {"plain_margin": 0.0, "enter_margin": 0.0}
    assert planner(a=0.01, b=0.0001, d=0.0, **none).best_strides(rates)[0] != [0] * 4
    assert planner(a=0.01, b=0.0001, d=0.01, **none).best_strides(rates)[0] == [0] * 4
