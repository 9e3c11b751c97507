"""The stride policy checked against plain decoding as measured (`vllm_idlm.self_check`)."""

from __future__ import annotations

import pytest

from vllm_idlm.adaptive import StridePolicy
from vllm_idlm.adaptive_config import AdaptiveConfig
from vllm_idlm.self_check import SelfCheck
from vllm_idlm.step_cost import StepCost


def memory_bound(**knobs) -> StridePolicy:
    """Steps whose extra rows cost nearly nothing, acceptance 0.8: the model drafts."""
    config = AdaptiveConfig(strides=(1, 2, 3), prior=0.8, **knobs)
    return StridePolicy(config, StepCost(a=0.050, b=0.00001))


def _run(p, req_ids, steps, model_step, plain_step, prompt_every=0):
    """Drive `p` for `steps` engine steps: each step's plan, then its measured tokens and
    seconds (`model_step(ks)` / `plain_step(ks)` -> (tokens, seconds), by whether any request
    drafted); returns the strides chosen per step."""
    from vllm_idlm.step_cost import StepRecord

    chosen = []
    for i in range(steps):
        ks = p.choose(req_ids)
        chosen.append(ks)
        tokens, seconds = (model_step if any(ks) else plain_step)(ks)
        prompt = 32 if prompt_every and i % prompt_every == 0 else 0
        step = StepRecord(0.0, len(ks) + sum(ks), any(ks), prompt, plan=p.planned, tokens=tokens)
        p.measured(step, seconds)
    return chosen


def _plain_share(chosen):
    return sum(not any(ks) for ks in chosen) / len(chosen)


def test_the_self_check_holds_plain_decoding_where_it_measures_faster():
    """The model believes drafting pays (memory-bound prices), the engine measures otherwise:
    after one window of each, plain decoding is held, longer at each verdict that repeats,
    and the probes keep looking further meanwhile."""
    p = memory_bound(probe_every=8, self_check=True, check_window=10, check_hold=40)
    ids = [f"r{i}" for i in range(8)]
    slow_drafting = (lambda ks: (8 + sum(ks) // 2, 0.030), lambda ks: (8, 0.010))
    chosen = _run(p, ids, 24, *slow_drafting)
    # The model's window (10 steps + 2 settling), then plain decoding's (a probe or two).
    assert all(any(ks) for ks in chosen[:12]) and sum(any(ks) for ks in chosen[12:]) <= 2
    assert p.check.verdicts == {"model": 0, "plain": 1}
    chosen = _run(p, ids, 400, *slow_drafting)
    assert p.check.verdicts["plain"] >= 3 and p.check.verdicts["model"] == 0
    assert p.check.bands[SelfCheck.band(8)].hold > 40  # the repeated verdict holds longer
    assert 0.8 < _plain_share(chosen) < 1.0  # model windows again, and probes


def test_the_self_check_keeps_the_model_where_drafting_measures_faster():
    p = memory_bound(self_check=True, check_window=10, check_hold=40)
    ids = ["r", "s"]
    chosen = _run(p, ids, 300, lambda ks: (2 + sum(ks), 0.010), lambda ks: (2, 0.010))
    assert p.check.verdicts["model"] >= 2 and p.check.verdicts["plain"] == 0
    assert _plain_share(chosen) < 0.2  # the plain windows, nothing else


def test_a_hold_of_the_model_ends_when_it_falls_behind_plain_decoding():
    """One window said the model was ahead; its hold, watched, says otherwise."""
    p = memory_bound(self_check=True, check_window=10, check_hold=1000)
    ids = ["r", "s"]
    fast = lambda ks: (2 + sum(ks), 0.010)  # noqa: E731
    plain = lambda ks: (2, 0.010)  # noqa: E731
    _run(p, ids, 24, fast, plain)
    assert p.check.verdicts == {"model": 1, "plain": 0}
    chosen = _run(p, ids, 30, lambda ks: (2, 0.020), plain)  # drafting turns slow
    assert p.check.verdicts == {"model": 1, "plain": 1}
    assert not any(any(ks) for ks in chosen[-15:])  # ended within a window, not at 1000


def test_the_self_check_counts_no_prefill_step_and_is_off_by_default_or_with_a_pinned_cost():
    p = memory_bound(self_check=True, check_window=10, check_hold=40)
    ids = ["r", "s"]
    # Every step carries prompt tokens: nothing is judged, the model runs.
    chosen = _run(p, ids, 100, lambda ks: (2, 0.030), lambda ks: (2, 0.010), prompt_every=1)
    assert p.check.verdicts == {"model": 0, "plain": 0} and _plain_share(chosen) < 0.2
    config = AdaptiveConfig(strides=(1, 2, 3), self_check=True)
    pinned = StridePolicy(config, StepCost(0.05, 1e-5, pinned=True))
    off = memory_bound()  # opt-in: off by default
    assert pinned.check is None and off.check is None
    for q in (pinned, off):
        assert all(any(ks) for ks in _run(q, ids, 60, lambda ks: (2, 0.03), lambda ks: (2, 0.01)))


@pytest.mark.parametrize(
    "knobs",
    [
        {"check_window": 0},
        {"check_hold": 2.5},
        {"check_margin": 1.0},
        {"self_check": "yes"},
        {"relax": 1.0},
        {"relax": -0.1},
    ],
)
def test_self_check_knobs_are_checked(knobs):
    with pytest.raises(ValueError, match="adaptive: "):
        AdaptiveConfig(strides=(1,), **knobs)
