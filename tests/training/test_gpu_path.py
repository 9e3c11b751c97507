"""The GPU path: flex_attention block mask == dense mask, and a bf16 conversion step on CUDA."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from idlm_training.block_mask import build_mask
from idlm_training.config import load_recipe
from idlm_training.convert import convert
from idlm_training.corpus import Document
from idlm_training.modeling import hidden_states, set_attention

from .conftest import TEXT

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("seq_len,stride", [(64, 2), (200, 4), (256, 3)])
def test_flex_block_mask_matches_dense(tiny_model, seq_len, stride):
    model = tiny_model.cuda()
    ids = torch.randint(0, 300, (2, 2 * seq_len), device="cuda")
    pos = torch.arange(seq_len, device="cuda").repeat(2)[None].expand(2, -1)
    with torch.no_grad():
        set_attention(model, "sdpa")
        dense = hidden_states(model, ids, pos, build_mask(seq_len, stride - 1, "dense", "cuda"))
        set_attention(model, "flex_attention")
        flex = hidden_states(model, ids, pos, build_mask(seq_len, stride - 1, "flex", "cuda"))
    torch.testing.assert_close(flex, dense, atol=2e-5, rtol=1e-4)


def test_qwen3_8b_recipe_step_on_gpu(tmp_path, tiny_base_dir):
    """bf16 autocast + flex attention + grad accumulation through the real convert path."""
    r = load_recipe("qwen3_8b")
    tcfg = dataclasses.replace(
        r.convert_train, steps=2, seq_len=128, grad_accum=2, warmup_steps=1, ckpt_every=0
    )
    docs = [Document(f"d{i}", t * 8) for i, t in enumerate(TEXT[:8])]
    out = convert(
        tiny_base_dir, docs, r.convert, tcfg, tmp_path / "idlm", tmp_path / "work", {"gpu": True}
    )
    assert json.loads((out / "config.json").read_text())["idlm"]["block_size"] == 3
    log = [
        json.loads(line)
        for line in (tmp_path / "work" / "train_log.jsonl").read_text().splitlines()
    ]
    assert all(torch.isfinite(torch.tensor(rec["loss"])) for rec in log)
