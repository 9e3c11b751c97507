"""Let transformers (and so vLLM) read the published I-DLM config without remote code."""

from __future__ import annotations

from transformers import AutoConfig, Qwen3Config


class SdarConfig(Qwen3Config):
    """`model_type: sdar`: Qwen3 fields plus block_size and mask_token_id."""

    model_type = "sdar"


def install() -> None:
    AutoConfig.register("sdar", SdarConfig, exist_ok=True)
