"""The stride policy (vLLM-free): expected tokens, step times, the batch's stride, probes and
each request's draft source."""

from __future__ import annotations

import pytest

from vllm_idlm.policy import PolicyConfig, StepTimes, StridePolicy, band_of, tokens_per_forward


def policy(step_ms=10.0, row_ms=0.1, ks=(1, 2, 3), **keys) -> StridePolicy:
    config = PolicyConfig(ks=ks, step_ms=step_ms, row_ms=row_ms, **keys)
    return StridePolicy(config, StepTimes.linear(config.choices, step_ms / 1e3, row_ms / 1e3))


def test_tokens_per_forward_half_acceptance_at_k2_is_10_over_7_and_7_over_4_when_filled():
    """a = [.5, .5]: r = [.5, .25], S_2 = .75. Cold steps emit one token: 1 + .75 / 1.75;
    every cold step filled by a lookup: every step has drafts, 1 + .75."""
    assert tokens_per_forward([0.5, 0.5], 2) == pytest.approx(10 / 7)
    assert tokens_per_forward([0.5, 0.5], 2) == pytest.approx((2 + 0.75 - 0.25) / (2 - 0.25))
    assert tokens_per_forward([0.5, 0.5], 2, fill=1.0) == pytest.approx(1.75)
    assert tokens_per_forward([0.5, 0.5], 0) == 1.0
    assert tokens_per_forward([1.0, 1.0, 1.0], 3) == pytest.approx(4.0)


def test_pinned_step_times_are_a_line_in_query_rows_and_never_corrected():
    times = StepTimes.linear((0, 1, 3), 0.010, 0.001)
    assert times(1, 0) == pytest.approx(0.011)
    assert times(4, 1) == pytest.approx(0.010 + 4 * 3 * 0.001)
    assert times(64, 3) == pytest.approx(0.010 + 64 * 7 * 0.001)  # beyond the sizes: the line
    times.observe(4, 1, 1.0)
    assert times(4, 1) == pytest.approx(0.010 + 4 * 3 * 0.001)


def test_measured_step_times_interpolate_and_real_steps_add_what_the_engine_spends_around_them():
    """Table at 1 and 8 requests. A real step at 4 requests and k = 1 took 5 ms more than the
    table says: that cell costs 5 ms more, and so does k = 0 of the same band, not run yet (the
    least offset beside it); another band has none. k = 0 then run at 2 ms over the table
    keeps its own, and k = 1 its own."""
    times = StepTimes((0, 1), [1, 8], [[0.010, 0.012], [0.017, 0.040]])
    plain_at_4 = 0.010 + 3 / 7 * 0.007
    assert times(4, 0) == pytest.approx(plain_at_4)
    at_4 = times(4, 1)
    times.observe(4, 1, at_4 + 0.005)
    assert times(4, 1) == pytest.approx(at_4 + 0.005)
    assert times(4, 0) == pytest.approx(plain_at_4 + 0.005)
    assert times(8, 1) == pytest.approx(0.040)  # another band: nothing learnt there
    times.observe(4, 0, plain_at_4 + 0.002)
    assert times(4, 0) == pytest.approx(plain_at_4 + 0.002)
    assert times(4, 1) == pytest.approx(at_4 + 0.005)
    times.observe(4, 1, at_4 + 0.015)  # a moving average: one step moves it a tenth of the way
    assert times(4, 1) == pytest.approx(at_4 + 0.006)
    assert band_of(4) != band_of(8) and band_of(5) == band_of(6)


def test_a_lone_request_drafts_the_longest_stride_and_a_big_batch_decodes_plainly():
    """Rows cost 0.1 ms over a 10 ms step: one request's seven rows cost nothing to speak of;
    at 256 requests every row counts and the prior acceptance (0.6) does not pay for them."""
    lone = policy()
    assert lone.choose(["a"], 1) == 3
    busy = policy()
    ids = [f"r{i}" for i in range(256)]
    assert busy.choose(ids, 256) == 0


