"""Export: HF checkpoint directories that carry the I-DLM facts the plugin needs.

- base: the plain model (`Qwen3ForCausalLM`, `LlamaForCausalLM`) whose tokenizer holds `<|mask|>`.
- idlm: the base's weights and model_type, the plugin's architecture of that family
  (`IdlmForCausalLM` for Qwen3, `IdlmLlamaForCausalLM` for Llama), top-level `mask_token_id`, and an
  `"idlm"` block {mask_token_id, strides, block_size, recipe, format_version}.
- lora: PEFT LoRA files plus `idlm_gate.json` (and the trained MASK row, if any).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from vllm_idlm.config import architecture_for

from .config import FORMAT_VERSION, LoraConfig
from .gated_lora import GatedAdapter, attach_gated_lora

GATE_FILE = "idlm_gate.json"
MASK_EMBED_FILE = "idlm_mask_embedding.safetensors"


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
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True, state_dict=state_dict)
    save_tokenizer(tokenizer, out)
    idlm = {
        "mask_token_id": mask_token_id,
        "strides": list(strides),
        "block_size": strides[-1] - 1,
        "recipe": recipe,
        "format_version": FORMAT_VERSION,
    }
    patch_config(
        out,
        {
            "model_type": model.config.model_type,
            "architectures": [architecture_for(model.config.model_type)],
            "mask_token_id": mask_token_id,
            "idlm": idlm,
        },
    )
    return out


def peft_state_dict(adapter: GatedAdapter) -> dict[str, torch.Tensor]:
    """PEFT key names: base_model.model.<module path>.lora_{A,B}.weight."""
    out = {}
    for name, layer in adapter.layers.items():
        out[f"base_model.model.{name}.lora_A.weight"] = (
            layer.lora_A.weight.detach().contiguous().cpu()
        )
        out[f"base_model.model.{name}.lora_B.weight"] = (
            layer.lora_B.weight.detach().contiguous().cpu()
        )
    return out


def save_gated_lora(
    adapter: GatedAdapter,
    out: Path,
    base_path: str,
    strides: tuple[int, ...],
    recipe: dict[str, Any],
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    cfg = adapter.cfg
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_path,
        "r": cfg.r,
        "lora_alpha": cfg.alpha,
        "lora_dropout": 0.0,
        "target_modules": sorted(cfg.target_modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "use_rslora": False,
        "init_lora_weights": True,
    }
    (out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2) + "\n")
    save_file(peft_state_dict(adapter), str(out / "adapter_model.safetensors"))
    gate: dict[str, Any] = {
        "mask_token_id": adapter.gate.mask_token_id,
        "gate": "mask_rows",
        "strides": list(strides),
        "block_size": strides[-1] - 1,
        "recipe": recipe,
        "format_version": FORMAT_VERSION,
    }
    if adapter.mask_embedding is not None:
        save_file(
            {"mask_embedding": adapter.mask_embedding.detach().contiguous().cpu()},
            str(out / MASK_EMBED_FILE),
        )
        gate["mask_embedding"] = MASK_EMBED_FILE
    (out / GATE_FILE).write_text(json.dumps(gate, indent=2) + "\n")
    return out


def load_gated_lora(model, adapter_dir: Path) -> GatedAdapter:
    """Attach a saved gated adapter to a (base) model in place and return it."""
    adapter_dir = Path(adapter_dir)
    acfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    gate = json.loads((adapter_dir / GATE_FILE).read_text())
    cfg = LoraConfig(
        r=acfg["r"],
        alpha=acfg["lora_alpha"],
        target_modules=tuple(acfg["target_modules"]),
        train_mask_embedding="mask_embedding" in gate,
    )
    adapter = attach_gated_lora(model, cfg, gate["mask_token_id"])
    weights = load_file(str(adapter_dir / "adapter_model.safetensors"))
    with torch.no_grad():
        for name, layer in adapter.layers.items():
            layer.lora_A.weight.copy_(weights[f"base_model.model.{name}.lora_A.weight"])
            layer.lora_B.weight.copy_(weights[f"base_model.model.{name}.lora_B.weight"])
        if adapter.mask_embedding is not None:
            adapter.mask_embedding.copy_(
                load_file(str(adapter_dir / gate["mask_embedding"]))["mask_embedding"]
            )
    return adapter


def read_idlm_facts(path: Path) -> dict[str, Any]:
    """The `idlm` block of a checkpoint's config.json (or of a LoRA dir's idlm_gate.json)."""
    path = Path(path)
    if (path / GATE_FILE).is_file():
        return json.loads((path / GATE_FILE).read_text())
    cfg = json.loads((path / "config.json").read_text())
    if "idlm" not in cfg:
        raise ValueError(f"{path} is not an I-DLM checkpoint (no 'idlm' block in config.json)")
    return cfg["idlm"]
