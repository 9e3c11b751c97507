"""The gated layer: base output untouched off the gate, base + scale * B(A(x)) on it."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from vllm_idlm.formats.adapter import check_fits, read_adapter
from vllm_idlm.gated_lora import GateRows, PackedGatedLinear


class TupleLinear(nn.Linear):
    """Mimics vLLM's linear layers, which return (output, bias)."""

    def forward(self, x):
        return super().forward(x), None


def make_layer(sizes=(24, 8, 8), rank=4, targeted=(True, False, True), seed=0):
    gen = torch.Generator().manual_seed(seed)
    base = TupleLinear(16, sum(sizes))
    slices = [
        (torch.randn(rank, 16, generator=gen), torch.randn(s, rank, generator=gen)) if t else None
        for s, t in zip(sizes, targeted, strict=True)
    ]
    gate = GateRows()
    return base, PackedGatedLinear(base, slices, list(sizes), 0.5, gate), slices, gate


def test_gate_closed_output_is_bit_identical_to_the_base_layer():
    base, gated, _, gate = make_layer()
    x = torch.randn(7, 16)
    gate.rows = torch.zeros(0, dtype=torch.long)
    assert torch.equal(gated(x)[0], base(x)[0])


def test_gate_open_adds_the_delta_on_gated_rows_only_per_packed_slice():
    base, gated, slices, gate = make_layer()
    x = torch.randn(7, 16)
    rows = torch.tensor([1, 4, 6])
    gate.rows = rows
    out, expected = gated(x)[0], base(x)[0].clone()
    offset = 0
    for pair, size in zip(slices, (24, 8, 8), strict=True):
        if pair is not None:
            a, b = pair
            expected[rows, offset : offset + size] += 0.5 * (x[rows] @ a.T) @ b.T
        offset += size
    closed = torch.tensor([0, 2, 3, 5])
    assert torch.equal(out[closed], base(x)[0][closed])
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_the_gates_runs_follow_its_rows_from_step_to_step():
    """One run (a decode step of one request: its MASK rows last), then more runs than the
    CPU path takes by runs, then the gate closed: each step updates its own rows only."""
    base, gated, slices, gate = make_layer(seed=1)
    x = torch.randn(9, 16)
    for rows, runs in (([6, 7, 8], [(6, 9)]), ([1, 4, 5, 8], [(1, 2), (4, 6), (8, 9)]), ([], [])):
        gate.rows = torch.tensor(rows, dtype=torch.long)
        assert gate.runs == runs
        out, expected = gated(x)[0], base(x)[0].clone()
        offset = 0
        for pair, size in zip(slices, (24, 8, 8), strict=True):
            if pair is not None and rows:
                a, b = pair
                expected[rows, offset : offset + size] += 0.5 * (x[rows] @ a.T) @ b.T
            offset += size
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        closed = [r for r in range(9) if r not in rows]
        assert torch.equal(out[closed], base(x)[0][closed])


def write_adapter(path, hidden=16, inter=32, rank=4, modules=("q_proj", "down_proj"), bad=None):
    from safetensors.torch import save_file

    path.mkdir()
    (path / "adapter_config.json").write_text(
        json.dumps(
            {"peft_type": "LORA", "r": rank, "lora_alpha": 8, "target_modules": list(modules)}
        )
    )
    shapes = {"q_proj": (hidden, 32), "down_proj": (inter, hidden), "k_proj": (hidden, 16)}
    tensors = {}
    for m in modules:
        fan_in, fan_out = shapes[m]
        if m == bad:
            fan_in += 1
        group = "self_attn" if m.endswith(("q_proj", "k_proj")) else "mlp"
        prefix = f"base_model.model.model.layers.0.{group}.{m}"
        tensors[f"{prefix}.lora_A.weight"] = torch.zeros(rank, fan_in)
        tensors[f"{prefix}.lora_B.weight"] = torch.zeros(fan_out, rank)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    return path


@pytest.fixture
def base_config():
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )


def test_a_fitting_adapter_is_accepted_with_its_peft_scale(tmp_path, base_config):
    adapter = read_adapter(write_adapter(tmp_path / "ok"))
    check_fits(adapter, base_config)
    assert adapter.scale == 2.0 and adapter.rank == 4


def test_an_adapter_with_wrong_shapes_is_refused_naming_the_layer(tmp_path, base_config):
    adapter = read_adapter(write_adapter(tmp_path / "bad", bad="down_proj"))
    with pytest.raises(ValueError, match=r"layer 0 down_proj has lora_A \(4, 33\)"):
        check_fits(adapter, base_config)


def test_an_adapter_targeting_unsupported_modules_is_refused(tmp_path):
    path = write_adapter(tmp_path / "emb")
    config = json.loads((path / "adapter_config.json").read_text())
    config["target_modules"] = ["q_proj", "lm_head"]
    (path / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"targets \['lm_head'\]"):
        read_adapter(path)
