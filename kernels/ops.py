"""The one place that chooses between the Triton kernels and the PyTorch references.

``auto`` (the default) runs Triton when the tensors are on CUDA and Triton imports, the reference
otherwise. Tests force a backend with ``set_backend`` / ``use_backend`` or the environment variable
``IDLM_KERNEL_BACKEND`` (``auto``, ``triton``, ``ref``); ``triton`` on CPU tensors needs
``TRITON_INTERPRET=1``. Call sites never branch on the platform.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from typing import Literal, get_args

import torch
from torch import Tensor

from idlm_kernels.gated_lora import (
    LoraWeights,
    PackedLora,
    gated_lora_autograd,
    gated_lora_packed,
    gated_lora_ref,
    gated_lora_runs,
)
from idlm_kernels.isd_sample import IsdStep, isd_verify_and_draft_ref

Backend = Literal["auto", "triton", "ref"]
_BACKENDS: tuple[str, ...] = get_args(Backend)


def _validated(name: str) -> Backend:
    if name not in _BACKENDS:
        raise ValueError(f"kernel backend {name!r} is not one of {_BACKENDS}")
    return name  # type: ignore[return-value]


_backend: Backend = _validated(os.environ.get("IDLM_KERNEL_BACKEND", "auto"))


def set_backend(name: Backend) -> None:
    """Force ``triton`` or ``ref`` everywhere, or restore ``auto``."""
    global _backend
    _backend = _validated(name)


def get_backend() -> Backend:
    return _backend


@contextmanager
def use_backend(name: Backend) -> Iterator[None]:
    """Temporarily force a backend (tests)."""
    previous = _backend
    set_backend(name)
    try:
        yield
    finally:
        set_backend(previous)


@cache
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreted(kernel: object) -> bool:
    """True when a ``@triton.jit`` kernel was defined under Triton's CPU interpreter.

    Decided per kernel object, not by reading TRITON_INTERPRET at call time: the variable only
    matters when the kernel's module is imported, and tests restore it afterwards.
    """
    return type(kernel).__name__ == "InterpretedFunction"


def use_triton(tensor: Tensor) -> bool:
    """True when the op on ``tensor`` should run its Triton kernel."""
    if _backend == "ref":
        return False
    if _backend == "triton":
        if not triton_available():
            raise RuntimeError("IDLM kernel backend 'triton' forced but triton is not importable")
        return True
    return tensor.is_cuda and triton_available()


def isd_verify_and_draft(
    logits: Tensor,
    draft_token_ids: Tensor,
    draft_probs: Tensor,
    num_draft_tokens: Tensor,
    num_mask_tokens: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    uniforms: Tensor,
    noise: Tensor,
    mask_token_id: int,
    max_num_draft_tokens: int | None = None,
    draft_prob_index: Tensor | None = None,
) -> IsdStep:
    """Verify drafts and sample the next ones; see ``idlm_kernels.isd_sample`` for the semantics
    (``draft_prob_index``: the row of ``draft_probs`` of each draft, -1 for a point mass)."""
    if use_triton(logits):
        from idlm_kernels.isd_sample_triton import isd_verify_and_draft_triton as impl
    else:
        impl = isd_verify_and_draft_ref
    return impl(
        logits,
        draft_token_ids,
        draft_probs,
        num_draft_tokens,
        num_mask_tokens,
        temperature,
        top_k,
        top_p,
        uniforms,
        noise,
        mask_token_id,
        max_num_draft_tokens,
        draft_prob_index,
    )


def gated_lora(
    y: Tensor,
    x: Tensor,
    lora_a: LoraWeights,
    lora_b: LoraWeights,
    rows: Tensor,
    scale: float,
    output_slices: Sequence[int] | None = None,
) -> Tensor:
    """``y[rows] += scale * (x[rows] @ A.T) @ B.T`` in place (per slice if packed); returns ``y``.

    Differentiable in x, lora_a and lora_b when autograd needs it. ``rows`` empty returns ``y``
    untouched without launching anything.
    """
    if rows.numel() == 0:
        return y
    if use_triton(y):
        from idlm_kernels.gated_lora_triton import gated_lora_triton as impl
    else:
        impl = gated_lora_ref
    weights = [lora_a] if isinstance(lora_a, Tensor) else list(lora_a)
    weights += [lora_b] if isinstance(lora_b, Tensor) else list(lora_b)
    # y counts too: the Triton kernel writes through a raw pointer, so an autograd-tracked y must
    # go through the Function (mark_dirty) for its in-place change to be recorded.
    needs_grad = torch.is_grad_enabled() and (
        y.requires_grad or x.requires_grad or any(w.requires_grad for w in weights)
    )
    if needs_grad:
        return gated_lora_autograd(impl, y, x, lora_a, lora_b, rows, scale, output_slices)
    return impl(y, x, lora_a, lora_b, rows, scale, output_slices)


# Up to this many runs of gated rows, ``gated_lora_runs`` beats the gather of ``gated_lora_packed``
# on the CPU path (`benchmarks/gated_lora_cpu.py --requests 1 2 4 8 --rows 1 3 --base`, SmolLM2's
# shapes, one thread: 8.0 against 11.9 ms per forward at one request and one MASK row, 10.7
# against 12.6 at two, 16.9 against 13.7 at four).
MAX_RUNS = 2


def gated_lora_inference(
    y: Tensor,
    x: Tensor,
    lora_a: LoraWeights,
    lora_b: LoraWeights,
    packed: PackedLora,
    rows: Tensor,
    scale: float,
    output_slices: Sequence[int] | None = None,
    runs: Sequence[tuple[int, int]] | None = None,
) -> Tensor:
    """``gated_lora`` for a serving layer (no autograd, no padding rows): the Triton kernel where
    it runs, else the reference on the layer's pre-packed weights (``pack_lora``): by runs of
    consecutive rows when the caller gives ``runs`` (the same rows as ``[start, end)`` pairs) and
    they are few, by a gather of the rows otherwise."""
    if rows.numel() == 0:
        return y
    if use_triton(y):
        from idlm_kernels.gated_lora_triton import gated_lora_triton

        return gated_lora_triton(y, x, lora_a, lora_b, rows, scale, output_slices)
    if runs is not None and len(runs) <= MAX_RUNS:
        return gated_lora_runs(y, x, packed, runs)
    return gated_lora_packed(y, x, packed, rows)
