"""The I-DLM training step with its stride curriculum (N = 2 -> 3 -> 4 by default).

Shared by full conversion (MASK CE + alpha x clean CE) and gated-LoRA training (MASK CE only).
"""

from __future__ import annotations

import torch

from .block_mask import build_mask
from .config import ConvertConfig
from .modeling import hidden_states, trunk_and_head
from .objective import build_idlm_batch, idlm_loss
from .trainer import StepFn
from .two_pass import split_idlm_loss


def stage_ends(cfg: ConvertConfig, total_steps: int) -> list[int]:
    """Last step (exclusive) of each stride's stage."""
    fractions = cfg.stage_fractions or tuple(1.0 for _ in cfg.strides)
    total = sum(fractions)
    ends, acc = [], 0.0
    for f in fractions:
        acc += f
        ends.append(round(total_steps * acc / total))
    ends[-1] = total_steps
    return ends


def stride_at(step: int, cfg: ConvertConfig, total_steps: int) -> int:
    for stride, end in zip(cfg.strides, stage_ends(cfg, total_steps), strict=True):
        if step < end:
            return stride
    return cfg.strides[-1]


def attention_kind(cfg: ConvertConfig, device: torch.device) -> str:
    if cfg.attention == "auto":
        return "flex" if device.type == "cuda" else "dense"
    return cfg.attention


def make_idlm_step(
    model,
    cfg: ConvertConfig,
    mask_token_id: int,
    seq_len: int,
    total_steps: int,
    device: torch.device,
    alpha: float | None = None,
    clean_grad: bool = True,
) -> StepFn:
    """step_fn for `trainer.train`; `alpha=0` trains the MASK rows only (gated LoRA).

    `clean_grad=False` declares that nothing trainable reaches a clean row (gated LoRA), so
    the split pass (`cfg.split_pass`) runs x_0 without gradients.
    """
    cfg.check_seq_len(seq_len)
    kind = attention_kind(cfg, device)
    alpha = cfg.alpha if alpha is None else alpha
    if not clean_grad and alpha:
        raise ValueError(f"alpha={alpha}: a clean loss needs gradients through the clean rows")
    masks: dict[int, object] = {}
    _, head = trunk_and_head(model)

    def joint_loss(stride, batch, doc_ids):
        if stride not in masks:
            masks[stride] = build_mask(seq_len, stride - 1, kind, device)
        mask = masks[stride]
        if doc_ids is not None:
            if kind == "flex":
                raise ValueError("document-packed windows need the dense or split attention")
            docs = torch.cat([doc_ids, doc_ids], dim=1)
            mask = mask & (docs[:, None, :, None] == docs[:, None, None, :])
        hidden = hidden_states(model, batch.input_ids, batch.position_ids, mask)
        return idlm_loss(hidden, head, batch, alpha, cfg.balance, cfg.distill)

    def step_fn(
        step: int,
        input_ids: torch.Tensor,
        loss_mask: torch.Tensor,
        clean_loss: torch.Tensor,
        doc_ids: torch.Tensor | None = None,
    ):
        stride = stride_at(step, cfg, total_steps)
        batch = build_idlm_batch(input_ids, loss_mask, mask_token_id, clean_loss)
        if cfg.split_pass:
            parts = split_idlm_loss(
                model,
                batch,
                loss_mask,
                doc_ids,
                stride - 1,
                alpha,
                cfg.balance,
                cfg.distill,
                clean_grad,
            )
        else:
            parts = joint_loss(stride, batch, doc_ids)
        metrics = {
            "loss": float(parts.total.detach()),
            "mask_ce": float(parts.mask_ce),
            "clean_ce": float(parts.clean_ce),
            "stride": float(stride),
        }
        return parts.total, metrics

    return step_fn
