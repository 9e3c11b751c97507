"""The verifier's shortcut for a step without draft slots emits what the full step emits."""

from __future__ import annotations

import torch

from vllm_idlm.verifier import sample_without_drafts, verify_and_draft

MASK = 5


def full_step(logits, temperature, generators):
    n = logits.shape[0]
    step = verify_and_draft(
        logits,
        torch.zeros(0, dtype=torch.int64),
        None,
        [0] * n,
        [0] * n,
        temperature,
        None,
        None,
        generators,
        MASK,
    )
    return step.output_token_ids[:, 0]


def test_greedy_shortcut_equals_the_full_step_and_skips_the_mask_token():
    logits = torch.randn(16, 40, generator=torch.Generator().manual_seed(0))
    logits[::3, MASK] = 50.0  # the MASK token is the argmax of every third row
    fast = sample_without_drafts(logits, None, None, MASK, all_greedy=True)
    assert torch.equal(fast, full_step(logits, torch.zeros(16), None))
    assert not (fast == MASK).any()
    assert torch.equal(fast[1::3], logits[1::3].argmax(dim=-1))


def test_seeded_rows_draw_the_numbers_the_full_step_draws():
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(1))
    temperature = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0, 1.0])

    def generators():
        return {i: torch.Generator().manual_seed(100 + i) for i in (1, 2, 5)}

    fast = sample_without_drafts(logits, temperature, generators(), MASK, all_greedy=False)
    full = full_step(logits, temperature, generators())
    seeded = [0, 1, 2, 3, 5]  # the unseeded random row 4 draws from the global RNG
    assert torch.equal(fast[seeded], full[seeded])
    assert torch.equal(fast[[0, 3]], logits[[0, 3]].argmax(dim=-1))
