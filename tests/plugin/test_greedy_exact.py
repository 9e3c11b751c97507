"""Greedy ISD through vLLM emits exactly the tokens of plain greedy decoding."""

from __future__ import annotations

import pytest
from vllm import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)


@pytest.fixture(scope="module")
def plain_outputs(demo_models, heldout_prompts, llm_factory, generate):
    with llm_factory(demo_models["idlm"]) as llm:
        return generate(llm, heldout_prompts, GREEDY)


@pytest.mark.parametrize(
    ("num_drafts", "max_num_seqs", "adaptive"),
    [
        (1, 64, False),
        (2, 7, False),
        (3, 1, False),
        (3, 64, False),
        (4, 1, {"step_ms": 1, "row_ms": 0.1}),
        (4, 64, {"step_ms": 40, "row_ms": 0.1}),
        (4, 16, None),
        (3, 8, {"self_check": True, "check_window": 4, "check_hold": 8}),
        (3, 4, {"plain_probe_every": 3, "plain_margin": 0, "enter_margin": 0}),
    ],
    ids=[
        "K1-batch64",
        "K2-batch7",
        "K3-batch1",
        "K3-batch64",
        "adaptive-batch1",
        "adaptive-batch64",
        "default-adaptive-measured-batch16",
        "adaptive-self-check-batch8",
        "measured-plain-probes-batch4",
    ],
)
def test_greedy_isd_equals_plain_greedy_on_64_heldout_prompts(
    num_drafts,
    max_num_seqs,
    adaptive,
    demo_models,
    heldout_prompts,
    plain_outputs,
    llm_factory,
    generate,
    doubt_start,
    monkeypatch,
):
    """With the adaptive policy on, strides change per request and per step (0..K drafts,
    verify-only steps after a probe): the output must not. Its step cost is pinned so that
    the strides vary on any machine (measured here, K = 0..2 at batch 1, 0..3 at 64).
    `None` is the default config: adaptive, with the step cost this machine measures; the
    self-check case switches between the policy's strides and plain decoding every few steps;
    the plain-probe case, on the measured cost, holds a drafting batch plain every third step
    where the steps' time leaves what drafting costs in doubt, dropping the drafts in hand
    (every other step, each cold step's drafts would be dropped before any was verified).
    That doubt is set (`doubt_start`): left to the machine, it arises only where engine steps
    happen to cost more than the dummy steps timed at start (CI once measured none, and no
    probe came). At batch 4 the plan drafts often enough to be probed (382 plain steps here
    with probes every other step)."""
    assert len(heldout_prompts) >= 64
    extra = None if adaptive is None else {"adaptive": adaptive}
    probing = isinstance(adaptive, dict) and "plain_probe_every" in adaptive
    if probing:  # the engine takes a function over RPC (`doubt_start`)
        monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    with llm_factory(demo_models["idlm"], num_drafts, extra, max_num_seqs=max_num_seqs) as llm:
        if adaptive is None:  # the step cost is measured as the engine starts, not on a request
            (state,) = llm.collective_rpc("idlm_state")
            assert state["num_steps"] == 0 and state["calibration_s"] is not None, state
        if probing:
            doubt_start(llm)
        isd_outputs = generate(llm, heldout_prompts, GREEDY)
        if isinstance(adaptive, dict):
            (state,) = llm.collective_rpc("idlm_state")
            chosen = state["strides_chosen"]
            assert len(chosen) >= 2, f"the policy never changed stride: {chosen}"
            if adaptive.get("self_check"):  # short windows: verdicts, and switches, often
                check = state["self_check"]
                assert check["steps"] > 0 and sum(check["verdicts"].values()) >= 2, check
            if "plain_probe_every" in adaptive:  # steps held plain, drafts in hand dropped
                assert state["probes"]["plain_steps"] > 0, state["probes"]
                assert state["num_plain_steps"] > 0, state
        elif adaptive is None:  # on by default, with the cost model this machine measured
            from vllm_idlm.engine.proposer import PRIOR_COST

            (state,) = llm.collective_rpc("idlm_state")
            cost = state["step_cost"]
            assert (cost["a"], cost["b"]) != (PRIOR_COST.a, PRIOR_COST.b), "never calibrated"
            assert cost["d"] >= cost["d_floor"] >= 0.0, cost  # the fit kept d above its floor
            assert cost["e"] >= cost["e_floor"] >= 0.0, cost  # and e above its own
            bend_rows = [rows for rows, _ in state["step_cost_bend"]]  # small batches measured
            assert bend_rows[:4] == [1, 2, 3, 4], state["step_cost_bend"]
            assert sum(state["strides_chosen"].values()) > 0
    mismatches = [
        i for i, (a, b) in enumerate(zip(plain_outputs, isd_outputs, strict=True)) if a != b
    ]
    assert not mismatches, f"{len(mismatches)}/64 prompts differ, first: {mismatches[:5]}"


