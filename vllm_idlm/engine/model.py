"""The I-DLM model class vLLM serves: Qwen3 with the MASK token never a valid output.

Registered for `IdlmForCausalLM` (checkpoints written by `idlm-train`) and
`SDARForCausalLM` (the published I-DLM layout). The weights are plain Qwen3 weights.
"""

from __future__ import annotations

import torch
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

from vllm_idlm.config import ADDITIONAL_CONFIG_KEY


def mask_token_id_of(vllm_config) -> int | None:
    options = (vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY) or {}
    if options.get("mask_token_id") is not None:
        return int(options["mask_token_id"])
    value = getattr(vllm_config.model_config.hf_config, "mask_token_id", None)
    return None if value is None else int(value)


class IdlmForCausalLM(Qwen3ForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.mask_token_id = mask_token_id_of(vllm_config)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        logits = super().compute_logits(hidden_states)
        if logits is not None and self.mask_token_id is not None:
            # MASK is never a valid output, in plain decoding and in ISD alike.
            logits[..., self.mask_token_id] = float("-inf")
        return logits
