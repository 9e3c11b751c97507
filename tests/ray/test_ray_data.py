"""Offline batch ISD with Ray Data on a local 2-CPU Ray cluster: every row comes back, greedy
output equals a direct `LLM()` run token for token, and Ray's copy of the engines' metrics shows
that the speculative (ISD) path ran inside the Ray actors. Also the self-rollouts through Ray."""

from __future__ import annotations

import gc
import json
import socket

import pytest

ray = pytest.importorskip("ray", reason="the `ray` extra is not installed")

ENGINE = dict(
    dtype="float32",
    max_model_len=512,
    enforce_eager=True,
    kv_cache_memory_bytes=256 << 20,
    seed=0,
)
NEW_TOKENS = 24
PROMPTS = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(start_ray):
    port = _free_port()
    start_ray(
        _metrics_export_port=port,
        # The engines' metrics reach the node's agent every second instead of every ten.
        _system_config={"metrics_report_interval_ms": 1000},
    )
    yield {"metrics_port": port}
    ray.shutdown()


def _direct(model, prompts, **spec) -> list[list[int]]:
    """The reference: vLLM's own `LLM()` in this process, plain decoding unless told."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(model), **ENGINE, **spec)
    try:
        params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params)
        return [list(o.outputs[0].token_ids) for o in outs]
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def _run(model, prompts, **kwargs) -> list[dict]:
    from vllm_idlm.on_ray.data import build_processor

    rows = [
        {
            "idx": i,
            "prompt_ids": list(p),
            "sampling_params": {"temperature": 0, "max_tokens": NEW_TOKENS, "ignore_eos": True},
        }
        for i, p in enumerate(prompts)
    ]
    proc = build_processor(str(model), engine_kwargs=ENGINE, batch_size=2, **kwargs)
    out = proc(ray.data.from_items(rows)).take_all()
    return sorted(out, key=lambda r: r["idx"])


@pytest.fixture(scope="module")
def prompts(heldout_prompts):
    return [list(p) for p in heldout_prompts[:PROMPTS]]


@pytest.mark.timeout(900)
def test_isd_two_replicas_every_row_exact_and_counted(cluster, demo_models, prompts):
    from vllm_idlm.on_ray.common import scrape, spec_counters, wait_for_counters

    before = spec_counters(scrape(cluster["metrics_port"]))
    rows = _run(demo_models["idlm"], prompts, num_drafts=3, replicas=2)
    assert [r["idx"] for r in rows] == list(range(PROMPTS)), "a row went missing"
    assert all(r["num_generated_tokens"] == NEW_TOKENS for r in rows)
    assert [r["prompt_ids"] for r in rows] == prompts

    # ISD ran inside the Ray actors: their engines proposed and verified drafts.
    drafts = "ray_vllm_spec_decode_num_drafts_total"
    seen = wait_for_counters(cluster["metrics_port"], {drafts: before.get(drafts, 0) + 1})
    assert seen.get(drafts, 0) > before.get(drafts, 0), f"no speculative step seen: {seen}"
    accepted = "ray_vllm_spec_decode_num_accepted_tokens_total"
    assert seen[accepted] > before.get(accepted, 0), f"no draft accepted: {seen}"

    # Greedy ISD is exact: the same tokens as vLLM's plain decoding of the same checkpoint.
    reference = _direct(demo_models["idlm"], prompts)
    assert [r["generated_tokens"] for r in rows] == reference


@pytest.mark.timeout(900)
def test_lossless_equals_plain_base(cluster, demo_models, prompts):
    rows = _run(demo_models["base"], prompts, num_drafts=3, draft_lora=str(demo_models["lora"]))
    assert [r["idx"] for r in rows] == list(range(PROMPTS))
    assert [r["generated_tokens"] for r in rows] == _direct(demo_models["base"], prompts)


def test_text_rows_and_passthrough_columns(cluster, demo_models):
    """Rows of text with per-row sampling fields; other columns come back untouched."""
    from vllm_idlm.on_ray.data import default_postprocess, default_preprocess

    req = default_preprocess({"prompt": "def f(x):", "max_tokens": 5, "tag": "a"})
    assert req == {
        "prompt": "def f(x):",
        "tag": "a",
        "sampling_params": {"max_tokens": 5, "temperature": 0.0},
    }
    req = default_preprocess({"prompt_ids": [1, 2], "sampling_params": {"temperature": 0.5}})
    assert req["tokenized_prompt"] == [1, 2] and req["sampling_params"]["temperature"] == 0.5
    with pytest.raises(ValueError, match="'prompt' or 'prompt_ids'"):
        default_preprocess({"text": "no prompt column"})
    out = default_postprocess(
        {
            "tokenized_prompt": [1, 2],
            "generated_tokens": [3],
            "generated_text": "x",
            "num_generated_tokens": 1,
            "tag": "a",
            "__inference_error__": "",
            "metrics": None,
        }
    )
    assert out == {
        "generated_tokens": [3],
        "generated_text": "x",
        "num_generated_tokens": 1,
        "tag": "a",
        "prompt_ids": [1, 2],
    }


@pytest.mark.timeout(900)
def test_rollouts_through_ray_match_local_engine(cluster, demo_models, prompts, tmp_path):
    """The training package's self-rollouts through Ray Data write the records the local
    engine writes (greedy: identical tokens), and training reads them as windows."""
    from transformers import AutoTokenizer

    from idlm_training.rollouts import read_rollout_file, rollout_windows
    from vllm_idlm.rollouts import (
        MASK_TOKEN,
        RolloutSpec,
        generate_rollouts,
        generate_rollouts_ray,
        open_engine,
    )

    base = demo_models["base"]
    mask_id = AutoTokenizer.from_pretrained(base).convert_tokens_to_ids(MASK_TOKEN)
    spec = RolloutSpec(max_tokens=16, temperatures=(0.0, 1.0), shares=(0.5, 0.5), seed=3)
    indices = list(range(len(prompts)))
    kwargs = dict(dtype="float32", max_model_len=512, enforce_eager=True, seed=0)
    path = tmp_path / "rollouts.jsonl"
    with path.open("w") as sink:
        ray_records = generate_rollouts_ray(
            str(base),
            prompts,
            indices,
            spec,
            mask_id,
            replicas=1,
            engine_kwargs={**kwargs, "kv_cache_memory_bytes": 256 << 20},
            on_record=lambda r: sink.write(json.dumps(r) + "\n"),
        )
    assert sorted(r["index"] for r in ray_records) == indices
    llm = open_engine(str(base), 16, 0.25, 512, enforce_eager=True)
    try:
        local = {r["index"]: r for r in generate_rollouts(llm, prompts, indices, spec, mask_id)}
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    by_index = {r["index"]: r for r in ray_records}
    greedy = [i for i in indices if spec.temperature(i) == 0]
    sampled = [i for i in indices if spec.temperature(i) > 0]
    assert greedy and sampled
    for i in indices:
        ours, theirs = by_index[i], local[i]
        assert ours["prompt_ids"] == theirs["prompt_ids"]
        assert (ours["greedy"], ours["temperature"], ours["seed"]) == (
            theirs["greedy"],
            theirs["temperature"],
            theirs["seed"],
        )
        assert mask_id not in ours["completion_ids"]
        if i in greedy:
            assert ours["completion_ids"] == theirs["completion_ids"], f"greedy rollout {i}"
        if len(ours["completion_ids"]) == spec.max_tokens:
            assert ours["finish_reason"] == "length"
    windows = rollout_windows(read_rollout_file(path), 64, 0, mask_id)
    assert len(windows) >= 1 and bool(windows.loss_mask.any())
