"""Gated LoRA (ISD.md section 4): the adapter's delta is added only on MASK rows.

Base first, then the delta on gated rows: gather the MASK rows of x, apply A then B, scale, add
back into those rows of the base output. With no MASK row in the batch the layer returns the
base output tensor itself, so it is `torch.equal` to the base layer by construction.
The gate is set once per forward by a hook on the input embedding that sees the token ids.
Serving's layer is `vllm_idlm.gated_lora.PackedGatedLinear` (over vLLM's packed projections);
both add the delta with `idlm_kernels.ops`, and the adapter's files are
`vllm_idlm.formats.adapter`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from idlm_kernels.ops import gated_lora

from .config import LoraConfig


def gated_lora_delta(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    rows: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """y[rows] += scale * B(A(x[rows])) on 2D y [T, out], x [T, in]; other rows untouched.

    The math (and its autograd) is the project's op `idlm_kernels.ops.gated_lora`, shared with
    serving, so training and the plugin add the delta the same way.
    """
    return gated_lora(y, x, lora_a, lora_b, rows, scale)


@dataclass
class MaskGate:
    """Flat row indices (into batch*seq) of the MASK rows of the current forward; None = closed."""

    mask_token_id: int
    rows: torch.Tensor | None = None
    enabled: bool = True

    def set_from_ids(self, input_ids: torch.Tensor) -> None:
        if not self.enabled:
            self.rows = None
            return
        rows = (input_ids.reshape(-1) == self.mask_token_id).nonzero().squeeze(1)
        self.rows = rows if rows.numel() else None


class GatedLoraLinear(nn.Module):
    """A frozen nn.Linear plus a LoRA (lora_A: in->r, lora_B: r->out) applied on gated rows only."""

    def __init__(self, base: nn.Linear, r: int, alpha: float, gate: MaskGate) -> None:
        super().__init__()
        self.base = base
        self.lora_A = nn.Linear(
            base.in_features, r, bias=False, dtype=base.weight.dtype, device=base.weight.device
        )
        self.lora_B = nn.Linear(
            r, base.out_features, bias=False, dtype=base.weight.dtype, device=base.weight.device
        )
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.scaling = alpha / r
        self.gate = gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        rows = self.gate.rows
        if rows is None:
            return y
        y2 = gated_lora_delta(
            y.reshape(-1, y.shape[-1]),
            x.reshape(-1, x.shape[-1]),
            self.lora_A.weight,
            self.lora_B.weight,
            rows,
            self.scaling,
        )
        return y2.view(y.shape)


@dataclass
class AttachedAdapter:
    """What `attach_gated_lora` added to a model: the gate, the wrapped layers, the MASK row."""

    gate: MaskGate
    cfg: LoraConfig
    layers: dict[str, GatedLoraLinear] = field(default_factory=dict)
    mask_embedding: nn.Parameter | None = None

    def parameters(self) -> list[nn.Parameter]:
        params = [p for m in self.layers.values() for p in (m.lora_A.weight, m.lora_B.weight)]
        return params + ([self.mask_embedding] if self.mask_embedding is not None else [])


def attach_gated_lora(model, cfg: LoraConfig, mask_token_id: int) -> AttachedAdapter:
    """Freeze `model`, wrap its target linears with gated LoRA, hook the gate (and MASK row)."""
    for p in model.parameters():
        p.requires_grad_(False)
    adapter = AttachedAdapter(MaskGate(mask_token_id), cfg)
    trunk = model.model
    for name, module in list(trunk.named_modules()):
        for child_name, child in list(module.named_children()):
            if child_name in cfg.target_modules and isinstance(child, nn.Linear):
                wrapped = GatedLoraLinear(child, cfg.r, cfg.alpha, adapter.gate)
                setattr(module, child_name, wrapped)
                adapter.layers[f"model.{name}.{child_name}"] = wrapped
    if not adapter.layers:
        raise ValueError(f"no linear layer named {list(cfg.target_modules)} found in the model")
    embed = trunk.embed_tokens
    if cfg.train_mask_embedding:
        row = embed.weight[mask_token_id].detach().clone()
        adapter.mask_embedding = nn.Parameter(row)
        model.register_parameter("idlm_mask_embedding", adapter.mask_embedding)
    embed.register_forward_pre_hook(_gate_hook(adapter.gate))
    embed.register_forward_hook(_mask_row_hook(adapter))
    return adapter


def _gate_hook(gate: MaskGate):
    def hook(module, args):
        gate.set_from_ids(args[0])

    return hook


def _mask_row_hook(adapter: AttachedAdapter):
    """Replace the embedding of gated rows by the trainable MASK row (clean rows untouched)."""

    def hook(module, args, output):
        rows, row = adapter.gate.rows, adapter.mask_embedding
        if rows is None or row is None:
            return output
        flat = output.reshape(-1, output.shape[-1])
        flat = flat.index_copy(0, rows, row.to(flat.dtype).expand(rows.numel(), -1))
        return flat.view(output.shape)

    return hook