def test_a_new_stride_waits_for_the_dwell_and_must_beat_the_held_one_by_the_margin():
    """Plain steps 11 ms, stride 1 13 ms: at the prior (1.43 tokens per forward) stride 1 wins;
    once every draft is rejected plain decoding is ahead by 18%."""
    p = policy(row_ms=1.0, min_dwell=5, probe_every=0)
    assert p.choose(["a"], 1) == 1
    for _ in range(30):  # every draft rejected: drafting buys nothing, rows still cost
        p.observe("a", 1, 0)
    chosen = [p.choose(["a"], 1) for _ in range(6)]
    assert chosen[:4] == [1, 1, 1, 1] and chosen[-1] == 0, chosen  # held until the dwell ends
    assert p.switches == 2  # plain (as every engine starts) to 1, then back
    still = policy(row_ms=1.0, margin=0.3, probe_every=0, min_dwell=0)
    assert still.choose(["a"], 1) == 0  # 7% ahead of plain at the prior: not enough to start
    for _ in range(30):  # every first draft accepted: 2 tokens a forward, 69% ahead
        still.observe("a", 1, 1)
    assert still.choose(["a"], 1) == 1
    for _ in range(30):  # worse than plain decoding, but within the 30% margin
        still.observe("a", 1, 0)
    assert [still.choose(["a"], 1) for _ in range(5)] == [1] * 5


def test_probes_draft_one_position_more_and_back_off_while_they_change_nothing():
    p = policy(step_ms=1.0, row_ms=10.0, probe_every=4)  # rows dear: plain decoding
    chosen = [p.choose(["a", "b"], 2) for _ in range(60)]
    probes = [i + 1 for i, k in enumerate(chosen) if k]
    assert set(chosen) == {0, 1}
    assert probes[:4] == [4, 8, 16, 32], probes  # doubling: nothing changed after each
    never = policy(step_ms=1.0, row_ms=10.0, probe_every=0)
    assert {never.choose(["a"], 1) for _ in range(100)} == {0}


def test_verdicts_move_the_requests_estimates_and_new_requests_start_from_the_engines():
    p = policy()
    for _ in range(50):
        p.observe("a", 3, 3)  # every draft accepted
    first, second, third = p.requests["a"].conditional
    assert first > 0.99 and second > 0.99 and third > 0.99
    p.observe("a", 3, 1)  # the second rejected: the third not reached, not observed
    assert p.requests["a"].conditional[2] == third
    assert p.requests["a"].conditional[1] < second
    assert p.observed == [51, 51, 50]
    assert p._request("new").conditional == p.engine
    assert p.engine[0] > 0.6


def test_the_lookup_leads_where_its_first_token_was_right_more_often():
    p = policy()
    assert not p.prefers_lookup("a")  # a tie: the MASK rows' drafts
    for _ in range(5):
        p.score_sources("a", lookup_first=7, mask_first=8, emitted=7)
    assert p.prefers_lookup("a")
    for _ in range(10):
        p.score_sources("a", lookup_first=7, mask_first=8, emitted=8)
    assert not p.prefers_lookup("a")
    p.score_sources("b", lookup_first=None, mask_first=8, emitted=8)  # no lookup: MASK scored
    assert p.requests["b"].mask_first > p.requests["b"].lookup_first