def test_slot_free_steps_take_vllms_plain_path_seeded_or_not(
    demo_models, heldout_prompts, plain_outputs, llm_factory, generate
):
    """An engine whose pinned cost never lets a request draft: every step is slot-free and
    runs vLLM's plain branch (no speculative metadata, vLLM's sampler), greedy, random and
    seeded random alike; greedy emits plain decoding's tokens, a seed repeats its tokens.
    (That a seeded request draws what plain decoding draws also on ISD steps is
    `test_a_seeded_request_draws_plain_decodings_tokens_beside_drafting_requests`.)"""
    never = {"adaptive": {"step_ms": 1e-3, "row_ms": 1e3, "probe_every": 1 << 30}}
    with llm_factory(demo_models["idlm"], 3, never, max_num_seqs=16) as llm:
        isd_outputs = generate(llm, heldout_prompts[:16], GREEDY)
        (state,) = llm.collective_rpc("idlm_state")
        assert state["num_steps"] == 0 and set(map(int, state["strides_chosen"])) == {0}, state
        assert state["num_plain_steps"] >= GREEDY.max_tokens, state
        plain_steps = state["num_plain_steps"]
        random = SamplingParams(temperature=0.8, max_tokens=8, ignore_eos=True)
        sampled = generate(llm, heldout_prompts[:4], random)
        assert all(len(out) == 8 for out in sampled)
        (state,) = llm.collective_rpc("idlm_state")
        assert state["num_plain_steps"] >= plain_steps + 7, state  # its decode steps, plainly
        assert sampled != plain_outputs[:4] and sampled != [o[:8] for o in plain_outputs[:4]]
        plain_steps, rows = state["num_plain_steps"], state["decode_rows"]
        seeded = SamplingParams(temperature=0.8, max_tokens=8, ignore_eos=True, seed=7)
        first = generate(llm, heldout_prompts[:4], seeded)
        (state,) = llm.collective_rpc("idlm_state")
        assert state["num_plain_steps"] >= plain_steps + 7, state  # seeded, plainly too
        assert state["decode_rows"]["spec_steps"] == rows["spec_steps"], state  # no slots
        assert generate(llm, heldout_prompts[:4], seeded) == first  # and reproducible
    assert isd_outputs == plain_outputs[:16]


@pytest.mark.parametrize("score_plain", [True, False], ids=["scored", "verified"])
def test_joint_probes_of_a_plain_batch_are_scored_on_plain_steps(
    score_plain, demo_models, heldout_prompts, plain_outputs, llm_factory, generate
):
    """A batch whose pinned cost never lets a request draft probes one position every other
    step, all its requests on the same step. Scored (the default), the step after a probe
    does not verify the probe's drafts: it stays on vLLM's plain path, every request emits
    one token, and the drafts are scored against those tokens, so only the probe steps
    carry slots while the policy still gets its verdicts. Verified (`score_plain` off), each
    probe costs a second speculative step. Greedy tokens are plain decoding's either way."""
    probing = {
        "step_ms": 1e-3,
        "row_ms": 1e3,
        "probe_every": 2,
        "max_probe_every": 2,
        "score_plain": score_plain,
    }
    with llm_factory(demo_models["idlm"], 3, {"adaptive": probing}, max_num_seqs=16) as llm:
        isd_outputs = generate(llm, heldout_prompts[:16], GREEDY)
        (state,) = llm.collective_rpc("idlm_state")
    probe_steps, spec_steps = state["probes"]["steps"], state["decode_rows"]["spec_steps"]
    assert probe_steps >= GREEDY.max_tokens // 4, state["probes"]
    assert state["observed_positions"][0] > 0, state  # the probes' position has verdicts
    assert state["scoring_drafts"] == 0, state  # nothing left behind by finished requests
    # At the end, vLLM trims the draft slots of a request that has no room left under
    # max_tokens: the last probe's own MASK slots (then neither it nor a verify step runs)
    # and the verify step of the one before it. How many of those the batch's last steps
    # hit depends on how far apart its requests finish (they reach the engine process over
    # its first steps), so up to one probe step and two verify steps may be missing.
    if score_plain:
        assert probe_steps - 1 <= spec_steps <= probe_steps, state
        assert state["num_scored"] >= probe_steps - 1, state  # 16 requests scored per probe
    else:
        assert spec_steps >= 2 * probe_steps - 3, state  # the verify step after each probe
        assert state["num_scored"] == 0, state
    assert isd_outputs == plain_outputs[:16]


def test_a_drafting_requests_probe_gets_its_extra_position_verified(
    demo_models, heldout_prompts, plain_outputs, llm_factory, generate
):
    """A request holding k = 1 probes k = 2 every other step; the step after a probe verifies
    both drafts the probe's MASK rows made (not only the one its stride asks for), so the
    second position gets verdicts though the request never drafts two on its own. One
    request, `min_dwell` beyond its length: it keeps the k it started with (k = 1 under
    this pinned cost and the prior), so every k = 2 is a probe. Its estimates stay at the
    prior (`ema` near 0, no `relax`): with them learnt, a demo model that drafts this prompt
    poorly turns the plan plain part-way (seen with one retrained model: 9 of 39
    request-steps at k = 0), and the test would ask about the model instead of the probes.
    The tokens stay plain decoding's."""
    hold_one = {
        "adaptive": {
            "step_ms": 10,
            "row_ms": 2,
            "prior": 0.6,
            "min_dwell": 1 << 20,
            "probe_every": 2,
            "max_probe_every": 2,
            "enter_margin": 0,  # k = 1 is 11% ahead of plain decoding here
            "ema": 1e-6,  # verdicts barely move the estimates: they stay at the prior
            "relax": 0,
        }
    }
    with llm_factory(demo_models["idlm"], 2, hold_one, max_num_seqs=1) as llm:
        (isd_output,) = generate(llm, heldout_prompts[:1], GREEDY)
        (state,) = llm.collective_rpc("idlm_state")
    chosen = {int(k): n for k, n in state["strides_chosen"].items()}
    assert set(chosen) == {1, 2} and chosen[2] >= 5, chosen  # held k = 1, probes at 2
    assert state["observed_positions"][1] > 0, state  # position 2 observed by the probes
    assert isd_output == plain_outputs[0]
