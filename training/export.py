"""Export: HF checkpoint directories that carry the I-DLM facts the plugin needs.

- base: the plain model (`Qwen3ForCausalLM`, `LlamaForCausalLM`) whose tokenizer holds `<|mask|>`.
- idlm: the base's weights and model_type, with the config keys of
  `vllm_idlm.formats.checkpoint` (the plugin's architecture of that family, top-level
  `mask_token_id`, the `"idlm"` block with the strides N it was trained for).
- lora: the gated adapter's files (`vllm_idlm.formats.adapter`, the reader serving uses too).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from vllm_idlm.formats.adapter import LoraPair, layer_module, read_adapter, write_adapter
from vllm_idlm.formats.checkpoint import checkpoint_config, idlm_block

from .config import LoraConfig
from .gated_lora import AttachedAdapter, attach_gated_lora


def patch_config(out: Path, updates: dict[str, Any]) -> None:
    path = out / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(updates)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def save_tokenizer(tokenizer, out: Path) -> None:
    """Save, then make tokenizer_config.json self-contained for older loaders: the chat
    template inline (transformers 5 also writes chat_template.jinja) and the portable class."""
    tokenizer.save_pretrained(out)
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    if tokenizer.chat_template:
        cfg["chat_template"] = tokenizer.chat_template
    if cfg.get("tokenizer_class") == "TokenizersBackend":
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(cfg, indent=2) + "\n")


def save_base_checkpoint(model, tokenizer, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    save_tokenizer(tokenizer, out)
    patch_config(out, {"architectures": [type(model).__name__]})
    return out


def save_idlm_checkpoint(
    model,
    tokenizer,
    out: Path,
    mask_token_id: int,
    strides: tuple[int, ...],
    recipe: dict[str, Any],
    state_dict: dict | None = None,
) -> Path:
    """The I-DLM checkpoint, trained for strides N (`strides`, the serving one last)."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True, state_dict=state_dict)
    save_tokenizer(tokenizer, out)
    idlm = idlm_block(mask_token_id, strides, recipe)
    patch_config(out, checkpoint_config(model.config.model_type, mask_token_id, idlm))
    return out


def adapter_weights(adapter: AttachedAdapter) -> dict[tuple[int, str], LoraPair]:
    """The attached layers' (lora_A, lora_B) weights by (layer, module), as the files key them."""
    out = {}
    for name, layer in adapter.layers.items():
        key = layer_module(name)
        if key is None:
            raise ValueError(f"gated layer {name} is not a decoder layer's projection")
        out[key] = (layer.lora_A.weight, layer.lora_B.weight)
    return out


def save_gated_lora(
    adapter: AttachedAdapter,
    out: Path,
    base_path: str,
    strides: tuple[int, ...],
    recipe: dict[str, Any],
) -> Path:
    """The adapter's files, trained for strides N (`strides`)."""
    return write_adapter(
        out,
        adapter_weights(adapter),
        adapter.cfg.r,
        adapter.cfg.alpha,
        base_path,
        adapter.gate.mask_token_id,
        strides,
        recipe,
        adapter.mask_embedding,
    )


def load_gated_lora(model, adapter_dir: Path) -> AttachedAdapter:
    """Attach a saved gated adapter to a (base) model in place and return it; the files are
    read and checked by the reader serving uses."""
    files = read_adapter(adapter_dir)
    if files.gate is None:
        raise ValueError(f"{adapter_dir} has no idlm_gate.json: the MASK id is unknown")
    cfg = LoraConfig(
        r=files.r,
        alpha=files.alpha,
        target_modules=files.target_modules,
        train_mask_embedding=files.mask_embedding is not None,
    )
    adapter = attach_gated_lora(model, cfg, int(files.gate["mask_token_id"]))
    weights = adapter_weights(adapter)
    if set(weights) != set(files.weights):
        missing = sorted(set(weights) ^ set(files.weights))[:4]
        raise ValueError(f"{adapter_dir}: its layers do not match the model's ({missing} ...)")
    with torch.no_grad():
        for key, (lora_a, lora_b) in weights.items():
            lora_a.copy_(files.weights[key][0])
            lora_b.copy_(files.weights[key][1])
        if adapter.mask_embedding is not None:
            adapter.mask_embedding.copy_(files.mask_embedding)
    return adapter
