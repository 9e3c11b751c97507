"""The reference ISD decoder's greedy output equals plain greedy decoding, token for token."""

from __future__ import annotations

import copy

import pytest
import torch

from idlm_training.config import LoraConfig
from idlm_training.gated_lora import attach_gated_lora
from idlm_training.isd_reference import greedy_generate, isd_generate


def _prompts(mask_id: int, count: int = 3) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, mask_id, (7 + i,), generator=gen).tolist() for i in range(count)]


@pytest.mark.parametrize("stride", [2, 3, 4])
def test_isd_greedy_equals_plain_greedy(tiny_model, mask_id, stride):
    for prompt in _prompts(mask_id):
        plain = greedy_generate(tiny_model, prompt, 24, mask_id)
        out, stats = isd_generate(tiny_model, prompt, stride, 24, mask_id)
        assert out == plain
        assert stats.num_tokens == 24 and 1.0 <= stats.tokens_per_forward <= stride


def test_gated_lora_isd_greedy_equals_base_greedy(tiny_model, mask_id):
    gated = copy.deepcopy(tiny_model)
    adapter = attach_gated_lora(gated, LoraConfig(r=4, alpha=8.0), mask_id)
    with torch.no_grad():
        for p in adapter.parameters():
            p.normal_()
    for prompt in _prompts(mask_id, 2):
        out, _ = isd_generate(gated, prompt, 4, 20, mask_id)
        assert out == greedy_generate(tiny_model, prompt, 20, mask_id)


def test_sampled_isd_is_seeded_and_counts_depths(tiny_model, mask_id):
    prompt = _prompts(mask_id, 1)[0]
    a, stats = isd_generate(tiny_model, prompt, 3, 16, mask_id, temperature=1.0, seed=5)
    b, _ = isd_generate(tiny_model, prompt, 3, 16, mask_id, temperature=1.0, seed=5)
    assert a == b and len(a) == 16
    assert len(stats.depth_tried) <= 2 and stats.depth_tried[0] >= stats.depth_tried[-1]
    assert 0.0 <= stats.introspective_acceptance <= 1.0
