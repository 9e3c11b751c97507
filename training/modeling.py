"""The model side: build a Qwen3 from a shape, load a base (Qwen3 or Llama), run the trunk.

Training calls the trunk (`model.model`) with its own 4D mask and position ids and applies the
lm_head only to rows that carry a loss; transformers passes a 4D mask through unchanged.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .config import SUPPORTED_HEAD_DIMS, ModelShape

# Families whose HF class takes our 4D mask and position ids as given and whose projections
# are q/k/v/o/gate/up/down (the gated adapter's targets): Qwen3 and Llama (e.g. SmolLM2).
CONVERTIBLE = ("qwen3", "llama")


def qwen3_config(shape: ModelShape, eos_token_id: int, pad_token_id: int):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_position_embeddings,
        tie_word_embeddings=shape.tie_word_embeddings,
        rope_theta=shape.rope_theta,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
        torch_dtype="float32",
    )


def build_model(shape: ModelShape, eos_token_id: int, pad_token_id: int, seed: int):
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(qwen3_config(shape, eos_token_id, pad_token_id))
    set_attention(model, "sdpa")
    return model


def check_convertible(config) -> None:
    """Raise before training when the architecture is one we cannot serve as an I-DLM."""
    model_type = getattr(config, "model_type", None)
    if model_type not in CONVERTIBLE:
        raise ValueError(
            f"base model_type {model_type!r} cannot be converted: supported {list(CONVERTIBLE)}"
        )
    if getattr(config, "use_sliding_window", False):
        raise ValueError(
            f"base model_type {model_type!r} uses sliding-window attention, which the I-DLM mask does not model"
        )
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"base head_dim={head_dim} is not served by vLLM's CPU attention ({SUPPORTED_HEAD_DIMS})"
        )


def load_base(path: str | Path, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) of a base checkpoint; the architecture is checked before the weights load."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise ValueError(f"base model {str(path)!r} has no config.json")
    check_convertible(AutoConfig.from_pretrained(path))
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    set_attention(model, "sdpa")
    return model, tokenizer


def set_attention(model, kind: str) -> None:
    """ "sdpa" (dense 4D bool masks) or "flex_attention" (BlockMask)."""
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(kind)
    else:
        model.config._attn_implementation = kind


def trunk_and_head(model):
    """(decoder trunk, lm_head) of a causal LM, through any wrapper."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inner.model, inner.lm_head


def hidden_states(model, input_ids, position_ids=None, attention_mask=None) -> torch.Tensor:
    trunk, _ = trunk_and_head(model)
    out = trunk(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=attention_mask,
        use_cache=False,
    )
    return out.last_hidden_state


def count_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def cast_frozen_linears(model, dtype: torch.dtype) -> int:
    """Store the frozen nn.Linear weights in `dtype`; returns how many were cast.

    Under autocast to the same dtype this changes no result (autocast casts every linear
    weight to it before the matmul) but saves that cast at every call: autocast caches
    casts only for weights that require grad. Gated-LoRA training on CPU, SmolLM2, bf16:
    about 14% of the step time was these copies.
    """
    count = 0
    tied = model.get_input_embeddings().weight  # a tied lm_head shares it: the lookup stays fp32
    for module in model.modules():
        if (
            isinstance(module, torch.nn.Linear)
            and not module.weight.requires_grad
            and module.weight is not tied
        ):
            module.weight.data = module.weight.data.to(dtype)
            count += 1
    return count
