"""Gated LoRA: add a LoRA delta on the gated rows only, after the base layer has run.

``y[rows] += scale * (x[rows] @ lora_a.T) @ lora_b.T``, in place on ``y``. Rows outside ``rows`` are
never written, so with the gate closed (``rows`` empty) the layer output is bit-identical to the base
layer's (ISD.md section 4: never multiply a delta by a zero gate, never fold it into the base GEMM).

Packed layers (vLLM's ``qkv_proj``, ``gate_up_proj``) pass one ``(lora_a, lora_b)`` pair per output slice
and ``output_slices``, the slice widths along ``y``'s last dim; each slice may have its own rank.
``rows`` holds distinct row indices; entries < 0 are padding and skipped, so a CUDA-graph caller can
pass a fixed-size ``rows`` (as vLLM's LoRA kernels treat a -1 mapping).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

LoraWeights = Tensor | Sequence[Tensor]


class LoraSlice(NamedTuple):
    lora_a: Tensor  # [r, in]
    lora_b: Tensor  # [out_slice, r]
    offset: int  # first column of the slice in y
    size: int  # out_slice


def lora_slices(
    y: Tensor,
    x: Tensor,
    lora_a: LoraWeights,
    lora_b: LoraWeights,
    output_slices: Sequence[int] | None,
) -> list[LoraSlice]:
    """Validate shapes and split a (possibly packed) adapter into per-slice pairs."""
    if y.ndim != 2 or x.ndim != 2 or y.shape[0] != x.shape[0]:
        raise ValueError(f"y {tuple(y.shape)} and x {tuple(x.shape)} must be [T, out] and [T, in]")
    a_list = [lora_a] if isinstance(lora_a, Tensor) else list(lora_a)
    b_list = [lora_b] if isinstance(lora_b, Tensor) else list(lora_b)
    sizes = [y.shape[1]] if output_slices is None else [int(s) for s in output_slices]
    if not (len(a_list) == len(b_list) == len(sizes)):
        raise ValueError(
            f"{len(a_list)} lora_a, {len(b_list)} lora_b and {len(sizes)} output slices differ"
        )
    if sum(sizes) != y.shape[1]:
        raise ValueError(f"output_slices {sizes} sum to {sum(sizes)}, y has {y.shape[1]} columns")
    slices, offset = [], 0
    for a, b, size in zip(a_list, b_list, sizes, strict=True):
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != x.shape[1] or b.shape != (size, a.shape[0]):
            raise ValueError(
                f"lora_a {tuple(a.shape)} / lora_b {tuple(b.shape)} do not fit "
                f"in={x.shape[1]}, slice={size}"
            )
        slices.append(LoraSlice(a, b, offset, size))
        offset += size
    return slices


def gated_lora_ref(
    y: Tensor,
    x: Tensor,
    lora_a: LoraWeights,
    lora_b: LoraWeights,
    rows: Tensor,
    scale: float,
    output_slices: Sequence[int] | None = None,
) -> Tensor:
    """Reference and CPU path: matmuls in the inputs' dtype, then ``index_add_`` on the gated rows."""
    if rows.numel() == 0:
        return y
    rows = rows[rows >= 0]
    x_rows = x[rows]
    for s in lora_slices(y, x, lora_a, lora_b, output_slices):
        delta = (x_rows @ s.lora_a.T) @ s.lora_b.T * scale
        y.narrow(1, s.offset, s.size).index_add_(0, rows, delta.to(y.dtype))
    return y


class PackedLora(NamedTuple):
    """A (possibly packed) adapter for ``gated_lora_packed``: every slice's ``lora_a`` in one
    matrix (one matmul for all of them), each slice's ``lora_b`` transposed with the scale folded
    in, and where its rank's columns start."""

    a_t: Tensor  # [in, sum of ranks]
    b_t: tuple[Tensor, ...]  # per slice: [rank, out_slice]
    rank_starts: tuple[int, ...]


def pack_lora(
    lora_a: LoraWeights,
    lora_b: LoraWeights,
    scale: float,
    output_slices: Sequence[int] | None = None,
) -> PackedLora:
    """The weights ``gated_lora_packed`` takes, built once per layer."""
    a_list = [lora_a] if isinstance(lora_a, Tensor) else list(lora_a)
    b_list = [lora_b] if isinstance(lora_b, Tensor) else list(lora_b)
    sizes = [b.shape[0] for b in b_list] if output_slices is None else list(output_slices)
    fan_in = a_list[0].shape[1]
    empty_y = a_list[0].new_empty(0, sum(int(s) for s in sizes))
    slices = lora_slices(empty_y, a_list[0].new_empty(0, fan_in), a_list, b_list, sizes)
    starts, start = [], 0
    for s in slices:
        starts.append(start)
        start += s.lora_a.shape[0]
    return PackedLora(
        torch.cat([s.lora_a for s in slices]).T.contiguous(),
        tuple((s.lora_b * scale).T.contiguous() for s in slices),
        tuple(starts),
    )


