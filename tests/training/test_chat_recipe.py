"""Chat recipes: the shipped presets load, bad values are named, stage hashes key the right inputs."""

from __future__ import annotations

import dataclasses

import pytest

from idlm_training.chat_build import _link_base, _take, stage_hashes
from idlm_training.chat_recipe import (
    InstructionConfig,
    RolloutConfig,
    chat_recipe_from_dict,
    load_chat_recipe,
)
from idlm_training.config import ConvertConfig, TrainConfig, hash_view, load_recipe
from idlm_training.demo import stage_hashes as demo_hashes

PRESETS = ("smollm2_lora", "smollm2_convert", "smollm2_demo_lora")


@pytest.mark.parametrize("name", PRESETS)
def test_presets_load_and_build_something(name):
    recipe = load_chat_recipe(name)
    assert recipe.name == name and recipe.outputs
    assert recipe.convert.rollouts == 1.0 and recipe.convert.split_pass


def test_demo_lora_answers_are_the_long_recipes_first():
    """The short recipe's rollouts are a prefix of the long one's pool: built once, shared."""
    short, long = load_chat_recipe("smollm2_demo_lora"), load_chat_recipe("smollm2_lora")
    assert stage_hashes(short)["pool"] == stage_hashes(long)["pool"]
    assert stage_hashes(short)["rollouts"] != stage_hashes(long)["rollouts"]


def test_the_study_recipes_train_on_the_demo_recipes_answers():
    """Issue 54's variants (training/configs/study/) differ from the demo adapter's recipe in
    how they train only: same base, prompts and rollouts, so their TPF compares training."""
    from idlm_training.config import CONFIG_DIR

    demo = stage_hashes(load_chat_recipe("smollm2_demo_lora"))
    paths = sorted((CONFIG_DIR / "study").glob("*.json"))
    assert len(paths) >= 3
    for path in paths:
        hashes = stage_hashes(load_chat_recipe(str(path)))
        assert {k: hashes[k] for k in ("base", "prompts", "rollouts")} == {
            k: demo[k] for k in ("base", "prompts", "rollouts")
        }, path.name
        assert hashes["lora"] != demo["lora"], f"{path.name} trains what the demo recipe trains"


def test_engine_settings_are_not_hashed_but_answers_are():
    recipe = load_chat_recipe("smollm2_lora")
    hashes = stage_hashes(recipe)
    faster = dataclasses.replace(
        recipe, rollouts=dataclasses.replace(recipe.rollouts, max_num_seqs=7, kv_cache_gib=1.0)
    )
    assert stage_hashes(faster) == hashes
    other = dataclasses.replace(
        recipe, rollouts=dataclasses.replace(recipe.rollouts, temperatures=(0.0, 1.0))
    )
    assert stage_hashes(other)["pool"] != hashes["pool"]
    assert stage_hashes(other)["base"] == hashes["base"]


def test_options_added_later_leave_existing_cache_keys_alone():
    """`hash_view` drops ADDED fields at their default: the demo's cached models stay valid."""
    assert "rollout_file" not in hash_view(ConvertConfig())
    assert "snapshot_every" not in hash_view(TrainConfig(snapshot_every=5))  # never hashed
    assert hash_view(ConvertConfig(split_pass=True))["split_pass"] is True
    demo = load_recipe("demo")
    with_default = dataclasses.replace(demo, convert=dataclasses.replace(demo.convert))
    assert demo_hashes(with_default) == demo_hashes(demo)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"kind": "chat", "name": "x"}, "builds nothing"),
        ({"name": "x", "lora_train": {}}, '"kind": "chat"'),
        ({"kind": "chat", "lora_train": {}, "bogus": 1}, "unknown chat recipe keys: \\['bogus'\\]"),
        (
            {
                "kind": "chat",
                "lora_train": {},
                "rollouts": {"count": 10},
                "instructions": {"train": 5},
            },
            "rollouts.count=10 exceeds instructions.train=5",
        ),
    ],
)
def test_bad_recipes_are_refused_with_the_reason(data, words):
    with pytest.raises(ValueError, match=words):
        chat_recipe_from_dict(data)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"temperatures": (0.0,), "shares": (0.5, 0.5)}, "one share per temperature"),
        ({"shares": (0.5, 0.6)}, "sum to 1"),
        ({"temperatures": (-1.0, 0.7)}, "must be >= 0"),
        ({"dtype": "float16"}, "dtype='float16'"),
    ],
)
def test_rollout_config_checks(kwargs, words):
    with pytest.raises(ValueError, match=words):
        RolloutConfig(**kwargs)


def test_instruction_config_checks():
    with pytest.raises(ValueError, match="heldout_fraction=1.5"):
        InstructionConfig(heldout_fraction=1.5)


def test_take_keeps_the_first_count_answers_in_order(tmp_path):
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(f'{{"index": {i}, "x": {i}}}\n' for i in (3, 0, 2, 1, 4)))
    out = _take(pool, 3, tmp_path / "mine.jsonl")
    assert [line[:12] for line in out.read_text().splitlines()] == [
        '{"index": 0,',
        '{"index": 1,',
        '{"index": 2,',
    ]
    with pytest.raises(ValueError, match="holds 5 of the first 9"):
        _take(pool, 9, tmp_path / "more.jsonl")


def test_models_dir_links_the_shared_base(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    link = tmp_path / "recipe" / "base"
    link.parent.mkdir()
    _link_base(link, base)
    _link_base(link, base)  # idempotent
    assert link.is_symlink() and (link / "config.json").is_file()
