"""A demo build small enough for CI: three loadable models with the keys the plugin reads."""

from __future__ import annotations

import json
import time

from transformers import AutoModelForCausalLM

from idlm_training.config import load_recipe
from idlm_training.demo import STAMP, build_demo, stage_hashes


def test_tiny_demo_builds_three_models(tiny_demo):
    base, idlm, lora = tiny_demo["base"], tiny_demo["idlm"], tiny_demo["lora"]
    base_cfg = json.loads((base / "config.json").read_text())
    assert base_cfg["architectures"] == ["Qwen3ForCausalLM"]
    idlm_cfg = json.loads((idlm / "config.json").read_text())
    assert idlm_cfg["architectures"] == ["IdlmForCausalLM"] and idlm_cfg["model_type"] == "qwen3"
    assert idlm_cfg["idlm"]["strides"] == [2, 3, 4] and idlm_cfg["idlm"]["block_size"] == 3
    mask_id = idlm_cfg["mask_token_id"]
    assert json.loads((base / "tokenizer_config.json").read_text()) is not None
    assert (lora / "adapter_model.safetensors").is_file() and (
        lora / "idlm_mask_embedding.safetensors"
    ).is_file()
    adapter_cfg = json.loads((lora / "adapter_config.json").read_text())
    assert adapter_cfg["peft_type"] == "LORA" and adapter_cfg["base_model_name_or_path"] == str(
        base
    )
    assert json.loads((lora / "idlm_gate.json").read_text())["mask_token_id"] == mask_id
    AutoModelForCausalLM.from_pretrained(idlm)
    for path in tiny_demo.values():
        assert (
            json.loads((path / STAMP).read_text())["hash"]
            in stage_hashes(load_recipe("tiny")).values()
        )


def test_rebuild_with_same_recipe_is_skipped(tiny_demo):
    t0 = time.time()
    paths = build_demo(load_recipe("tiny"), tiny_demo["base"].parent, log=lambda m: None)
    assert paths == tiny_demo and time.time() - t0 < 2.0


def test_eval_reports_tokens_per_forward(tiny_demo, tmp_path):
    from idlm_training.cli import main

    out = tmp_path / "eval.json"
    assert (
        main(
            [
                "eval",
                "--model",
                str(tiny_demo["idlm"]),
                "--recipe",
                "tiny",
                "--prompts",
                "2",
                "--max-new",
                "12",
                "--prompt-len",
                "16",
                "--strides",
                "2",
                "4",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    rows = json.loads(out.read_text())["isd"]
    assert [(r["stride"], r["temperature"]) for r in rows] == [
        (2, 0.0),
        (2, 1.0),
        (4, 0.0),
        (4, 1.0),
    ]
    assert all(1.0 <= r["tokens_per_forward"] <= r["stride"] for r in rows)
    assert rows[0]["greedy_matches_plain"] == "2/2"
