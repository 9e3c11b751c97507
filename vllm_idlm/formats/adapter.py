"""The gated adapter's files: written by `idlm-train lora`, read by serving and training.

A PEFT LoRA directory (`adapter_config.json`, `adapter_model.safetensors`) whose target
modules are among the decoder's attention and MLP projections (`TARGET_MODULES`), plus
`idlm_gate.json` (the MASK id and strides N, `checkpoint.idlm_block`, and `"gate":
"mask_rows"`) and, when trained, the MASK embedding row (`idlm_mask_embedding.safetensors`).
The published layout has no idlm_gate.json (the MASK id then comes from the base tokenizer)
and may carry the MASK row among its tensors.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_idlm.formats.checkpoint import (
    MASK_TOKEN,
    CheckpointFacts,
    idlm_block,
    read_checkpoint_facts,
)

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
TARGET_MODULES = ATTENTION + MLP
GATE_FILE = "idlm_gate.json"
MASK_EMBED_FILE = "idlm_mask_embedding.safetensors"
_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")

if TYPE_CHECKING:
    import torch

LoraPair = tuple["torch.Tensor", "torch.Tensor"]  # lora_A [r, in], lora_B [out, r]


def layer_module(name: str) -> tuple[int, str] | None:
    """(layer, module) of a decoder projection's name or PEFT key ("...layers.3.mlp.up_proj")."""
    match = re.search(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)", name)
    return (int(match[1]), match[2]) if match else None


def peft_key(layer: int, module: str, ab: str) -> str:
    group = "self_attn" if module in ATTENTION else "mlp"
    return f"base_model.model.model.layers.{layer}.{group}.{module}.lora_{ab}.weight"


@dataclass
class GatedLoraWeights:
    """A gated adapter as read from its files: LoRA pairs per (layer, module), their scale,
    the optional MASK embedding row, and the gate's facts (None for the published layout)."""

    path: str
    r: int
    alpha: float
    scale: float
    target_modules: tuple[str, ...]
    weights: dict[tuple[int, str], LoraPair] = field(repr=False)
    mask_embedding: torch.Tensor | None = field(default=None, repr=False)
    gate: dict[str, Any] | None = None

    @property
    def rank(self) -> int:
        return next(iter(self.weights.values()))[0].shape[0]


def write_adapter(
    out: Path,
    weights: dict[tuple[int, str], LoraPair],
    r: int,
    alpha: float,
    base_path: str,
    mask_token_id: int,
    strides: tuple[int, ...],
    recipe: dict[str, Any],
    mask_embedding: torch.Tensor | None = None,
) -> Path:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_path,
        "r": r,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": sorted({m for _, m in weights}),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "use_rslora": False,
        "init_lora_weights": True,
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {
        peft_key(layer, module, ab): t.detach().contiguous().cpu()
        for (layer, module), pair in sorted(weights.items())
        for ab, t in zip("AB", pair, strict=True)
    }
    save_file(tensors, str(out / "adapter_model.safetensors"))
    gate = {"gate": "mask_rows", **idlm_block(mask_token_id, strides, recipe)}
    if mask_embedding is not None:
        row = {"mask_embedding": mask_embedding.detach().contiguous().cpu()}
        save_file(row, str(out / MASK_EMBED_FILE))
        gate["mask_embedding"] = MASK_EMBED_FILE
    (out / GATE_FILE).write_text(json.dumps(gate, indent=2) + "\n")
    return out


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
    unsupported = sorted(set(modules) - set(TARGET_MODULES))
    if unsupported:
        raise ValueError(
            f"idlm: draft_lora {path} targets {unsupported}; supported: {list(TARGET_MODULES)}"
        )
    return config


def read_adapter(adapter_dir: str | Path) -> GatedLoraWeights:
    """The adapter's weights, checked as a whole (the files, their keys, complete pairs)."""
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
    gate = None
    if (path / GATE_FILE).is_file():
        gate = json.loads((path / GATE_FILE).read_text())
        if gate.get("mask_embedding"):
            mask_embedding = load_file(path / gate["mask_embedding"])["mask_embedding"].float()
    r = int(config.get("r", 8))
    alpha = float(config.get("lora_alpha", r))
    scale = alpha / (r**0.5) if config.get("use_rslora") else alpha / r
    weights = {k: (v["A"], v["B"]) for k, v in pairs.items()}
    modules = tuple(sorted({m for _, m in weights}))
    return GatedLoraWeights(str(path), r, alpha, scale, modules, weights, mask_embedding, gate)


def expected_shapes(hf_config: Any) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each projection of a Qwen3- or Llama-style config."""
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


def check_fits(adapter: GatedLoraWeights, hf_config: Any) -> None:
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
    row = adapter.mask_embedding
    if row is not None and row.numel() != hf_config.hidden_size:
        raise ValueError(
            f"idlm: draft_lora {adapter.path}: MASK embedding of size {row.numel()}, "
            f"the base model's hidden size is {hf_config.hidden_size}"
        )


def read_adapter_facts(adapter_dir: str | Path, tokenizer: Any = None) -> CheckpointFacts:
    """The MASK id and strides N recorded by `idlm-train lora` (idlm_gate.json); for a
    published PEFT adapter without it, the id of the MASK token in the base tokenizer."""
    gate_path = Path(adapter_dir) / GATE_FILE
    if gate_path.is_file():
        return read_checkpoint_facts(json.loads(gate_path.read_text()), str(gate_path))
    mask_token_id = None
    if tokenizer is not None:
        mask_token_id = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
        if mask_token_id == getattr(tokenizer, "unk_token_id", None):
            mask_token_id = None
    if mask_token_id is None:
        raise ValueError(
            f"idlm: draft_lora {adapter_dir} has no {GATE_FILE} and the base tokenizer has "
            f"no {MASK_TOKEN} token: the MASK id is unknown"
        )
    return CheckpointFacts(int(mask_token_id), (), str(adapter_dir))
