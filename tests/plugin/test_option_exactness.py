"""Request options that reshape the next-token distribution, under ISD and lossless ISD with
drafts verified at a fixed K (so no request decodes plainly): greedy output with logit_bias
or allowed_token_ids is plain decoding's token for token, min_p sampling is distributed as
plain sampling with the same min_p, and logprobs of named ids (logprob_token_ids) are plain
decoding's.

Each prompt's options come from its own unbiased greedy output, so that each changes its
first token at least (`test_each_option_changes_plain_decodings_output`): a boost of the
runner-up first token past the first, a -100 ban of the first token, and an allowed set of
every token the model emitted for any prompt but that first token. All of them share one
batch, so a request's bias or mask reaching another request's rows would show. 16 prompts
of 48 tokens: a bias applied to each request's first row alone made 8 of the 32 biased
outputs differ from plain decoding's (where the first row rejects a draft, the token
emitted comes from that row, biased: such a bug shows only where a later row accepts one).

Chi-square: generated tokens 3, 4 and 5 (the first two come from prefill and a cold start,
where no draft is verified), 2 prefixes x 2 variants x 3 positions x 2 modes = 24 tests at
p < 1e-4 each: a family-wise false-alarm rate of at most 0.24% (Bonferroni), and seeded
engines, so a build passes or fails reproducibly. `test_the_statistic_detects_min_p` shows
that the test tells min_p from no min_p.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from vllm import SamplingParams

from vllm_idlm.metrics import read_isd_metrics

K = 3
NUM_TOKENS = 48
NUM_SAMPLES = 1200
POSITIONS = (2, 3, 4)  # 0-based: generated tokens 3, 4, 5
ALPHA = 1e-4
VARIANTS = {
    "T1-minp0.2": dict(temperature=1.0, min_p=0.2),
    # min_p comes before top-p (vLLM's order): it changes what top-p keeps.
    "T0.8-minp0.05-topp0.8": dict(temperature=0.8, min_p=0.05, top_p=0.8),
}
MODES = {"isd": "idlm", "lossless": "base"}  # ISD mode -> the checkpoint plain decoding serves
OPTIONS = ("free", "boost", "ban", "allowed")


def greedy(**options) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True, **options)


def options_for(free) -> list[dict[str, SamplingParams]]:
    """Per prompt, from its unbiased greedy output (with the top-2 logprobs)."""
    emitted = sorted({t for out in free for t in out.token_ids})
    options = []
    for out in free:
        first = out.token_ids[0]
        top = out.logprobs[0]
        runner_up = max((t for t in top if t != first), key=lambda t: top[t].logprob)
        gap = top[first].logprob - top[runner_up].logprob
        options.append(
            {
                "free": greedy(),
                "boost": greedy(logit_bias={runner_up: gap + 0.5}),
                "ban": greedy(logit_bias={first: -100.0}),
                "allowed": greedy(allowed_token_ids=[t for t in emitted if t != first]),
            }
        )
    return options


@dataclass
class Run:
    greedy: dict[str, list[list[int]]]  # option -> output of each prompt
    samples: dict[tuple[str, int], list[list[int]]]  # (variant, prefix) -> samples
    named: list  # CompletionOutputs with logprobs of named ids


def run(llm, as_prompts, prompts, prefixes, options) -> Run:
    batch = [(i, name) for i in range(len(prompts)) for name in OPTIONS]
    outs = llm.generate(
        as_prompts([prompts[i] for i, _ in batch]),
        [options[i][name] for i, name in batch],
        use_tqdm=False,
    )
    by_option = {name: [] for name in OPTIONS}
    for (_, name), out in zip(batch, outs, strict=True):
        by_option[name].append(list(out.outputs[0].token_ids))
    samples = {}
    for variant, kwargs in VARIANTS.items():
        params = SamplingParams(max_tokens=max(POSITIONS) + 1, ignore_eos=True, **kwargs)
        for j, prefix in enumerate(prefixes):
            outs = llm.generate(as_prompts([prefix] * NUM_SAMPLES), params, use_tqdm=False)
            samples[variant, j] = [list(o.outputs[0].token_ids) for o in outs]
    named = greedy(logprob_token_ids=options[0]["allowed"].allowed_token_ids[:3])
    named_outs = llm.generate(as_prompts(prompts[:4]), named, use_tqdm=False)
    return Run(by_option, samples, [o.outputs[0] for o in named_outs])


@pytest.fixture(scope="module")
def runs(demo_models, heldout_prompts, llm_factory, as_prompts):
    prompts = heldout_prompts[:16]
    prefixes = [heldout_prompts[3], heldout_prompts[17]]
    result = {}
    for mode, checkpoint in MODES.items():
        with llm_factory(demo_models[checkpoint]) as llm:
            free = llm.generate(as_prompts(prompts), greedy(logprobs=2), use_tqdm=False)
            options = options_for([o.outputs[0] for o in free])
            result["plain", mode] = run(llm, as_prompts, prompts, prefixes, options)
            if mode == "isd":  # for the power check: the same prefixes without min_p
                params = SamplingParams(max_tokens=max(POSITIONS) + 1, ignore_eos=True)
                result["no-min-p"] = [
                    [
                        list(o.outputs[0].token_ids)
                        for o in llm.generate(
                            as_prompts([prefix] * NUM_SAMPLES), params, use_tqdm=False
                        )
                    ]
                    for prefix in prefixes
                ]
        spec = {"adaptive": False}
        if mode == "lossless":
            spec["draft_lora"] = str(demo_models["lora"])
        with llm_factory(demo_models[checkpoint], K, spec) as llm:
            before = read_isd_metrics(llm.get_metrics())
            result[mode] = run(llm, as_prompts, prompts, prefixes, options)
            result[mode, "metrics"] = read_isd_metrics(llm.get_metrics()).minus(before)
        result[mode, "options"] = options
    return result


@pytest.mark.parametrize("mode", list(MODES))
def test_greedy_logit_bias_and_allowed_tokens_give_plain_decodings_tokens(runs, mode):
    expected, got = runs["plain", mode].greedy, runs[mode].greedy
    for name in OPTIONS:
        pairs = zip(expected[name], got[name], strict=True)
        differ = [i for i, (a, b) in enumerate(pairs) if a != b]
        assert not differ, f"{name}: prompts {differ} differ from plain decoding"


@pytest.mark.parametrize("mode", list(MODES))
def test_each_option_changes_plain_decodings_output(runs, mode):
    """The test above is only as strong as the options: each changes every first token."""
    outputs = runs["plain", mode].greedy
    for i, options in enumerate(runs[mode, "options"]):
        first = outputs["free"][i][0]
        (banned,) = options["ban"].logit_bias
        assert banned == first and first not in outputs["ban"][i]
        assert outputs["boost"][i][0] == next(iter(options["boost"].logit_bias))
        assert outputs["allowed"][i][0] != first
        assert set(outputs["allowed"][i]) <= set(options["allowed"].allowed_token_ids)


@pytest.mark.parametrize("mode", list(MODES))
def test_drafts_were_verified_and_both_accepted_and_rejected(runs, mode):
    m = runs[mode, "metrics"]
    assert m.num_draft_tokens > 1000
    assert 0.05 < m.num_accepted_tokens / m.num_draft_tokens < 0.98


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_min_p_sampling_matches_plain_sampling_with_the_same_min_p(
    runs, mode, variant, chi_square_p_value
):
    plain, isd = runs["plain", mode].samples, runs[mode].samples
    p_values = {
        (j, pos): chi_square_p_value(
            [s[pos] for s in plain[variant, j]], [s[pos] for s in isd[variant, j]]
        )
        for j in range(2)
        for pos in POSITIONS
    }
    worst = min(p_values, key=p_values.get)
    assert p_values[worst] > ALPHA, f"prefix {worst[0]}, token {worst[1] + 1}: {p_values[worst]}"


def test_the_statistic_detects_min_p(runs, chi_square_p_value):
    """Power check: plain T=1 with and without min_p 0.2 are told apart by the same test."""
    plain = runs["plain", "isd"].samples
    p_min = min(
        chi_square_p_value(
            [s[pos] for s in plain["T1-minp0.2", j]], [s[pos] for s in runs["no-min-p"][j]]
        )
        for j in range(2)
        for pos in POSITIONS
    )
    assert p_min < ALPHA


@pytest.mark.parametrize("mode", list(MODES))
def test_logprobs_of_named_ids_are_plain_decodings(runs, mode):
    """Regression: vLLM's rejection sampler reports the top ids where a request names its
    own (logprob_token_ids); the output then carried the first token's logprobs only."""
    for a, b in zip(runs["plain", mode].named, runs[mode].named, strict=True):
        assert a.token_ids == b.token_ids and len(b.logprobs) == len(b.token_ids) == NUM_TOKENS
        for la, lb in zip(a.logprobs, b.logprobs, strict=True):
            assert set(la) == set(lb)
            for token in la:
                assert lb[token].logprob == pytest.approx(la[token].logprob, abs=1e-4)
