"""vLLM's spec-decode counters under ISD count real drafts and rounds, nothing else.

The expected values come from the engine-free reference decoder (HF model, same
verifier) replaying the same greedy run: vLLM's prefill emits token 1, then every
round (cold start or verify) is one forward of the reference loop started after it.
"""

from __future__ import annotations

import json

import pytest
import torch
from vllm import SamplingParams

from vllm_idlm.metrics import read_isd_metrics

MAX_TOKENS = 40
NUM_PROMPTS = 12


@pytest.fixture(scope="module", params=[2, 3], ids=["K2", "K3"])
def isd_run(request, demo_models, heldout_prompts, llm_factory, generate):
    k = request.param
    prompts = heldout_prompts[:NUM_PROMPTS]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    fixed = {"adaptive": False, "lookup": False}  # the reference decoder drafts from MASK rows
    with llm_factory(demo_models["idlm"], k, spec_extra=fixed) as llm:
        before = read_isd_metrics(llm.get_metrics())
        outputs = generate(llm, prompts, params)
        metrics = read_isd_metrics(llm.get_metrics()).minus(before)
    return k, prompts, outputs, metrics


@pytest.fixture(scope="module")
def hf_model(demo_models):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(demo_models["idlm"], dtype=torch.float32).eval()


def test_counters_equal_the_reference_decoders_replay(isd_run, hf_model, demo_models):
    from idlm_training.isd_reference import isd_generate

    k, prompts, outputs, metrics = isd_run
    mask = json.loads((demo_models["idlm"] / "config.json").read_text())["mask_token_id"]
    rounds = accepted = verify_rounds = 0
    per_pos = [0] * k
    for prompt, out in zip(prompts, outputs, strict=True):
        replay, stats = isd_generate(hf_model, prompt + out[:1], k + 1, MAX_TOKENS - 1, mask)
        assert replay == out[1:], "reference decoder and vLLM disagree on greedy output"
        rounds += stats.num_forwards
        accepted += sum(stats.depth_accepted)
        verify_rounds += stats.depth_tried[0] if stats.depth_tried else 0
        for d, a in enumerate(stats.depth_accepted):
            per_pos[d] += a
    assert metrics.num_positions == 2 * k - 1  # a lookup may draft past K
    assert metrics.num_rounds == rounds
    assert metrics.num_draft_tokens == k * verify_rounds  # MASK slots are not drafts
    assert metrics.num_accepted_tokens == accepted
    assert list(metrics.accepted_per_position) == per_pos + [0] * (k - 1)
    assert list(metrics.drafted_per_position) == [verify_rounds] * k + [0] * (k - 1)
    assert accepted > 0, "nothing accepted: the run says nothing about the counters"


def test_tokens_per_forward_is_mean_acceptance_length(isd_run):
    k, prompts, outputs, metrics = isd_run
    tokens_from_rounds = sum(len(o) - 1 for o in outputs)  # token 1 comes from prefill
    # Rounds may overshoot max_tokens by up to K tokens in their last round.
    produced = metrics.num_rounds + metrics.num_accepted_tokens
    assert tokens_from_rounds <= produced <= tokens_from_rounds + k * len(prompts)
    assert metrics.tokens_per_forward == pytest.approx(produced / metrics.num_rounds)
    assert 1.0 <= metrics.tokens_per_forward <= k + 1
    assert 0.0 < metrics.cold_start_share < 1.0
    assert metrics.cold_start_share == 1 - metrics.verify_rounds / metrics.num_rounds
    assert len(metrics.acceptance_per_position) == k  # positions never drafted left out


def test_drafts_per_source_add_up_to_vllms_counters(
    demo_models, heldout_prompts, llm_factory, generate
):
    """With the lookup on (single-token matches: it fires on most steps), ISD's counters per
    source, read as `read_isd_metrics` reads them from `LLM.get_metrics()`, split vLLM's
    draft and acceptance counters exactly, and the worker counted the same."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    extra = {"adaptive": False, "lookup": {"min_ngram": 1}}
    with llm_factory(demo_models["idlm"], 3, spec_extra=extra) as llm:
        generate(llm, heldout_prompts[:NUM_PROMPTS], params)
        metrics = read_isd_metrics(llm.get_metrics())
        (state,) = llm.collective_rpc("idlm_state")
    assert metrics.lookup_draft_tokens > 0 and metrics.mask_draft_tokens > 0, metrics
    assert metrics.lookup_draft_tokens + metrics.mask_draft_tokens == metrics.num_draft_tokens
    assert (
        metrics.lookup_accepted_tokens + metrics.mask_accepted_tokens == metrics.num_accepted_tokens
    )
    assert state["sources"]["lookup_drafts"] == metrics.lookup_draft_tokens, state["sources"]
