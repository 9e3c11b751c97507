"""ISD under every vLLM scheduler feature that changes what a step carries.

For ISD on the I-DLM and lossless ISD (base + gated adapter) alike: prefix-cache hits of
every length modulo the block size (a hit leaving one token makes vLLM pad the new decode
with placeholder draft slots), preemption and resumption under a small KV cache, chunked
prefill, `max_tokens` / `max_model_len` reached inside a draft, stop strings and stop tokens
inside accepted drafts, `n > 1`, aborts between steps, one batch mixing every kind of
request. Each test checks that greedy output equals plain decoding token for token, that
seeded sampled output is reproducible, and that the engine is still serving afterwards.
"""

from __future__ import annotations

import re

import pytest
from vllm import SamplingParams
from vllm.sampling_params import StructuredOutputsParams

from vllm_idlm.metrics import read_isd_metrics

K = 3
BLOCK = 32  # the smallest CPU block size: every residue modulo it with short prompts
SHARED = dict(max_model_len=256, block_size=BLOCK, max_num_seqs=64)
# Small KV cache (preemption) and a small token budget (chunked prefill).
PRESSURE = dict(SHARED, num_gpu_blocks_override=32, max_num_batched_tokens=64, max_num_seqs=24)
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
# (checkpoint, gated adapter, speculative-config extras): fixed K = 3 (the lookup on, as by
# default); lossless; the stride policy with a pinned step cost under which the stride follows
# the batch (3 for one request, 1 for 16, 0 from about 40; probes every fourth step); and an
# eager lookup (single-token matches) at fixed K, so that lookup drafts and MASK-row drafts
# meet every feature in the same steps.
MODES = {
    "isd": ("idlm", None, {"adaptive": False}),
    "lossless": ("base", "lora", {"adaptive": False}),
    "adaptive": ("idlm", None, {"adaptive": {"step_ms": 10, "row_ms": 0.1, "probe_every": 4}}),
    "eager-lookup": ("idlm", None, {"adaptive": False, "lookup": {"min_ngram": 1}}),
}


def token_stream(heldout_prompts) -> list[int]:
    return [t for p in heldout_prompts for t in p]


def prompts_of_lengths(heldout_prompts, lengths) -> list[list[int]]:
    """Held-out text cut to the given lengths, each from a different offset."""
    stream = token_stream(heldout_prompts)
    return [stream[(97 * i) % 512 : (97 * i) % 512 + n] for i, n in enumerate(lengths)]


def counter(llm, name: str) -> float:
    return sum(getattr(m, "value", 0) for m in llm.get_metrics() if m.name == name)


def settled_state(llm, prompt) -> dict:
    """The worker's ISD state once vLLM has told it which requests finished: it learns that
    with the next step's scheduler output, so one more (greedy, one-token) request runs."""
    llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=1), use_tqdm=False)
    (state,) = llm.collective_rpc("idlm_state")
    return state


@pytest.fixture(scope="module", params=list(MODES))
def mode(request, demo_models):
    model, adapter, extras = MODES[request.param]
    spec = dict(extras)
    if adapter:
        spec["draft_lora"] = str(demo_models[adapter])
    return request.param, demo_models[model], spec


@pytest.fixture(scope="module")
def plain(mode, llm_factory):
    _, model, _ = mode
    with llm_factory(model, **SHARED) as llm:
        yield llm


@pytest.fixture(scope="module")
def isd(mode, llm_factory):
    _, model, spec = mode
    with llm_factory(model, K, spec_extra=spec, **SHARED) as llm:
        yield llm


@pytest.fixture(scope="module")
def pressured(mode, llm_factory):
    """In-process engine core: under a token budget and a small KV cache a request's steps
    (trimmed slots, preemptions) depend on which requests share them, and a separate engine
    process starts scheduling while requests are still arriving. In-process, every batch
    arrives whole, so a seeded run can be replayed step for step."""
    _, model, spec = mode
    with pytest.MonkeyPatch.context() as env:
        env.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        with llm_factory(model, K, spec_extra=spec, **PRESSURE) as llm:
            yield llm


def replay(llm, run):
    """`run()` twice from the same engine state (an empty prefix cache): seeded ISD output is
    reproducible for the same sequence of steps, and a cache hit changes the steps (fewer
    prefill rows, placeholder slots), not the distribution."""
    results = []
    for _ in range(2):
        assert llm.reset_prefix_cache()
        results.append(run())
    return results


