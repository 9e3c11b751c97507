"""Gated LoRA: with the gate closed the model is bit-identical to the base; open only on MASK rows."""

from __future__ import annotations

import copy

import torch

from idlm_training.config import LoraConfig
from idlm_training.gated_lora import attach_gated_lora


def _gated(model, mask_id):
    gated = copy.deepcopy(model)
    adapter = attach_gated_lora(gated, LoraConfig(r=4, alpha=8.0), mask_id)
    with torch.no_grad():  # a non-zero adapter, so an open gate would show
        for layer in adapter.layers.values():
            layer.lora_B.weight.normal_()
        adapter.mask_embedding.normal_()
    return gated, adapter


def test_gate_closed_outputs_equal_base(tiny_model, mask_id):
    gated, _ = _gated(tiny_model, mask_id)
    ids = torch.randint(0, mask_id, (2, 17))
    with torch.no_grad():
        assert torch.equal(gated(input_ids=ids).logits, tiny_model(input_ids=ids).logits)


def test_clean_rows_equal_base_when_masks_follow(tiny_model, mask_id):
    """Causal attention: rows before the first MASK never see the adapter."""
    gated, _ = _gated(tiny_model, mask_id)
    ids = torch.randint(0, mask_id, (1, 12))
    ids[0, 9:] = mask_id
    with torch.no_grad():
        out, ref = gated(input_ids=ids).logits, tiny_model(input_ids=ids).logits
    assert torch.equal(out[:, :9], ref[:, :9])
    assert not torch.allclose(out[:, 9:], ref[:, 9:])


def test_only_adapter_is_trainable(tiny_model, mask_id):
    gated, adapter = _gated(tiny_model, mask_id)
    trainable = {n for n, p in gated.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or n == "idlm_mask_embedding" for n in trainable)
    assert len(trainable) == len(adapter.parameters())
