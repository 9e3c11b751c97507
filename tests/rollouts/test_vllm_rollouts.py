"""vllm_idlm.rollouts on a real engine (the demo base): vLLM's batched answers equal plain greedy
decoding, never contain the MASK, reproduce per seed, resume per request, and read back as
training windows that carry no clean-row labels."""

from __future__ import annotations

import json

import pytest
import torch

from vllm_idlm.rollouts import BANNED_BIAS, RolloutSpec, generate_rollouts, main, open_engine

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def engine(demo_models):
    llm = open_engine(str(demo_models["base"]), 8, 0.25, 128, enforce_eager=True)
    yield llm
    llm.llm_engine.engine_core.shutdown()


@pytest.fixture(scope="module")
def mask_id(demo_models) -> int:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_models["base"]).convert_tokens_to_ids("<|mask|>")


def test_greedy_answers_equal_plain_greedy_decoding(engine, demo_models, heldout_prompts, mask_id):
    from idlm_training.isd_reference import greedy_generate
    from idlm_training.modeling import load_base

    prompts = heldout_prompts[:6]
    spec = RolloutSpec(MAX_TOKENS, (0.0,), (1.0,))
    records = generate_rollouts(engine, prompts, range(6), spec, mask_id)
    assert sorted(r["index"] for r in records) == list(range(6))
    model, _ = load_base(demo_models["base"])
    for r in records:
        assert r["greedy"] and r["prompt_ids"] == prompts[r["index"]]
        want = greedy_generate(model.eval(), prompts[r["index"]], MAX_TOKENS, mask_id)
        assert r["completion_ids"] == want


def test_sampled_answers_reproduce_per_seed_and_never_hold_the_mask(
    engine, heldout_prompts, mask_id
):
    prompts = heldout_prompts[:8]

    def answers(seed: int) -> dict[int, list[int]]:
        spec = RolloutSpec(MAX_TOKENS, (1.0,), (1.0,), seed=seed)
        return {
            r["index"]: r["completion_ids"]
            for r in generate_rollouts(engine, prompts, range(8), spec, mask_id)
        }

    a, b, c = answers(0), answers(0), answers(1)
    assert a == b and a != c
    assert all(mask_id not in ids for ids in (*a.values(), *c.values()))


def test_shares_spread_over_every_prefix_and_the_mask_is_biased_away():
    spec = RolloutSpec(8, (0.0, 0.7), (0.25, 0.75))
    temps = [spec.temperature(i) for i in range(400)]
    assert abs(temps[:40].count(0.0) - 10) <= 2 and abs(temps.count(0.0) - 100) <= 2
    from vllm_idlm.rollouts import sampling_params

    params = sampling_params(spec, 1, mask_token_id=3)
    assert params.logit_bias == {3: BANNED_BIAS} and params.max_tokens == 8


def test_cli_resumes_and_its_file_trains_mask_rows_only(
    engine, demo_models, heldout_prompts, mask_id, tmp_path
):
    from idlm_training.objective import IGNORE, build_idlm_batch
    from idlm_training.rollouts import read_rollout_file, rollout_windows

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in heldout_prompts[:5]))
    out = tmp_path / "rollouts.jsonl"
    spec = RolloutSpec(MAX_TOKENS, (0.0, 1.0), (0.5, 0.5))
    # An interrupted run: two answers and a torn line on disk.
    done = generate_rollouts(engine, heldout_prompts[:2], [0, 1], spec, mask_id)
    out.write_text("".join(json.dumps(r) + "\n" for r in done) + '{"index": 2, "prom')
    args = ["--model", str(demo_models["base"]), "--prompts", str(prompts), "--out", str(out)]
    args += ["--max-tokens", str(MAX_TOKENS), "--temperatures", "0", "1", "--shares", "0.5", "0.5"]
    assert main([*args, "--max-num-seqs", "4", "--kv-cache-gib", "0.25", "--eager"]) == 0
    records = read_rollout_file(out)
    assert [r["index"] for r in records] == [0, 1, 2, 3, 4]
    assert records[:2] == sorted(done, key=lambda r: r["index"])  # kept, not redone
    meta = json.loads(out.with_suffix(".meta.json").read_text())
    assert meta["requests"] == 5 and meta["tokens"] == sum(
        len(r["completion_ids"]) for r in records[2:]
    )
    data = rollout_windows(records, 64, 0, mask_id)
    batch = build_idlm_batch(data.input_ids, data.loss_mask, mask_id, data.clean_loss)
    assert (batch.clean_labels == IGNORE).all() and (batch.mask_labels != IGNORE).sum() > 0
    assert int(data.loss_mask.sum()) == sum(len(r["completion_ids"]) for r in records)
    assert not torch.isin(data.input_ids, torch.tensor([mask_id])).any()