def gated_lora_packed(y: Tensor, x: Tensor, packed: PackedLora, rows: Tensor) -> Tensor:
    """``gated_lora_ref`` for inference, on weights from ``pack_lora``: one gather, one shrink
    matmul for every slice, one expand matmul per slice and one ``index_add_`` (at the few MASK
    rows of a decode step, the reference's per-slice ops cost about as much as its arithmetic).
    ``rows`` holds no padding; the deltas equal the reference's up to rounding (the scale is
    applied to the weights)."""
    if rows.numel() == 0:
        return y
    h = x.index_select(0, rows) @ packed.a_t
    parts = [
        h[:, start : start + b_t.shape[0]] @ b_t
        for start, b_t in zip(packed.rank_starts, packed.b_t, strict=True)
    ]
    delta = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    return y.index_add_(0, rows, delta.to(y.dtype))


def row_runs(rows: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted distinct row indices as ``[start, end)`` runs of consecutive rows (a decode step's
    MASK rows: one run per request that drafts)."""
    runs: list[tuple[int, int]] = []
    for row in rows:
        if runs and runs[-1][1] == row:
            runs[-1] = (runs[-1][0], row + 1)
        else:
            runs.append((row, row + 1))
    return runs


def gated_lora_runs(
    y: Tensor, x: Tensor, packed: PackedLora, runs: Sequence[tuple[int, int]]
) -> Tensor:
    """``gated_lora_packed`` on gated rows given as ``[start, end)`` runs: per run one shrink
    matmul on a view of ``x`` and, per slice, one ``addmm_`` into the view of ``y`` it updates.
    No gather, no temporary delta, no ``index_add_``: fewer ops and allocations where the runs
    are few (``ops.gated_lora_inference`` picks it then). Rows outside the runs are never
    written; the deltas equal the reference's up to rounding (``addmm_`` accumulates into
    ``y`` directly)."""
    for start, end in runs:
        h = x[start:end] @ packed.a_t
        offset = 0
        for rank_start, b_t in zip(packed.rank_starts, packed.b_t, strict=True):
            rank, width = b_t.shape
            if rank:
                y[start:end, offset : offset + width].addmm_(
                    h[:, rank_start : rank_start + rank], b_t
                )
            offset += width
    return y


ForwardFn = Callable[..., Tensor]


class GatedLoraFunction(torch.autograd.Function):
    """Autograd for gated LoRA: forward by ``forward_fn`` (ref or Triton), backward in PyTorch.

    ``y``'s gradient passes through unchanged; x, lora_a and lora_b get the LoRA gradients of the
    gated rows (x's other rows get zero from this op).
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        y: Tensor,
        x: Tensor,
        rows: Tensor,
        scale: float,
        output_slices: tuple[int, ...],
        forward_fn: ForwardFn,
        *weights: Tensor,
    ) -> Tensor:
        a_list, b_list = list(weights[0::2]), list(weights[1::2])
        forward_fn(y, x, a_list, b_list, rows, scale, output_slices)
        ctx.mark_dirty(y)
        ctx.save_for_backward(x, rows, *weights)
        ctx.scale = scale
        ctx.output_slices = output_slices
        return y

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad_y: Tensor) -> tuple:  # type: ignore[override]
        x, rows, *weights = ctx.saved_tensors
        rows = rows[rows >= 0]
        scale, offsets = ctx.scale, _offsets(ctx.output_slices)
        # Under autocast x (and grad_y) may be bf16 while the weights stay fp32, and backward
        # runs outside autocast: compute in the wider type, return each grad in its input's.
        dtype = torch.promote_types(x.dtype, weights[0].dtype)
        x_rows = x[rows].to(dtype)
        grad_x_rows = torch.zeros_like(x_rows)
        grad_weights: list[Tensor | None] = []
        for i, size in enumerate(ctx.output_slices):
            a, b = weights[2 * i].to(dtype), weights[2 * i + 1].to(dtype)
            grad_rows = grad_y[rows, offsets[i] : offsets[i] + size].to(dtype)
            shrunk = x_rows @ a.T
            grad_shrunk = (grad_rows @ b) * scale
            grad_x_rows += grad_shrunk @ a
            grad_weights.append((grad_shrunk.T @ x_rows).to(weights[2 * i].dtype))
            grad_weights.append(((grad_rows.T @ shrunk) * scale).to(weights[2 * i + 1].dtype))
        grad_x = None
        if ctx.needs_input_grad[1]:
            grad_x = torch.zeros_like(x).index_add_(0, rows, grad_x_rows.to(x.dtype))
        return (grad_y, grad_x, None, None, None, None, *grad_weights)


def _offsets(sizes: Sequence[int]) -> list[int]:
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += size
    return offsets


def gated_lora_autograd(
    forward_fn: ForwardFn,
    y: Tensor,
    x: Tensor,
    lora_a: LoraWeights,
    lora_b: LoraWeights,
    rows: Tensor,
    scale: float,
    output_slices: Sequence[int] | None = None,
) -> Tensor:
    """Differentiable gated LoRA whose forward runs ``forward_fn`` (same signature as the ref)."""
    if rows.numel() == 0:
        return y
    slices = lora_slices(y, x, lora_a, lora_b, output_slices)
    weights = [t for s in slices for t in (s.lora_a, s.lora_b)]
    sizes = tuple(s.size for s in slices)
    return GatedLoraFunction.apply(y, x, rows, scale, sizes, forward_fn, *weights)
