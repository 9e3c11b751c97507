"""Lossless mode: a LoRA adapter whose delta is applied on MASK rows only (the gate).

vLLM-free. Every clean row (prompt, last token, drafts, bonus row) runs the untouched
base layer, so every target distribution, and hence every emitted token, is the base
model's. Layer rule (ISD.md section 4): run the base layer, then add
`scale * B(A(x))` on the gated rows only (`idlm_kernels.ops.gated_lora_inference`); no zero-gate
multiplication, no fusion into the base GEMM; with no gated rows the layer costs nothing
more than the base layer.

The adapter's files are read by `vllm_idlm.formats.adapter` (the one reader, shared with
training); this module holds the serving layer. Training's layer is
`idlm_training.gated_lora.GatedLoraLinear` (trainable nn.Linear pairs, one projection each).
"""

from __future__ import annotations

import torch
from torch import nn

from idlm_kernels.gated_lora import pack_lora, row_runs
from idlm_kernels.ops import gated_lora_inference


class GateRows:
    """The rows of the current forward whose gate is open (shared by all gated layers), and on
    the CPU path the same rows as runs of consecutive rows: set together, once per forward, so
    that every layer can update few runs in place without a gather (`gated_lora_inference`)."""

    def __init__(self) -> None:
        self.rows = torch.zeros(0, dtype=torch.long)

    @property
    def rows(self) -> torch.Tensor:
        return self._rows

    @rows.setter
    def rows(self, rows: torch.Tensor) -> None:
        self._rows = rows
        # On an accelerator the rows stay there (reading them would sync the device).
        self.runs = row_runs(rows.tolist()) if rows.device.type == "cpu" else None


class PackedGatedLinear(nn.Module):
    """A (possibly packed) vLLM linear layer plus a LoRA delta on the gated rows.

    `slices[i]` is the (lora_a, lora_b) pair of output slice i, or None for a slice the
    adapter does not target (it gets a rank-0 pair: a no-op). The base layer may return
    a tensor or vLLM's `(output, bias)` tuple.
    """

    def __init__(
        self,
        base: nn.Module,
        slices: list[tuple[torch.Tensor, torch.Tensor] | None],
        output_sizes: list[int],
        scale: float,
        gate: GateRows,
    ) -> None:
        super().__init__()
        self.base = base
        self.gate = gate
        self.scale = scale
        self.output_sizes = [int(s) for s in output_sizes]
        fan_in = next(a.shape[1] for a, _ in (p for p in slices if p is not None))
        self.lora_a = [p[0] if p else torch.zeros(0, fan_in) for p in slices]
        self.lora_b = [
            p[1] if p else torch.zeros(size, 0)
            for p, size in zip(slices, self.output_sizes, strict=True)
        ]
        self.packed = pack_lora(self.lora_a, self.lora_b, scale, self.output_sizes)

    def forward(self, x: torch.Tensor):
        result = self.base(x)
        rows = self.gate.rows
        if rows.numel() == 0:
            return result
        out = result[0] if isinstance(result, tuple) else result
        gated_lora_inference(
            out,
            x,
            self.lora_a,
            self.lora_b,
            self.packed,
            rows,
            self.scale,
            self.output_sizes,
            self.gate.runs,
        )
        return result

    def move_(self, device: torch.device, dtype: torch.dtype) -> None:
        self.lora_a = [a.to(device=device, dtype=dtype).contiguous() for a in self.lora_a]
        self.lora_b = [b.to(device=device, dtype=dtype).contiguous() for b in self.lora_b]
        self.packed = pack_lora(self.lora_a, self.lora_b, self.scale, self.output_sizes)
