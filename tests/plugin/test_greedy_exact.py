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
    ("num_drafts", "max_num_seqs"),
    [(1, 64), (2, 7), (3, 1), (3, 64)],
    ids=["K1-batch64", "K2-batch7", "K3-batch1", "K3-batch64"],
)
def test_greedy_isd_equals_plain_greedy_on_64_heldout_prompts(
    num_drafts, max_num_seqs, demo_models, heldout_prompts, plain_outputs, llm_factory, generate
):
    assert len(heldout_prompts) >= 64
    with llm_factory(demo_models["idlm"], num_drafts, max_num_seqs=max_num_seqs) as llm:
        isd_outputs = generate(llm, heldout_prompts, GREEDY)
    mismatches = [
        i for i, (a, b) in enumerate(zip(plain_outputs, isd_outputs, strict=True)) if a != b
    ]
    assert not mismatches, f"{len(mismatches)}/64 prompts differ, first: {mismatches[:5]}"
