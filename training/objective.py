"""The conversion objective: inputs [x_t | x_0], shared positions, MASK-row CE + alpha x clean CE.

Logit shift as in AR: row i (clean or MASK) predicts the token at i+1. A target counts only
when it is response text (`loss_mask`), so prompt and padding rows never contribute.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

IGNORE = -100


@dataclass
class IdlmBatch:
    input_ids: torch.Tensor  # [B, 2L]: x_t then x_0
    position_ids: torch.Tensor  # [B, 2L]: 0..L-1 twice
    mask_labels: torch.Tensor  # [B, L]: target of each x_t row (IGNORE where none)
    clean_labels: torch.Tensor  # [B, L]: target of each x_0 row (IGNORE where none)


def shifted_labels(input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """labels[i] = input_ids[i+1] where that token carries loss, else IGNORE; last row IGNORE."""
    labels = torch.full_like(input_ids, IGNORE)
    keep = loss_mask[:, 1:]
    labels[:, :-1] = torch.where(keep, input_ids[:, 1:], torch.full_like(input_ids[:, 1:], IGNORE))
    return labels


def build_idlm_batch(
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    mask_token_id: int,
    clean_loss: torch.Tensor | None = None,
) -> IdlmBatch:
    """All-masked x_t: every response token becomes MASK; prompt tokens stay clean.

    `clean_loss` [B] bool: windows where it is False get no clean-row labels (MASK rows only).
    """
    seq_len = input_ids.shape[1]
    x_t = torch.where(loss_mask, torch.full_like(input_ids, mask_token_id), input_ids)
    labels = shifted_labels(input_ids, loss_mask)
    mask_labels = torch.where(loss_mask, labels, torch.full_like(labels, IGNORE))
    pos = (
        torch.arange(seq_len, device=input_ids.device)
        .repeat(2)[None]
        .expand(input_ids.shape[0], -1)
    )
    if clean_loss is not None:
        labels = torch.where(clean_loss[:, None], labels, torch.full_like(labels, IGNORE))
    return IdlmBatch(torch.cat([x_t, input_ids], dim=1), pos.contiguous(), mask_labels, labels)


@dataclass
class LossParts:
    total: torch.Tensor
    mask_ce: torch.Tensor
    clean_ce: torch.Tensor


def _labelled_rows(
    hidden: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hidden rows that carry a label, their labels, the flat row selection)."""
    sel = labels.reshape(-1) != IGNORE
    return hidden.reshape(-1, hidden.shape[-1])[sel], labels.reshape(-1)[sel], sel


def _ce(hidden: torch.Tensor, lm_head, labels: torch.Tensor) -> torch.Tensor:
    """CE over labelled rows only: the lm_head runs on those rows, never on all 2L x V."""
    rows, targets, _ = _labelled_rows(hidden, labels)
    if targets.numel() == 0:
        return hidden.sum() * 0.0
    return F.cross_entropy(lm_head(rows).float(), targets)


def _mask_term(
    mask_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor,
    lm_head,
    mask_labels: torch.Tensor,
    distill: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, data CE) of the MASK rows; loss = (1 - distill) x data CE + distill x soft CE.

    The soft target of MASK row i is the clean row at the same position's own next-token
    distribution (`teacher_hidden`, detached): the distribution the verifier will hold the
    draft to, seen with the true prefix.
    """
    if distill == 0:
        ce = _ce(mask_hidden, lm_head, mask_labels)
        return ce, ce.detach()
    rows, targets, sel = _labelled_rows(mask_hidden, mask_labels)
    if targets.numel() == 0:
        zero = mask_hidden.sum() * 0.0
        return zero, zero.detach()
    with torch.no_grad():
        clean_rows = teacher_hidden.reshape(-1, teacher_hidden.shape[-1])[sel]
        teacher = lm_head(clean_rows).float().softmax(-1)
    logq = lm_head(rows).float().log_softmax(-1)
    data_ce = F.nll_loss(logq, targets)
    soft_ce = -(teacher * logq).sum(-1).mean()
    return (1 - distill) * data_ce + distill * soft_ce, data_ce.detach()


def idlm_loss(
    hidden: torch.Tensor,
    lm_head,
    batch: IdlmBatch,
    alpha: float,
    balance: str,
    distill: float = 0.0,
) -> LossParts:
    """The loss of a joint [x_t | x_0] forward (`hidden` [B, 2L, H]); see `split_loss`."""
    seq_len = batch.mask_labels.shape[1]
    x_t, x_0 = hidden[:, :seq_len], hidden[:, seq_len:]
    return split_loss(
        x_t, x_0, x_0, lm_head, batch.mask_labels, batch.clean_labels, alpha, balance, distill
    )


def split_loss(
    mask_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor,
    clean_hidden: torch.Tensor,
    lm_head,
    mask_labels: torch.Tensor,
    clean_labels: torch.Tensor,
    alpha: float,
    balance: str,
    distill: float = 0.0,
) -> LossParts:
    """mask term + w x clean_ce; w = alpha ("fixed") or alpha x mask_ce / clean_ce, detached ("auto").

    `mask_hidden` rows carry `mask_labels`; `teacher_hidden` holds, row for row, the clean
    row at the same position (the soft target); `clean_hidden` carries `clean_labels`.
    "auto" rescales the clean term to the MASK term's magnitude, so alpha is a ratio of the two.
    The mask term is the data CE, or with `distill` > 0 partly a soft CE against the clean rows
    (see `_mask_term`); `LossParts.mask_ce` always reports the data CE.
    """
    mask_term, mask_ce = _mask_term(mask_hidden, teacher_hidden, lm_head, mask_labels, distill)
    if alpha == 0:
        return LossParts(mask_term, mask_ce, mask_ce * 0)
    clean_ce = _ce(clean_hidden, lm_head, clean_labels)
    weight = alpha
    if balance == "auto":
        weight = alpha * (mask_term.detach() / clean_ce.detach().clamp_min(1e-6))
    return LossParts(mask_term + weight * clean_ce, mask_ce, clean_ce.detach())


def ar_loss(
    hidden: torch.Tensor, lm_head, input_ids: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """Plain next-token CE (the base model's objective)."""
    return _ce(hidden, lm_head, shifted_labels(input_ids, loss_mask))