def test_at_k_0_a_lookup_drafts_the_tokens_that_pay_for_their_rows():
    """Pinned 10 ms a step, 0.1 ms a query row, K up to 3 (6 extra rows a request): at one
    request a row costs 1% of the plain step, at 64 requests 0.1 * 64 / 16.4 = 39% of a
    request's share of it. A lookup right 30% of the time pays for three rows at one request
    (the first three all right: .3, .09, .027 > .0099; four: .0081), none at 64; one right
    half the time pays for one row at 64 (.5 > .39 > .25)."""
    p = policy()
    assert p.lookup_bar(1) == pytest.approx(0.1 / 10.1)
    assert p.lookup_bar(64) == pytest.approx(6.4 / 16.4)
    for _ in range(6):  # lookup_first .5 -> about .3
        p.score_sources("a", lookup_first=7, mask_first=None, emitted=8)
        p.score_sources("a", lookup_first=7, mask_first=None, emitted=7)
        p.score_sources("a", lookup_first=7, mask_first=None, emitted=8)
    assert 0.2 < p.requests["a"].lookup_first < 0.35
    p.requests["a"].lookup_first = 0.3
    assert p.lookup_length("a", p.lookup_bar(1), 5) == 3
    assert p.lookup_length("a", p.lookup_bar(1), 2) == 2
    assert p.lookup_length("a", p.lookup_bar(64), 5) == 0
    p.requests["a"].lookup_first = 0.5
    assert p.lookup_length("a", p.lookup_bar(64), 5) == 1


def test_cold_steps_a_lookup_fills_raise_the_expected_tokens():
    p = policy()
    dry = p.expected_tokens(["a"])
    for _ in range(20):
        p.observe_cold("a", filled=True)
    assert p.expected_tokens(["a"])[3] > dry[3] and p.expected_tokens(["a"])[0] == 1.0


def test_a_fixed_stride_is_kept_whatever_the_cost():
    config = PolicyConfig(ks=(1, 2, 3))
    fixed = StridePolicy(config, StepTimes.linear(config.choices, 1.0, 1.0), fixed=3)
    assert {fixed.choose([f"r{i}" for i in range(256)], 256) for _ in range(50)} == {3}
    assert not fixed.chosen


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"margin": 1.0}, "margin"),
        ({"min_dwell": 1.5}, "min_dwell"),
        ({"probe_every": -1}, "probe_every"),
        ({"step_ms": 5.0}, "both step_ms and row_ms"),
        ({"step_ms": 0.0, "row_ms": 1.0}, "must be > 0"),
    ],
)
def test_bad_policy_keys_are_refused_naming_the_key(keys, message):
    with pytest.raises(ValueError, match=message):
        PolicyConfig(ks=(1, 2), **keys)


def test_step_times_measured_at_start_are_made_monotone():
    """A cell above one with more requests or a longer stride was measured slow (load only adds
    time): it takes the larger cell's time."""
    from vllm_idlm.engine.calibration import monotone

    measured = [[10.6, 3.8, 4.0], [1.9, 2.6, 2.3], [2.4, 10.3, 2.9]]
    assert monotone(measured) == [[1.9, 2.3, 2.3], [1.9, 2.3, 2.3], [2.4, 2.9, 2.9]]


def test_a_stride_taken_on_a_guess_is_judged_again_after_its_first_timed_step():
    """Measured step times: plain steps of two requests timed at 2 ms over the table, stride 1
    never run, so it borrows that offset and looks 50% ahead; taken, its first real step costs
    20 ms more than the table, and the policy returns to plain at once, dwell or not. A stride
    whose cost was timed keeps the dwell."""
    config = PolicyConfig(ks=(1,), min_dwell=100, probe_every=0)
    times = StepTimes((0, 1), [1, 2], [[0.010, 0.011], [0.011, 0.012]])
    p = StridePolicy(config, times)
    times.observe(2, 0, 0.013)
    for _ in range(20):
        p.observe("a", 1, 1)
        p.observe("b", 1, 1)
    assert p.choose(["a", "b"], 2) == 1  # 2 tokens a forward each at 14 ms against 13
    times.observe(2, 1, 0.032)
    assert p.choose(["a", "b"], 2) == 0
    assert p.choose(["a", "b"], 2) == 0
    times.observe(2, 1, 0.012)  # even if stride 1 now looked cheap again: plain was timed
    times.offsets[(band_of(2), 1)] = 0.0
    assert p.choose(["a", "b"], 2) == 0
