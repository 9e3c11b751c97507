"""An I-DLM checkpoint: the MASK token, and the facts its config.json carries.

A checkpoint written by `idlm-train` is the base model's files with, in config.json, the
plugin's architecture for its family, a top-level `mask_token_id` and an `"idlm"` block
{mask_token_id, strides, block_size, recipe, format_version}. The published layout
(`model_type: sdar`) carries `mask_token_id` and `block_size` = N - 1. MASK is never a valid
output: serving and the reference decoder set its logit to -inf in every row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MASK_TOKEN = "<|mask|>"
FORMAT_VERSION = 1
# model_type of a checkpoint -> the plugin's architecture that serves it as an I-DLM.
ARCHITECTURES = {
    "qwen3": "IdlmForCausalLM",
    "sdar": "IdlmForCausalLM",  # the published I-DLM layout (Qwen3 weights)
    "llama": "IdlmLlamaForCausalLM",
}


def architecture_for(model_type: str | None) -> str:
    """The architecture name that serves a checkpoint of `model_type` as an I-DLM."""
    if model_type not in ARCHITECTURES:
        raise ValueError(
            f"idlm: model_type {model_type!r} cannot be served as an I-DLM; "
            f"supported: {sorted(ARCHITECTURES)}"
        )
    return ARCHITECTURES[model_type]


def idlm_block(
    mask_token_id: int, strides: tuple[int, ...], recipe: dict[str, Any]
) -> dict[str, Any]:
    """The facts an I-DLM checkpoint (config.json's "idlm") or a gated adapter
    (idlm_gate.json) records: strides N as trained, the serving one last."""
    return {
        "mask_token_id": mask_token_id,
        "strides": list(strides),
        "block_size": strides[-1] - 1,
        "recipe": recipe,
        "format_version": FORMAT_VERSION,
    }


def checkpoint_config(model_type: str, mask_token_id: int, idlm: dict[str, Any]) -> dict[str, Any]:
    """The keys an I-DLM checkpoint's config.json gets over its base's."""
    return {
        "model_type": model_type,
        "architectures": [architecture_for(model_type)],
        "mask_token_id": mask_token_id,
        "idlm": idlm,
    }


@dataclass(frozen=True)
class CheckpointFacts:
    """The I-DLM facts a checkpoint (or a gated adapter) carries."""

    mask_token_id: int
    strides: tuple[int, ...]  # strides N it was trained for (K = N - 1 drafts)
    source: str

    def check_num_drafts(self, num_drafts: int) -> str | None:
        """A warning when K + 1 is not among the strides the checkpoint was trained for."""
        if self.strides and num_drafts + 1 not in self.strides:
            return (
                f"idlm: num_speculative_tokens={num_drafts} means stride N={num_drafts + 1}, "
                f"but {self.source} was trained for strides {list(self.strides)}; "
                "acceptance will likely be low"
            )
        return None


def read_checkpoint_facts(hf_config: Any, source: str) -> CheckpointFacts:
    """The MASK id and trained strides of an HF config object or dict: ours
    (`mask_token_id`, `idlm.strides`), an adapter's flat idlm_gate.json, or the published
    layout (`mask_token_id`, `block_size` = N - 1)."""
    get = (
        hf_config.get if isinstance(hf_config, dict) else lambda k, d=None: getattr(hf_config, k, d)
    )
    idlm = get("idlm") or {}
    mask_token_id = get("mask_token_id", None)
    if mask_token_id is None:
        mask_token_id = idlm.get("mask_token_id")
    if mask_token_id is None:
        raise ValueError(
            f"idlm: {source} is not an I-DLM checkpoint: its config has no mask_token_id "
            "(convert it with `idlm-train convert`, or serve a base model with a gated "
            "adapter via draft_lora)"
        )
    strides = tuple(idlm.get("strides") or get("strides", None) or ())
    if not strides and get("block_size", None):
        strides = (int(get("block_size")) + 1,)
    return CheckpointFacts(int(mask_token_id), strides, source)


def checkpoint_facts(path: str | Path) -> CheckpointFacts:
    """`read_checkpoint_facts` of a checkpoint directory's config.json."""
    config = Path(path) / "config.json"
    return read_checkpoint_facts(json.loads(config.read_text()), str(path))