def assert_alive(llm, prompt, generate) -> None:
    assert len(generate(llm, [prompt], GREEDY)[0]) == GREEDY.max_tokens


def test_prefix_cache_hits_of_every_length_modulo_the_block_size(
    plain, isd, heldout_prompts, generate
):
    """Prompts of 2 * 32 + r tokens for every r, plus 1 + k * 32, each sent twice: the
    second send hits the prefix cache; a hit leaving one token to compute gets a new
    decode padded with -1 placeholder slots (which used to kill the engine)."""
    lengths = [2 * BLOCK + r for r in range(BLOCK)] + [1 + BLOCK, 1 + 3 * BLOCK, 4 * BLOCK]
    prompts = prompts_of_lengths(heldout_prompts, lengths)
    expected = generate(plain, prompts, GREEDY)
    hits_before = counter(isd, "vllm:prefix_cache_hits")
    first = generate(isd, prompts, GREEDY)
    second = generate(isd, prompts, GREEDY)
    one_by_one = [generate(isd, [p], GREEDY)[0] for p in prompts[-4:]]
    assert counter(isd, "vllm:prefix_cache_hits") - hits_before >= sum(lengths) // 2
    assert first == expected
    assert second == expected
    assert one_by_one == expected[-4:]


def test_seeded_sampling_with_prefix_cache_hits_is_reproducible(isd, heldout_prompts, generate):
    prompts = prompts_of_lengths(heldout_prompts, [1 + BLOCK, 1 + 2 * BLOCK, 40])
    params = [
        SamplingParams(temperature=1.0, seed=11 + i, max_tokens=24, ignore_eos=True)
        for i in range(len(prompts))
    ]

    first, second = replay(
        isd, lambda: (generate(isd, prompts, params), generate(isd, prompts, params))
    )
    assert all(len(out) == 24 for run in (*first, *second) for out in run)
    assert first == second


def test_sampling_after_a_one_token_prefix_hit_is_the_models_distribution(
    plain, isd, heldout_prompts, as_prompts, chi_square_p_value
):
    """Every ISD request here reuses the cached prompt and decodes its first step from
    placeholder slots; tokens 2-4 are compared with plain sampling (seeded chi-square,
    3 tests at p < 1e-4)."""
    prompt = prompts_of_lengths(heldout_prompts, [1 + 2 * BLOCK])[0]
    params = SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True)
    samples = {}
    for name, llm in (("plain", plain), ("isd", isd)):
        llm.generate(as_prompts([prompt]), params, use_tqdm=False)  # fill the cache
        outs = llm.generate(as_prompts([prompt] * 800), params, use_tqdm=False)
        samples[name] = [list(o.outputs[0].token_ids) for o in outs]
    for pos in (1, 2, 3):
        p = chi_square_p_value([s[pos] for s in samples["plain"]], [s[pos] for s in samples["isd"]])
        assert p > 1e-4, f"token {pos + 1}: p={p:.2e}"


def test_max_tokens_reached_inside_a_draft(plain, isd, heldout_prompts, generate):
    prompts = heldout_prompts[:16]
    params = [
        SamplingParams(temperature=0, max_tokens=1 + i % (2 * K + 2), ignore_eos=True)
        for i in range(len(prompts))
    ]
    expected = generate(plain, prompts, params)
    got = generate(isd, prompts, params)
    assert got == expected
    assert [len(g) for g in got] == [p.max_tokens for p in params]


def test_max_model_len_reached_inside_a_draft(plain, isd, heldout_prompts, generate):
    """16 prompts of 230-245 tokens with max_model_len 256, at once: the scheduler trims
    the slots of requests close to the limit (this used to kill the engine)."""
    prompts = prompts_of_lengths(heldout_prompts, [230 + i for i in range(16)])
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    expected = generate(plain, prompts, params)
    got = generate(isd, prompts, params)
    assert got == expected
    assert [len(g) for g in got] == [256 - len(p) for p in prompts]
    assert_alive(isd, heldout_prompts[0], generate)


