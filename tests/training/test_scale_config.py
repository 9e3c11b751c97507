"""The Qwen3-8B recipe: paper hyper-parameters, exercised by a dry run on a tiny model (CPU)."""

from __future__ import annotations

import dataclasses
import json

import torch

from idlm_training.config import load_recipe
from idlm_training.convert import convert
from idlm_training.corpus import Document

from .conftest import TEXT


def test_qwen3_8b_recipe_has_paper_hyperparameters():
    r = load_recipe("qwen3_8b")
    assert r.convert.strides == (2, 3, 4) and r.convert.alpha == 0.2
    assert r.convert_train.lr == 1e-5 and r.convert_train.precision == "bf16"
    assert r.model.hidden_size == 4096 and r.model.num_layers == 36 and r.model.vocab_size == 151936
    tokens = (
        r.convert_train.steps
        * r.convert_train.batch_size
        * r.convert_train.grad_accum
        * r.convert_train.seq_len
        * 8
    )
    assert 4.0e9 < tokens < 5.0e9  # ~4.5B tokens on 8 GPUs


def test_qwen3_8b_recipe_dry_run_on_tiny_model(tmp_path, tiny_base_dir):
    """Model + optimizer + one step (2 micro-batches, bf16 autocast) through the real convert path."""
    r = load_recipe("qwen3_8b")
    tcfg = dataclasses.replace(
        r.convert_train, steps=1, seq_len=32, grad_accum=2, warmup_steps=1, ckpt_every=0
    )
    docs = [
        Document(f"d{i}", t * 3, prompt="# q\n" if i % 2 else "") for i, t in enumerate(TEXT[:8])
    ]
    out = convert(
        tiny_base_dir,
        docs,
        r.convert,
        tcfg,
        tmp_path / "idlm",
        tmp_path / "work",
        {"dry_run": True},
    )
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["idlm"]["strides"] == [2, 3, 4]
    log = [
        json.loads(line)
        for line in (tmp_path / "work" / "train_log.jsonl").read_text().splitlines()
    ]
    assert log[-1]["step"] == 1 and torch.isfinite(torch.tensor(log[-1]["loss"]))
