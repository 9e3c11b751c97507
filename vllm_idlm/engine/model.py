"""The I-DLM model classes vLLM serves: a causal LM with the MASK token never a valid output.

One mixin over vLLM's own model classes, one class per family: `IdlmForCausalLM` (Qwen3:
checkpoints written by `idlm-train`, and the published `SDARForCausalLM` layout) and
`IdlmLlamaForCausalLM` (Llama, e.g. SmolLM2). The weights are the family's plain weights.
In lossless mode the same classes carry the gated adapter (`draft_lora`), active on MASK
rows only.
"""

from __future__ import annotations

import torch

from vllm_idlm.config import ADDITIONAL_CONFIG_KEY
from vllm_idlm.formats.adapter import check_fits, read_adapter
from vllm_idlm.formats.checkpoint import architecture_for
from vllm_idlm.gated_lora import GateRows, PackedGatedLinear
from vllm_idlm.seam.vllm import LlamaForCausalLM, Qwen3ForCausalLM


def mask_token_id_of(vllm_config) -> int | None:
    options = (vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY) or {}
    if options.get("mask_token_id") is not None:
        return int(options["mask_token_id"])
    value = getattr(vllm_config.model_config.hf_config, "mask_token_id", None)
    return None if value is None else int(value)


class _IdlmMixin:
    """MASK forced to -inf in every distribution; the gated adapter on MASK rows."""

    def _init_idlm(self, vllm_config) -> None:
        model_type = getattr(vllm_config.model_config.hf_config, "model_type", None)
        if architecture_for(model_type) != type(self).__name__:
            raise ValueError(
                f"idlm: {type(self).__name__} cannot serve a {model_type!r} checkpoint; "
                f"its architecture is {architecture_for(model_type)}"
            )
        self.mask_token_id = mask_token_id_of(vllm_config)
        options = (vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY) or {}
        self.draft_lora = options.get("draft_lora")
        self.gate = GateRows() if self.draft_lora else None

    def forward(
        self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs
    ):
        if self.gate is not None:
            # Open the gate on MASK rows: MASK ids only ever come from ISD's draft slots
            # (prompts containing MASK are refused before they reach the engine).
            if input_ids is None:
                self.gate.rows = torch.zeros(0, dtype=torch.long, device=positions.device)
            else:
                self.gate.rows = (input_ids == self.mask_token_id).nonzero().flatten()
        return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)

    def load_weights(self, weights):
        loaded = super().load_weights(weights)
        if self.draft_lora:
            self._install_gated_adapter()
        return loaded

    def _install_gated_adapter(self) -> None:
        adapter = read_adapter(self.draft_lora)
        check_fits(adapter, self.config)
        weight = self.model.embed_tokens.weight
        if adapter.mask_embedding is not None:
            with torch.no_grad():
                weight[self.mask_token_id] = adapter.mask_embedding.to(weight)
        for i, layer in enumerate(self.model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            packed = [
                (
                    attn,
                    "qkv_proj",
                    ("q_proj", "k_proj", "v_proj"),
                    [attn.q_size, attn.kv_size, attn.kv_size],
                ),
                (attn, "o_proj", ("o_proj",), [attn.o_proj.output_size]),
                (
                    mlp,
                    "gate_up_proj",
                    ("gate_proj", "up_proj"),
                    list(mlp.gate_up_proj.output_sizes),
                ),
                (mlp, "down_proj", ("down_proj",), [mlp.down_proj.output_size]),
            ]
            for owner, name, modules, sizes in packed:
                slices = [adapter.weights.get((i, m)) for m in modules]
                if any(s is not None for s in slices):
                    gated = PackedGatedLinear(
                        getattr(owner, name), slices, sizes, adapter.scale, self.gate
                    )
                    gated.move_(weight.device, weight.dtype)
                    setattr(owner, name, gated)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        logits = super().compute_logits(hidden_states)
        if logits is not None and self.mask_token_id is not None:
            # MASK is never a valid output, in plain decoding and in ISD alike.
            logits[..., self.mask_token_id] = float("-inf")
        return logits


class IdlmForCausalLM(_IdlmMixin, Qwen3ForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self._init_idlm(vllm_config)


class IdlmLlamaForCausalLM(_IdlmMixin, LlamaForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self._init_idlm(vllm_config)
