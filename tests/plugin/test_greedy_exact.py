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
    ("num_drafts", "max_num_seqs", "spec"),
    [
        (1, 64, {"adaptive": False}),
        (2, 7, {"adaptive": False}),
        (3, 1, {"adaptive": False}),
        (3, 64, {"adaptive": False, "lookup": False}),
        (3, 64, {"adaptive": False, "lookup": {"min_ngram": 1, "max_ngram": 3}}),
        (4, 1, {"adaptive": {"step_ms": 1, "row_ms": 0.1, "probe_every": 2}}),
        (4, 64, {"adaptive": {"step_ms": 40, "row_ms": 0.5, "probe_every": 2}}),
        (4, 16, {}),
    ],
    ids=[
        "K1-batch64",
        "K2-batch7",
        "K3-batch1",
        "K3-batch64-no-lookup",
        "K3-batch64-eager-lookup",
        "adaptive-batch1",
        "adaptive-batch64",
        "default-adaptive-measured-batch16",
    ],
)
def test_greedy_isd_equals_plain_greedy_on_64_heldout_prompts(
    num_drafts,
    max_num_seqs,
    spec,
    demo_models,
    heldout_prompts,
    plain_outputs,
    llm_factory,
    generate,
):
    """Drafts from MASK rows and from a lookup in the request's own text (on by default; an
    eager one matching single tokens; none), at fixed K or with the stride policy choosing K
    per step (pinned step costs under which probes vary it on any machine; the default, on
    the step times this machine measures at start): the output must be plain decoding's."""
    assert len(heldout_prompts) >= 64
    with llm_factory(demo_models["idlm"], num_drafts, spec, max_num_seqs=max_num_seqs) as llm:
        if not spec:  # the step times are measured as the engine starts, not on a request
            (state,) = llm.collective_rpc("idlm_state")
            assert state["num_steps"] == 0 and state["calibration_s"] is not None, state
            times = state["step_times"]
            assert not times["pinned"] and times["sizes"][:2] == [1, 2], times
            assert len(times["table_ms"][0]) == len(times["ks"]) >= 2, times
        isd_outputs = generate(llm, heldout_prompts, GREEDY)
        (state,) = llm.collective_rpc("idlm_state")
        if isinstance(spec.get("adaptive"), dict):
            chosen = state["ks_chosen"]
            assert len(chosen) >= 2, f"the policy never changed stride: {chosen}"
        elif not spec:
            assert sum(state["ks_chosen"].values()) > 0 and state["step_times"]["offsets_ms"]
        sources = state["sources"]
        if spec.get("lookup") is False:
            assert sources["lookup_drafts"] == 0 and sources["mask_drafts"] > 0, sources
        elif spec.get("adaptive") is False:
            assert sources["lookup_drafts"] > 0 and sources["mask_drafts"] > 0, sources
    mismatches = [
        i for i, (a, b) in enumerate(zip(plain_outputs, isd_outputs, strict=True)) if a != b
    ]
    assert not mismatches, f"{len(mismatches)}/64 prompts differ, first: {mismatches[:5]}"


def test_slot_free_steps_take_vllms_plain_path_seeded_or_not(
    demo_models, heldout_prompts, plain_outputs, llm_factory, generate
):
    """An engine whose pinned cost never lets a request draft (and that never probes): every
    step is slot-free and runs vLLM's plain branch (no speculative metadata, vLLM's sampler),
    greedy, random and seeded random alike; greedy emits plain decoding's tokens, a seed
    repeats its tokens. (That a seeded request draws what plain decoding draws also on ISD
    steps is `test_a_seeded_request_draws_plain_decodings_tokens_beside_drafting_requests`.)"""
    never = {"adaptive": {"step_ms": 1e-3, "row_ms": 1e3, "probe_every": 0}}
    with llm_factory(demo_models["idlm"], 3, never, max_num_seqs=16) as llm:
        isd_outputs = generate(llm, heldout_prompts[:16], GREEDY)
        (state,) = llm.collective_rpc("idlm_state")
        assert state["num_steps"] == 0 and set(map(int, state["ks_chosen"])) == {0}, state
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


def test_a_probe_gets_its_extra_position_verified(
    demo_models, heldout_prompts, plain_outputs, llm_factory, generate
):
    """One request holding k = 1 (7% ahead of plain decoding at the prior under this pinned
    cost, taken with no margin, and held: the dwell is beyond its length) probes k = 2 every
    other step (the interval stretching while they change nothing); the step
    after a probe verifies both drafts the probe's MASK rows made (not only the one its stride
    asks for), so the second position gets verdicts though the request never drafts two on
    its own. The tokens stay plain decoding's."""
    hold_one = {
        "adaptive": {
            "step_ms": 10,
            "row_ms": 2,
            "margin": 0,
            "min_dwell": 1 << 20,
            "probe_every": 2,
        },
        "lookup": False,
    }
    with llm_factory(demo_models["idlm"], 2, hold_one, max_num_seqs=1) as llm:
        (isd_output,) = generate(llm, heldout_prompts[:1], GREEDY)
        (state,) = llm.collective_rpc("idlm_state")
    chosen = {int(k): n for k, n in state["ks_chosen"].items()}
    assert set(chosen) == {1, 2} and chosen[2] >= 3, chosen  # held k = 1, probes at 2
    assert state["observed_positions"][1] > 0, state  # position 2 observed by the probes
    assert isd_output == plain_outputs[0]
