"""Lossless mode: a LoRA adapter whose delta is applied on MASK rows only (the gate).

vLLM-free. Every clean row (prompt, last token, drafts, bonus row) runs the untouched
base layer, so every target distribution, and hence every emitted token, is the base
model's. Layer rule (ISD.md section 4): run the base layer, then add
`scale * B(A(x))` on the gated rows only (`idlm_kernels.ops.gated_lora_inference`); no zero-gate
multiplication, no fusion into the base GEMM; with no gated rows the layer costs nothing
more than the base layer.

Adapters: PEFT LoRA (`adapter_config.json` + `adapter_model.safetensors`) with target
modules among q/k/v/o/gate/up/down projections, from `idlm-train lora` (plus
`idlm_gate.json` and optionally a trained MASK embedding row) or the published layout.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from idlm_kernels.gated_lora import pack_lora, row_runs
from idlm_kernels.ops import gated_lora_inference

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
SUPPORTED_MODULES = ATTENTION + MLP
_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


@dataclass
class GatedAdapter:
    """LoRA weights per (layer, module), their scale, and an optional MASK embedding row."""

    path: str
    scale: float
    target_modules: tuple[str, ...]
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(repr=False)
    mask_embedding: torch.Tensor | None = field(default=None, repr=False)

    @property
    def rank(self) -> int:
        return next(iter(self.weights.values()))[0].shape[0]


def _read_config(path: Path) -> dict[str, Any]:
    config_path = path / "adapter_config.json"
    if not config_path.is_file():
        raise ValueError(f"idlm: draft_lora {path} has no adapter_config.json (not a PEFT adapter)")
    config = json.loads(config_path.read_text())
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"idlm: draft_lora {path} is a {config['peft_type']} adapter, not LoRA")
    for key in ("rank_pattern", "alpha_pattern"):
        if config.get(key):
            raise ValueError(f"idlm: draft_lora {path}: per-module {key} is not supported")
    modules = config.get("target_modules") or []
    modules = [modules] if isinstance(modules, str) else list(modules)
    unsupported = sorted(set(modules) - set(SUPPORTED_MODULES))
    if unsupported:
        raise ValueError(
            f"idlm: draft_lora {path} targets {unsupported}; supported: {list(SUPPORTED_MODULES)}"
        )
    return config


def load_adapter(adapter_dir: str | Path) -> GatedAdapter:
    from safetensors.torch import load_file

    path = Path(adapter_dir)
    config = _read_config(path)
    weights_path = path / "adapter_model.safetensors"
    if not weights_path.is_file():
        raise ValueError(f"idlm: draft_lora {path} has no adapter_model.safetensors")
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    mask_embedding = None
    for key, tensor in load_file(weights_path).items():
        match = _KEY.search(key)
        if match:
            layer, module, ab = int(match[1]), match[2], match[3]
            pairs.setdefault((layer, module), {})[ab] = tensor.float()
        elif "trainable_tokens_delta" in key or "embed_tokens" in key:
            mask_embedding = (
                tensor.float().reshape(-1) if tensor.numel() == tensor.shape[-1] else None
            )
        else:
            raise ValueError(f"idlm: draft_lora {path}: unexpected tensor {key}")
    incomplete = sorted(k for k, v in pairs.items() if set(v) != {"A", "B"})
    if incomplete or not pairs:
        raise ValueError(
            f"idlm: draft_lora {path}: missing lora_A/lora_B for {incomplete or 'all'}"
        )
    gate_path = path / "idlm_gate.json"
    if gate_path.is_file():
        gate = json.loads(gate_path.read_text())
        if gate.get("mask_embedding"):
            mask_embedding = load_file(path / gate["mask_embedding"])["mask_embedding"].float()
    r = int(config.get("r", 8))
    alpha = float(config.get("lora_alpha", r))
    scale = alpha / (r**0.5) if config.get("use_rslora") else alpha / r
    weights = {k: (v["A"], v["B"]) for k, v in pairs.items()}
    modules = tuple(sorted({m for _, m in weights}))
    return GatedAdapter(str(path), scale, modules, weights, mask_embedding)


def expected_shapes(hf_config: Any) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each projection of a Qwen3-style config."""
    hidden = hf_config.hidden_size
    head_dim = getattr(hf_config, "head_dim", None) or hidden // hf_config.num_attention_heads
    q = hf_config.num_attention_heads * head_dim
    kv = hf_config.num_key_value_heads * head_dim
    inter = hf_config.intermediate_size
    return {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }


def check_adapter(adapter: GatedAdapter, hf_config: Any) -> None:
    """Refuse an adapter that does not fit the base model, naming the mismatch."""
    shapes = expected_shapes(hf_config)
    layers = hf_config.num_hidden_layers
    for (layer, module), (a, b) in sorted(adapter.weights.items()):
        if layer >= layers:
            raise ValueError(
                f"idlm: draft_lora {adapter.path} has weights for layer {layer}, "
                f"the base model has {layers} layers"
            )
        fan_in, fan_out = shapes[module]
        if a.shape[1] != fan_in or b.shape[0] != fan_out or a.shape[0] != b.shape[1]:
            raise ValueError(
                f"idlm: draft_lora {adapter.path}: layer {layer} {module} has lora_A "
                f"{tuple(a.shape)} / lora_B {tuple(b.shape)}, the base model needs "
                f"[r, {fan_in}] / [{fan_out}, r]"
            )
    if (
        adapter.mask_embedding is not None
        and adapter.mask_embedding.numel() != hf_config.hidden_size
    ):
        raise ValueError(
            f"idlm: draft_lora {adapter.path}: MASK embedding of size "
            f"{adapter.mask_embedding.numel()}, the base model's hidden size is {hf_config.hidden_size}"
        )


class GateState:
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


class GatedLinear(nn.Module):
    """A (possibly packed) linear layer plus a LoRA delta on the gated rows.

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
        gate: GateState,
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
