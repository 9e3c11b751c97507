"""The loss uses shifted labels and ignores prompt and padding rows."""

from __future__ import annotations

import torch
from torch import nn

from idlm_training.objective import IGNORE, build_idlm_batch, idlm_loss, shifted_labels

MASK = 99


def test_shifted_labels_hand_case():
    ids = torch.tensor([[5, 6, 7, 8]])
    flags = torch.tensor([[True, True, True, False]])  # last token is padding
    assert shifted_labels(ids, flags).tolist() == [[6, 7, IGNORE, IGNORE]]


def test_batch_masks_response_only_and_shares_positions():
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    flags = torch.tensor([[False, False, True, True, True]])  # prompt [1, 2]
    b = build_idlm_batch(ids, flags, MASK)
    assert b.input_ids.tolist() == [[1, 2, MASK, MASK, MASK, 1, 2, 3, 4, 5]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 4]]
    # x_t row i (a MASK) predicts x_0[i+1]; prompt rows have no target.
    assert b.mask_labels.tolist() == [[IGNORE, IGNORE, 4, 5, IGNORE]]
    # clean row 1 predicts 3 (a response token); row 0 would predict a prompt token.
    assert b.clean_labels.tolist() == [[IGNORE, 3, 4, 5, IGNORE]]


def _loss(hidden, head, batch, alpha=0.5, balance="fixed"):
    return idlm_loss(hidden, head, batch, alpha, balance)


def test_loss_ignores_prompt_and_padding_rows():
    torch.manual_seed(0)
    ids = torch.randint(0, 20, (2, 6))
    flags = torch.tensor(
        [[False, False, True, True, True, True], [True, True, True, True, False, False]]
    )
    batch = build_idlm_batch(ids, flags, MASK)
    head = nn.Linear(8, 100, bias=False)
    hidden = torch.randn(2, 12, 8)
    base = _loss(hidden, head, batch)
    changed = hidden.clone()
    # Rows without a target: x_t prompt rows 0,1 / last rows; padding rows 4,5 of sample 1.
    for sample, rows in ((0, [0, 1, 5, 6, 11]), (1, [3, 4, 5, 9, 10, 11])):
        changed[sample, rows] += 100.0
    after = _loss(changed, head, batch)
    assert torch.equal(base.total, after.total)


def test_mask_ce_is_mean_ce_over_shifted_targets():
    torch.manual_seed(1)
    ids = torch.randint(0, 20, (1, 4))
    batch = build_idlm_batch(ids, torch.ones(1, 4, dtype=torch.bool), MASK)
    head = nn.Linear(8, 100, bias=False)
    hidden = torch.randn(1, 8, 8)
    parts = _loss(hidden, head, batch, alpha=0.0)
    logits = head(hidden[0, :3])
    expected = torch.nn.functional.cross_entropy(logits, ids[0, 1:])
    torch.testing.assert_close(parts.mask_ce, expected)
    torch.testing.assert_close(parts.total, expected)


def test_auto_balance_scales_clean_term_to_mask_term():
    torch.manual_seed(2)
    ids = torch.randint(0, 20, (1, 6))
    batch = build_idlm_batch(ids, torch.ones(1, 6, dtype=torch.bool), MASK)
    head = nn.Linear(8, 100, bias=False)
    hidden = torch.randn(1, 12, 8)
    parts = _loss(hidden, head, batch, alpha=1.0, balance="auto")
    torch.testing.assert_close(parts.total, 2 * parts.mask_ce)
