"""Per-request sampling parameters behave under ISD as without speculation."""

from __future__ import annotations

import pytest
from vllm import SamplingParams
from vllm.sampling_params import StructuredOutputsParams


@pytest.fixture(scope="module")
def engines(demo_models, llm_factory):
    with llm_factory(demo_models["idlm"]) as plain, llm_factory(demo_models["idlm"], 3) as isd:
        yield plain, isd


def test_greedy_logprobs_equal_plain_logprobs(engines, heldout_prompts, as_prompts):
    params = SamplingParams(temperature=0, max_tokens=24, logprobs=3, ignore_eos=True)
    plain, isd = (
        e.generate(as_prompts(heldout_prompts[:4]), params, use_tqdm=False) for e in engines
    )
    for a, b in zip(plain, isd, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert len(b.outputs[0].logprobs) == 24
        for la, lb in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True):
            assert set(la) == set(lb)
            for token in la:
                assert lb[token].logprob == pytest.approx(la[token].logprob, abs=1e-4)


def test_n_samples_stop_strings_and_max_tokens(engines, demo_models):
    _, isd = engines
    out = isd.generate(
        ["def main():\n"],
        SamplingParams(n=3, temperature=1.0, max_tokens=20, seed=3),
        use_tqdm=False,
    )[0]
    assert len(out.outputs) == 3
    assert all(len(c.token_ids) <= 20 for c in out.outputs)
    stop = isd.generate(
        ["import os\nimport sys\n"],
        SamplingParams(temperature=0, max_tokens=64, stop=["\n"]),
        use_tqdm=False,
    )
    assert "\n" not in stop[0].outputs[0].text


def test_a_seeded_request_is_reproducible_whatever_else_is_batched(
    engines, heldout_prompts, as_prompts
):
    _, isd = engines
    params = SamplingParams(temperature=0.9, top_k=40, max_tokens=32, seed=1234, ignore_eos=True)
    alone = isd.generate(as_prompts(heldout_prompts[:1]), params, use_tqdm=False)
    others = SamplingParams(temperature=1.0, max_tokens=32, ignore_eos=True)
    mixed = isd.generate(as_prompts(heldout_prompts[:6]), [params] + [others] * 5, use_tqdm=False)
    assert alone[0].outputs[0].token_ids == mixed[0].outputs[0].token_ids


def test_a_seeded_request_draws_plain_decodings_tokens_beside_drafting_requests(
    engines, demo_models, llm_factory, heldout_prompts, as_prompts
):
    """Under the policy a seeded random request never drafts, and its token is drawn as vLLM
    draws it on a plain step: the same tokens as plain decoding with that seed, in a batch
    whose greedy requests draft (ISD steps) and in a batch of its own (slot-free steps,
    vLLM's plain path). Temperature, top-k / top-p, min-p, a logit bias and a repetition
    penalty (the processed rows must match too). Fails where ISD's own draws serve seeded
    rows: vLLM's CPU sampler draws one seed per row from the generator, ISD's a row of Exp(1)
    noise."""
    plain, _ = engines
    seeded = [
        SamplingParams(
            temperature=0.8,
            top_k=50 if i % 2 else 0,
            top_p=0.9 if i < 2 else 1.0,
            repetition_penalty=1.2 if i == 3 else 1.0,
            min_p=0.1 if i in (1, 3) else 0.0,
            logit_bias={16: 2.0, 82: -3.0} if i >= 2 else None,
            max_tokens=24,
            seed=100 + i,
            ignore_eos=True,
        )
        for i in range(4)
    ]
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = as_prompts(heldout_prompts[:8])
    expected = [o.outputs[0].token_ids for o in plain.generate(prompts[:4], seeded, use_tqdm=False)]
    drafting = {"adaptive": {"step_ms": 40, "row_ms": 0.02}}  # greedy requests draft
    with llm_factory(demo_models["idlm"], 3, drafting) as isd:
        mixed = isd.generate(prompts, seeded + [greedy] * 4, use_tqdm=False)
        (state,) = isd.collective_rpc("idlm_state")
        alone = isd.generate(prompts[:4], seeded, use_tqdm=False)
    assert state["decode_rows"]["draft_requests"] > 0, state  # ISD steps, drafts verified
    assert [o.outputs[0].token_ids for o in mixed[:4]] == expected
    assert [o.outputs[0].token_ids for o in alone] == expected


def test_structured_outputs_stay_valid(engines):
    _, isd = engines
    choice = SamplingParams(
        temperature=0.8,
        max_tokens=8,
        seed=0,
        structured_outputs=StructuredOutputsParams(choice=["True", "False"]),
    )
    regex = SamplingParams(
        temperature=0.8,
        max_tokens=12,
        seed=0,
        structured_outputs=StructuredOutputsParams(regex=r"[0-9]{3}-[a-z]{2}"),
    )
    outs = isd.generate(["x = ", "y = "], [choice, regex], use_tqdm=False)
    assert outs[0].outputs[0].text in ("True", "False")
    import re

    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", outs[1].outputs[0].text)


def test_uniform_query_len_pads_cold_starts_and_stays_exact(
    demo_models, heldout_prompts, llm_factory, generate
):
    """`uniform_query_len` (for full CUDA graphs) schedules 2K slots on cold starts too;
    the extra MASK rows are never used, so greedy output is unchanged."""
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    prompts = heldout_prompts[:16]
    with llm_factory(demo_models["idlm"]) as llm:
        expected = generate(llm, prompts, params)
    with llm_factory(demo_models["idlm"], 2, spec_extra={"uniform_query_len": True}) as llm:
        assert generate(llm, prompts, params) == expected
