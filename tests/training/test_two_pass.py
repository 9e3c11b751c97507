"""The split pass (x_0 as a KV cache, then the MASK rows only) equals the joint [x_t | x_0] forward."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from idlm_training.config import ConvertConfig, LoraConfig
from idlm_training.curriculum import make_idlm_step
from idlm_training.gated_lora import attach_gated_lora
from idlm_training.rollouts import rollout_windows
from idlm_training.two_pass import mask_rows, split_masks

SEQ_LEN = 24


def _windows(mask_id: int, eos: int):
    """Chat-like documents (clean prompt, then an answer) packed two or three to a window."""
    gen = torch.Generator().manual_seed(0)
    records = []
    for i in range(7):
        lengths = torch.randint(2, 9, (2,), generator=gen).tolist()
        prompt = torch.randint(4, 300, (lengths[0],), generator=gen)
        answer = torch.randint(4, 300, (lengths[1],), generator=gen)
        records.append(
            {
                "index": i,
                "prompt_ids": prompt.tolist(),
                "completion_ids": answer.tolist() + [eos],
                "temperature": 1.0 if i % 2 else 0.0,
            }
        )
    return rollout_windows(records, SEQ_LEN, eos, mask_id, clean_temperatures=(1.0,))


def _loss_and_grads(model, cfg, mask_id, data, clean_grad, alpha):
    step = make_idlm_step(
        model, cfg, mask_id, SEQ_LEN, 3, torch.device("cpu"), alpha=alpha, clean_grad=clean_grad
    )
    model.zero_grad(set_to_none=True)
    loss, _ = step(2, data.input_ids, data.loss_mask, data.clean_loss, data.doc_ids)
    loss.backward()
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), {n: p.grad.clone() for n, p in params.items() if p.grad is not None}


def test_mask_rows_gathers_answer_positions_in_order():
    loss_mask = torch.tensor([[0, 1, 1, 0, 1], [0, 0, 0, 1, 0]], dtype=torch.bool)
    rows = mask_rows(loss_mask)
    assert rows.positions.tolist() == [[1, 2, 4], [3, 0, 0]]
    assert rows.valid.tolist() == [[True, True, True], [True, False, False]]


def test_split_mask_by_hand():
    """Block size 2, one document: prompt [0, 1, 2] clean, answer rows 3, 4, 5 masked.
    Row 3 (block 1) sees clean 0, 1 (block 0) and clean 2 (its own block, before it) in x_0,
    and itself; row 4 (block 2) sees x_0 0..3 and itself; row 5 sees x_0 0..3 and rows 4, 5."""
    loss_mask = torch.tensor([[0, 0, 0, 1, 1, 1]], dtype=torch.bool)
    rows = mask_rows(loss_mask)
    _, m = split_masks(loss_mask, None, rows, 2)
    to_clean, to_mask = m[0, 0, :, :6].int().tolist(), m[0, 0, :, 6:].int().tolist()
    assert to_clean == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0]]
    assert to_mask == [[1, 0, 0], [0, 1, 0], [0, 1, 1]]


@pytest.mark.parametrize("stride", [2, 3, 4])
@pytest.mark.parametrize("distill", [0.0, 0.5])
def test_gated_lora_split_pass_equals_joint(tiny_model, tiny_tokenizer, mask_id, stride, distill):
    """Loss and adapter gradients (LoRA A/B and the MASK row) match at fp32; x_0 runs no_grad."""
    data = _windows(mask_id, tiny_tokenizer.eos_token_id)
    adapter = attach_gated_lora(tiny_model, LoraConfig(r=4, alpha=8), mask_id)
    with torch.no_grad():  # a trained-looking adapter: B = 0 would hide errors in A's gradient
        for layer in adapter.layers.values():
            layer.lora_B.weight.normal_(0, 0.05)
    tiny_model.train()
    cfg = ConvertConfig(strides=(stride,), distill=distill)
    joint = _loss_and_grads(tiny_model, cfg, mask_id, data, True, 0.0)
    split = _loss_and_grads(
        tiny_model, dataclasses.replace(cfg, split_pass=True), mask_id, data, False, 0.0
    )
    assert torch.allclose(joint[0], split[0], atol=1e-6, rtol=1e-5)
    assert joint[1].keys() == split[1].keys() and len(joint[1]) == 2 * len(adapter.layers) + 1
    for name, grad in joint[1].items():
        assert torch.allclose(grad, split[1][name], atol=1e-6, rtol=1e-4), name


def test_full_conversion_split_pass_equals_joint(tiny_model, tiny_tokenizer, mask_id):
    """Full fine-tune (clean loss on the T = 1 windows, alpha 0.5): every weight's gradient."""
    data = _windows(mask_id, tiny_tokenizer.eos_token_id)
    assert data.clean_loss.any() and not data.clean_loss.all()
    tiny_model.train()
    cfg = ConvertConfig(strides=(3,), alpha=0.5, distill=0.5)
    joint = _loss_and_grads(tiny_model, cfg, mask_id, data, True, None)
    split = _loss_and_grads(
        tiny_model, dataclasses.replace(cfg, split_pass=True), mask_id, data, True, None
    )
    assert torch.allclose(joint[0], split[0], atol=1e-6, rtol=1e-5)
    for name, grad in joint[1].items():
        assert torch.allclose(grad, split[1][name], atol=1e-6, rtol=1e-4), name


def test_clean_loss_without_clean_gradients_is_refused(tiny_model, mask_id):
    with pytest.raises(ValueError, match="alpha=0.2"):
        make_idlm_step(
            tiny_model, ConvertConfig(), mask_id, SEQ_LEN, 3, torch.device("cpu"), clean_grad=False
        )