def test_stop_tokens_and_stop_strings_inside_accepted_drafts(plain, isd, heldout_prompts):
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=p) for p in heldout_prompts[:12]]
    base = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    reference = plain.generate(prompts, base, use_tqdm=False)
    params = []
    for i, out in enumerate(reference):
        ids, text = out.outputs[0].token_ids, out.outputs[0].text
        if i % 2:
            params.append(SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[ids[9]]))
        else:
            stop = text[len(text) // 3 : len(text) // 3 + 3]
            params.append(SamplingParams(temperature=0, max_tokens=40, stop=[stop]))
    natural_eos = SamplingParams(temperature=0, max_tokens=64)
    expected = plain.generate(prompts + prompts, params + [natural_eos] * 12, use_tqdm=False)
    got = isd.generate(prompts + prompts, params + [natural_eos] * 12, use_tqdm=False)
    for e, g in zip(expected, got, strict=True):
        assert g.outputs[0].token_ids == e.outputs[0].token_ids
        assert g.outputs[0].text == e.outputs[0].text
        assert g.outputs[0].finish_reason == e.outputs[0].finish_reason
        assert g.outputs[0].stop_reason == e.outputs[0].stop_reason
    assert sum(e.outputs[0].finish_reason == "stop" for e in expected[:12]) == 12


def test_n_samples_are_complete_and_seeded_ones_reproducible(isd, heldout_prompts, as_prompts):
    """vLLM forks n requests from one prompt (they share its cached prefix)."""
    prompts = as_prompts(heldout_prompts[:3])
    sampled = SamplingParams(n=4, temperature=0.8, seed=5, max_tokens=16, ignore_eos=True)
    runs = replay(isd, lambda: isd.generate(prompts, sampled, use_tqdm=False))
    ids = [[[c.token_ids for c in o.outputs] for o in run] for run in runs]
    assert ids[0] == ids[1]
    assert all(len(o) == 4 and all(len(c) == 16 for c in o) for o in ids[0])
    assert all(len({tuple(c) for c in o}) > 1 for o in ids[0])  # n distinct samples


def test_aborts_between_steps_leave_the_rest_exact_and_no_state_behind(
    plain, isd, heldout_prompts, generate
):
    from vllm.inputs import TokensPrompt

    engine = isd.llm_engine
    prompts = heldout_prompts[:8]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    sampled = SamplingParams(temperature=1.0, max_tokens=40, ignore_eos=True)
    expected = generate(plain, prompts, params)
    for i, p in enumerate(prompts):
        engine.add_request(f"keep-{i}", TokensPrompt(prompt_token_ids=p), params)
        engine.add_request(f"drop-{i}", TokensPrompt(prompt_token_ids=p), sampled)
    done: dict[str, list[int]] = {}
    steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
        steps += 1
        if steps in (2, 3, 5):  # abort a few sampled requests between steps
            engine.abort_request([f"drop-{i}" for i in range(steps - 2, 8, 3)])
    assert [done[f"keep-{i}"] for i in range(8)] == expected
    assert sum(r.startswith("drop") for r in done) < 8
    state = settled_state(isd, prompts[0])
    assert state["pending_drafts"] == 0
    # The drafts proposed, the lookup's offer and the policy's estimates: at most the settling
    # request's own (its end reaches the worker with the next step; its lookup may match the
    # outputs before it).
    assert state["proposed_drafts"] <= 1 and state["offered_drafts"] <= 1
    assert state["tracked_requests"] <= 1
    assert state["num_steps"] > 0
    assert_alive(isd, heldout_prompts[0], generate)


def test_one_batch_mixing_every_kind_of_request(plain, isd, heldout_prompts, as_prompts):
    prompts = as_prompts(heldout_prompts[:10])
    kinds = [
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=3),
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, repetition_penalty=1.3),
        SamplingParams(
            temperature=0,
            max_tokens=24,
            ignore_eos=True,
            presence_penalty=0.5,
            frequency_penalty=0.5,
        ),
        SamplingParams(temperature=0, max_tokens=24, min_tokens=20),
        SamplingParams(temperature=0.8, top_k=20, seed=1, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=1.0, top_p=0.9, seed=2, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0.7, seed=3, max_tokens=24, ignore_eos=True, logprobs=2),
        SamplingParams(
            temperature=0.8,
            seed=4,
            max_tokens=12,
            structured_outputs=StructuredOutputsParams(regex=r"[0-9]{3}-[a-z]{2}"),
        ),
        SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True),
    ]
    expected = plain.generate(prompts, kinds, use_tqdm=False)
    runs = replay(isd, lambda: isd.generate(prompts, kinds, use_tqdm=False))
    for i in range(5):  # greedy kinds, penalties included: token for token
        assert runs[0][i].outputs[0].token_ids == expected[i].outputs[0].token_ids, i
    for i in range(5, 9):  # seeded kinds: reproducible
        assert runs[0][i].outputs[0].token_ids == runs[1][i].outputs[0].token_ids, i
    for i in (1, 7):
        out = runs[0][i].outputs[0]
        assert len(out.logprobs) == len(out.token_ids)
        assert all(tok in lp for tok, lp in zip(out.token_ids, out.logprobs, strict=True))
    for e, g in zip(expected[1].outputs[0].logprobs, runs[0][1].outputs[0].logprobs, strict=True):
        assert {t: round(v.logprob, 4) for t, v in e.items()} == {
            t: round(v.logprob, 4) for t, v in g.items()
        }
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", runs[0][8].outputs[0].text)
    assert len(runs[0][4].outputs[0].token_ids) >= 20


