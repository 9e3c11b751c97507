"""At T > 0, ISD's output is distributed exactly as plain sampling of the same model.

Two-sample chi-square homogeneity tests on the marginal distribution of generated
tokens 3, 4 and 5 after fixed held-out prefixes (token 1 comes from prefill, where no draft
is verified). Drafts come from MASK rows and from a lookup (point masses) in the request's own
text and, the requests being unseeded, in the outputs of the samples that finished before it;
the third prefix repeats a snippet, after which the lookup fires on most steps (about 5 lookup
drafts per sample of 5 tokens, 40% accepted, on the demo I-DLM of 2026-12-07, own text only).
Each test rejects at p < 1e-4; 2 ISD modes (fixed K, adaptive) x 4 sampling variants x
3 positions x 3 prefixes = 72 tests, so the family-wise false-alarm rate is at most
72e-4 = 0.72% (Bonferroni), and the engines are seeded, so a given build either passes or
fails reproducibly. The
statistic's power is shown by `test_the_statistic_detects_a_temperature_change`.
"""

from __future__ import annotations

import pytest
from vllm import SamplingParams

NUM_SAMPLES = 1200
POSITIONS = (2, 3, 4)  # 0-based: generated tokens 3, 4, 5
ALPHA = 1e-4
# The stride policy (K = 0..3 per step; 4 asked, the demo I-DLM was trained for N = 2..4)
# against the same plain samples. Its step cost is pinned: measured on a busy machine, the policy
# may decode this tiny model plainly and verify almost nothing; pinned (a 10 ms step, 0.1 ms a
# query row), 16 requests at a time draft at K = 1 and probe K = 2, on every run alike.
ADAPTIVE = {"adaptive": {"step_ms": 10, "row_ms": 0.1, "probe_every": 4}}
VARIANTS = {
    "T1": dict(temperature=1.0),
    "T0.8-topk20": dict(temperature=0.8, top_k=20),
    "T1-topp0.9": dict(temperature=1.0, top_p=0.9),
    "T0.7-topk30-topp0.8": dict(temperature=0.7, top_k=30, top_p=0.8),
}


def sample(llm, as_prompts, prefix, params_kwargs, n=NUM_SAMPLES) -> list[list[int]]:
    params = SamplingParams(max_tokens=max(POSITIONS) + 1, ignore_eos=True, **params_kwargs)
    outputs = llm.generate(as_prompts([prefix] * n), params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


@pytest.fixture(scope="module")
def prefixes(heldout_prompts):
    return [heldout_prompts[3], heldout_prompts[17], heldout_prompts[39][:12] * 3]


@pytest.fixture(scope="module")
def samples(demo_models, prefixes, llm_factory, as_prompts):
    result = {}
    engines = (
        ("plain", None, None, 256),
        ("isd", 3, {"adaptive": False}, 256),
        ("adaptive", 4, ADAPTIVE, 16),
    )
    for mode, k, extra, max_num_seqs in engines:
        with llm_factory(demo_models["idlm"], k, extra, max_num_seqs=max_num_seqs) as llm:
            for name, kwargs in VARIANTS.items():
                for j, prefix in enumerate(prefixes):
                    result[mode, name, j] = sample(llm, as_prompts, prefix, kwargs)
            if mode == "plain":
                for j, prefix in enumerate(prefixes):
                    result["plain", "T1.6", j] = sample(
                        llm, as_prompts, prefix, {"temperature": 1.6}
                    )
            else:
                from vllm_idlm.metrics import read_isd_metrics

                result[f"{mode}-metrics"] = read_isd_metrics(llm.get_metrics())
            if mode == "adaptive":
                (state,) = llm.collective_rpc("idlm_state")
                result["adaptive-ks"] = state["ks_chosen"]
    return result


@pytest.mark.parametrize("mode", ["isd", "adaptive"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_isd_sampling_matches_plain_sampling_from_the_third_token_on(
    variant, mode, samples, prefixes, chi_square_p_value
):
    p_values = {}
    for j in range(len(prefixes)):
        plain, isd = samples["plain", variant, j], samples[mode, variant, j]
        for pos in POSITIONS:
            p_values[j, pos] = chi_square_p_value([s[pos] for s in plain], [s[pos] for s in isd])
    worst = min(p_values, key=p_values.get)
    assert p_values[worst] > ALPHA, (
        f"prefix {worst[0]}, token {worst[1] + 1}: p={p_values[worst]:.2e}"
    )


@pytest.mark.parametrize("mode", ["isd", "adaptive"])
def test_drafts_were_actually_verified_at_t_above_zero(samples, mode):
    """The test above only means something if drafts were accepted (and rejected)."""
    m = samples[f"{mode}-metrics"]
    assert m.num_draft_tokens > 1000
    assert 0.05 < m.num_accepted_tokens / m.num_draft_tokens < 0.98
    # Lookup drafts (point masses) among them, accepted and rejected: their rule is tested too.
    assert m.lookup_draft_tokens > 1000, m
    assert 0.05 < m.lookup_acceptance < 0.98, m
    if mode == "adaptive":
        drafting = {k: n for k, n in samples["adaptive-ks"].items() if k > 0}
        assert len(drafting) >= 2, f"one K only: {samples['adaptive-ks']}"


def test_the_statistic_detects_a_temperature_change(samples, prefixes, chi_square_p_value):
    """Power check: plain T=1 vs plain T=1.6 must be told apart by the same test."""
    p_min = min(
        chi_square_p_value(
            [s[pos] for s in samples["plain", "T1", j]],
            [s[pos] for s in samples["plain", "T1.6", j]],
        )
        for j in range(len(prefixes))
        for pos in POSITIONS
    )
    assert p_min < ALPHA


def test_the_mask_token_is_never_emitted(samples, demo_models):
    import json

    mask = json.loads((demo_models["idlm"] / "config.json").read_text())["mask_token_id"]
    for key, outs in samples.items():
        if not str(key).endswith(("-metrics", "-ks")):
            assert all(mask not in s for s in outs), key
