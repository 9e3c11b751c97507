"""The [x_t | x_0] objective in two passes: x_0 first, as a KV cache, then the MASK rows only.

The joint form (block_mask.py) runs 2L rows in one forward. Only the MASK rows of x_t carry a
loss, and a clean row of x_t computes exactly what its x_0 twin computes when no MASK of its
own block and document comes before it (true for prompt-then-answer documents). So:

  pass 1  x_0: L rows, causal within documents, keeping every layer's K/V. Under no_grad when
          nothing trainable reaches a clean row (gated LoRA: frozen base, gate closed there).
  pass 2  the MASK rows of each window (gathered, padded to the batch's largest count), at
          their own positions, attending to x_0's K/V of earlier blocks and of the clean
          tokens of their own block, and to the MASK rows of their own block up to themselves.

Same loss and gradients as the joint form (tests/training/test_two_pass.py). It saves the
clean half's backward (gated LoRA) and the x_t prompt rows' forward and backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .modeling import trunk_and_head
from .objective import IGNORE, IdlmBatch, LossParts, split_loss


@dataclass
class MaskRows:
    """The MASK rows of each window: positions [B, M] (0 where padding) and validity [B, M]."""

    positions: torch.Tensor
    valid: torch.Tensor


def mask_rows(loss_mask: torch.Tensor) -> MaskRows:
    seq_len = loss_mask.shape[1]
    counts = loss_mask.sum(1)
    width = max(1, int(counts.max()))
    pos = torch.arange(seq_len, device=loss_mask.device)
    # MASK rows first, in position order: sort by (not a MASK row, position).
    order = torch.argsort(torch.where(loss_mask, pos, pos + seq_len), dim=1)[:, :width]
    valid = torch.arange(width, device=loss_mask.device)[None] < counts[:, None]
    return MaskRows(torch.where(valid, order, torch.zeros_like(order)), valid)


def split_masks(
    loss_mask: torch.Tensor, doc_ids: torch.Tensor | None, rows: MaskRows, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(pass-1 mask [B, 1, L, L], pass-2 mask [B, 1, M, L + M]); True = attend.

    Pass-2 keys are x_0's L cached rows, then the M MASK rows. A padding query row attends to
    itself only (a row that sees nothing would be NaN); no real row sees a padding row.
    """
    batch, seq_len = loss_mask.shape
    device = loss_mask.device
    doc = doc_ids if doc_ids is not None else torch.zeros_like(loss_mask, dtype=torch.long)
    pos = torch.arange(seq_len, device=device)
    blk = pos // block_size
    causal = pos[:, None] >= pos[None, :]
    clean_mask = causal[None] & (doc[:, :, None] == doc[:, None, :])

    q_pos, valid = rows.positions, rows.valid
    q_blk = q_pos // block_size
    q_doc = doc.gather(1, q_pos)
    earlier = blk[None, None, :] < q_blk[:, :, None]
    own_clean = (
        (blk[None, None, :] == q_blk[:, :, None])
        & (pos[None, None, :] < q_pos[:, :, None])
        & ~loss_mask[:, None, :]
    )
    to_clean = (earlier | own_clean) & (doc[:, None, :] == q_doc[:, :, None]) & valid[:, :, None]
    to_mask = (
        (q_blk[:, None, :] == q_blk[:, :, None])
        & (q_pos[:, None, :] <= q_pos[:, :, None])
        & (q_doc[:, None, :] == q_doc[:, :, None])
        & valid[:, :, None]
        & valid[:, None, :]
    )
    width = q_pos.shape[1]
    to_mask |= torch.eye(width, dtype=torch.bool, device=device)[None] & ~valid[:, :, None]
    return clean_mask[:, None], torch.cat([to_clean, to_mask], dim=2)[:, None]


def split_hidden(
    model,
    batch: IdlmBatch,
    loss_mask: torch.Tensor,
    doc_ids: torch.Tensor | None,
    block_size: int,
    clean_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, MaskRows]:
    """(hidden of the MASK rows [B, M, H], hidden of x_0 [B, L, H], the MASK rows)."""
    from transformers import DynamicCache

    trunk, _ = trunk_and_head(model)
    seq_len = loss_mask.shape[1]
    x_t, x_0 = batch.input_ids[:, :seq_len], batch.input_ids[:, seq_len:]
    positions = batch.position_ids[:, :seq_len]
    rows = mask_rows(loss_mask)
    clean_mask, mask_mask = split_masks(loss_mask, doc_ids, rows, block_size)
    cache = DynamicCache(config=model.config)
    with torch.set_grad_enabled(clean_grad and torch.is_grad_enabled()):
        clean = trunk(
            input_ids=x_0,
            position_ids=positions,
            attention_mask=clean_mask,
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state
    # Padding rows take a clean token (x_0's first) so the gate stays closed on them.
    ids = torch.where(rows.valid, x_t.gather(1, rows.positions), x_0[:, :1])
    masked = trunk(
        input_ids=ids,
        position_ids=rows.positions,
        attention_mask=mask_mask,
        past_key_values=cache,
        use_cache=True,
    ).last_hidden_state
    return masked, clean, rows


def split_idlm_loss(
    model,
    batch: IdlmBatch,
    loss_mask: torch.Tensor,
    doc_ids: torch.Tensor | None,
    block_size: int,
    alpha: float,
    balance: str,
    distill: float,
    clean_grad: bool,
) -> LossParts:
    """The conversion loss of `batch` computed in two passes (see the module docstring)."""
    masked, clean, rows = split_hidden(model, batch, loss_mask, doc_ids, block_size, clean_grad)
    _, head = trunk_and_head(model)
    labels = batch.mask_labels.gather(1, rows.positions)
    labels = torch.where(rows.valid, labels, torch.full_like(labels, IGNORE))
    teacher = clean.gather(1, rows.positions[..., None].expand(-1, -1, clean.shape[-1]))
    return split_loss(
        masked, teacher, clean, head, labels, batch.clean_labels, alpha, balance, distill
    )