def test_preemption_and_resumption_stay_exact(plain, pressured, heldout_prompts, generate):
    """48 requests against a 32-block KV cache (24 at a time): vLLM preempts and resumes
    requests (a resumed request may get placeholder slots); greedy stays exact, seeded
    sampling reproducible, and no per-request state is left behind."""
    prompts = prompts_of_lengths(heldout_prompts, [20 + (i * 7) % 40 for i in range(48)])
    params = SamplingParams(temperature=0, max_tokens=96, ignore_eos=True)
    expected = generate(plain, prompts, params)
    preempted_before = counter(pressured, "vllm:num_preemptions")
    assert generate(pressured, prompts, params) == expected
    assert counter(pressured, "vllm:num_preemptions") > preempted_before
    seeded = [
        SamplingParams(temperature=0.9, seed=i, max_tokens=64, ignore_eos=True) for i in range(24)
    ]
    preempted_before = counter(pressured, "vllm:num_preemptions")
    runs = replay(pressured, lambda: generate(pressured, prompts[:24], seeded))
    assert all(len(out) == 64 for run in runs for out in run)
    assert runs[0] == runs[1]
    assert counter(pressured, "vllm:num_preemptions") > preempted_before
    state = settled_state(pressured, prompts[0])
    assert state["pending_drafts"] == 0
    # The drafts proposed, the lookup's offer and the policy's estimates: at most the settling
    # request's own (its end reaches the worker with the next step; its lookup may match the
    # outputs before it).
    assert state["proposed_drafts"] <= 1 and state["offered_drafts"] <= 1
    assert state["tracked_requests"] <= 1
    # The lookups searched the finished requests' outputs (the last 32), greedy output exact.
    assert state["lookup_outputs"] == 32


def test_chunked_prefill_of_prompts_longer_than_the_token_budget(
    plain, pressured, heldout_prompts, generate
):
    """Prompts of 150-200 tokens against max_num_batched_tokens=64, batched with short
    ones that are already decoding."""
    prompts = prompts_of_lengths(heldout_prompts, [150, 8, 200, 12, 175, 30])
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    assert generate(pressured, prompts, params) == generate(plain, prompts, params)
    metrics = read_isd_metrics(pressured.get_metrics())
    assert metrics.num_accepted_tokens > 0


def test_async_scheduling_is_refused_with_a_clear_error(demo_models, llm_factory, isd):
    assert not isd.llm_engine.vllm_config.scheduler_config.async_scheduling
    with (
        pytest.raises(ValueError, match="idlm: async scheduling"),
        llm_factory(demo_models["idlm"], K, async_scheduling=True),
    ):
        pass


def test_the_adaptive_mode_varied_the_strides_and_lookups_were_verified(
    mode, isd, heldout_prompts, generate
):
    """Last in this module: the adaptive engine went through the features above with more than
    one stride (a fixed-K engine has no stride choice), and every engine verified lookup
    drafts beside MASK-row drafts."""
    state = settled_state(isd, heldout_prompts[0])
    chosen = state.get("ks_chosen")
    if mode[0] == "adaptive":
        assert chosen and len([k for k, n in chosen.items() if n]) >= 2, chosen
    else:
        assert not chosen, chosen
    sources = state["sources"]
    assert sources["lookup_drafts"] > 0 and sources["mask_drafts"] > 0, sources
