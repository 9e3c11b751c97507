"""Triton forward for gated LoRA (semantics: ``idlm_kernels.gated_lora``).

Two kernels per slice, both over the gathered rows only:

- shrink: ``partial[s] = x[rows, k-chunk s] @ lora_a[:, k-chunk s].T`` in fp32, split over ``in`` so a
  handful of gated rows still spreads over many programs (a deterministic split: partials are summed
  by the expand kernel, no atomics);
- expand: ``y[rows, slice] = y[rows, slice] + scale * sum_s(partial[s]) @ lora_b.T``, in fp32, then
  rounded to y's dtype. Rows outside ``rows`` (and -1 padding entries) are never loaded or stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from idlm_kernels.gated_lora import LoraWeights, lora_slices
from idlm_kernels.ops import interpreted


@triton.jit
def _shrink_kernel(
    x, stride_x, lora_a, stride_a, rows, partial, num_rows, d_in, rank, k_per_split,
    BLOCK_G: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr,
):  # fmt: skip
    pid_g = tl.program_id(0)
    split = tl.program_id(1)
    offs_g = pid_g * BLOCK_G + tl.arange(0, BLOCK_G)
    offs_r = tl.arange(0, BLOCK_R)
    row_ids = tl.load(rows + offs_g, mask=offs_g < num_rows, other=-1)
    row_ok = row_ids >= 0  # -1: padding, skipped
    acc = tl.zeros((BLOCK_G, BLOCK_R), tl.float32)
    k_start = split * k_per_split
    for k0 in range(k_start, k_start + k_per_split, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = (offs_k < d_in) & (offs_k < k_start + k_per_split)
        x_blk = tl.load(
            x + row_ids[:, None] * stride_x + offs_k[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        a_blk = tl.load(
            lora_a + offs_r[None, :] * stride_a + offs_k[:, None],
            mask=(offs_r[None, :] < rank) & k_ok[:, None],
            other=0.0,
        )
        if DOT_FP32:
            acc += tl.dot(x_blk.to(tl.float32), a_blk.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(x_blk, a_blk)
    out = partial + split * num_rows * BLOCK_R + offs_g[:, None] * BLOCK_R + offs_r[None, :]
    tl.store(out, acc, mask=offs_g[:, None] < num_rows)


@triton.jit
def _expand_kernel(
    y, stride_y, lora_b, stride_b, rows, partial, num_rows, d_out, rank, num_splits, scale,
    BLOCK_G: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, DOT_FP32: tl.constexpr,
):  # fmt: skip
    pid_g = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_g = pid_g * BLOCK_G + tl.arange(0, BLOCK_G)
    offs_r = tl.arange(0, BLOCK_R)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    g_ok = offs_g < num_rows
    shrunk = tl.zeros((BLOCK_G, BLOCK_R), tl.float32)
    for s in range(0, num_splits):
        src = partial + s * num_rows * BLOCK_R + offs_g[:, None] * BLOCK_R + offs_r[None, :]
        shrunk += tl.load(src, mask=g_ok[:, None], other=0.0)
    b_blk = tl.load(
        lora_b + offs_n[None, :] * stride_b + offs_r[:, None],
        mask=(offs_n[None, :] < d_out) & (offs_r[:, None] < rank),
        other=0.0,
    )
    if DOT_FP32:
        delta = tl.dot(shrunk, b_blk.to(tl.float32), input_precision="ieee")
    else:
        delta = tl.dot(shrunk.to(b_blk.dtype), b_blk)
    row_ids = tl.load(rows + offs_g, mask=g_ok, other=-1)
    ptrs = y + row_ids[:, None] * stride_y + offs_n[None, :]
    ok = (row_ids >= 0)[:, None] & (offs_n[None, :] < d_out)
    base = tl.load(ptrs, mask=ok, other=0.0)
    tl.store(ptrs, (base.to(tl.float32) + scale * delta).to(base.dtype), mask=ok)


class _LaunchConfig(NamedTuple):
    block_g: int
    block_k: int
    block_n: int
    num_warps: int


def _launch_config(num_rows: int, fp32: bool) -> _LaunchConfig:
    """Tiles by gated-row count. Registers from ptxas -v, sm_90a, rank 128 (not yet timed):
    decode (<= 256 rows, 16-row tiles, 4 warps): shrink 249 (bf16, BLOCK_K 64; fp32 spills at 64 so
    takes 32), expand 56. Training (64-row tiles, 8 warps, bf16/fp16): shrink 128 at BLOCK_K 32,
    expand 128 at BLOCK_N 64; an fp32 expand spills there, so fp32 keeps 16-row tiles."""
    if num_rows > 256 and not fp32:
        return _LaunchConfig(block_g=64, block_k=32, block_n=64, num_warps=8)
    return _LaunchConfig(block_g=16, block_k=32 if fp32 else 64, block_n=32, num_warps=4)


def _check_operand(name: str, t: Tensor, device: torch.device, dtype: torch.dtype) -> None:
    if t.device != device or t.dtype != dtype:
        raise ValueError(f"{name}: {t.dtype} on {t.device}, expected {dtype} on {device}")
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim (strides {t.stride()})")


def gated_lora_triton(
    y: Tensor,
    x: Tensor,
    lora_a: LoraWeights,
    lora_b: LoraWeights,
    rows: Tensor,
    scale: float,
    output_slices: Sequence[int] | None = None,
) -> Tensor:
    """Triton twin of ``gated_lora_ref`` (same signature; in place on ``y``, which it returns)."""
    if rows.numel() == 0:
        return y
    slices = lora_slices(y, x, lora_a, lora_b, output_slices)
    device = y.device
    _check_operand("y", y, device, y.dtype)
    _check_operand("x", x, device, x.dtype)
    if rows.ndim != 1 or rows.device != device:
        raise ValueError(f"rows must be 1-d on {device}, got {tuple(rows.shape)} on {rows.device}")
    rows = rows.to(torch.int64)
    num_rows, d_in = rows.numel(), x.shape[1]
    # fp32 inputs: exact fp32 products (no TF32). The interpreter (triton 3.9) computes bf16
    # tl.dot wrongly, so it also takes the fp32 path there.
    dot_fp32 = x.dtype == torch.float32 or interpreted(_shrink_kernel)
    cfg = _launch_config(num_rows, x.dtype == torch.float32)
    grid_g = triton.cdiv(num_rows, cfg.block_g)
    for s in slices:
        _check_operand("lora_a", s.lora_a, device, x.dtype)
        _check_operand("lora_b", s.lora_b, device, x.dtype)
        rank = s.lora_a.shape[0]
        block_r = max(16, triton.next_power_of_2(rank))
        # Split the reduction over `in` only while the gathered rows give too few programs (a few
        # MASK rows at decode); training-size row counts need no split and no big partial buffer.
        num_splits = max(1, min(16, triton.cdiv(256, grid_g), triton.cdiv(d_in, cfg.block_k)))
        k_per_split = triton.cdiv(triton.cdiv(d_in, num_splits), cfg.block_k) * cfg.block_k
        num_splits = triton.cdiv(d_in, k_per_split)
        partial = torch.empty(num_splits, num_rows, block_r, dtype=torch.float32, device=device)
        _shrink_kernel[(grid_g, num_splits)](
            x, x.stride(0), s.lora_a, s.lora_a.stride(0), rows, partial, num_rows, d_in, rank,
            k_per_split, BLOCK_G=cfg.block_g, BLOCK_R=block_r, BLOCK_K=cfg.block_k,
            DOT_FP32=dot_fp32, num_warps=cfg.num_warps,
        )  # fmt: skip
        y_slice = y.narrow(1, s.offset, s.size)
        block_n = cfg.block_n if block_r <= 128 else 32
        _expand_kernel[(grid_g, triton.cdiv(s.size, block_n))](
            y_slice, y.stride(0), s.lora_b, s.lora_b.stride(0), rows, partial, num_rows, s.size,
            rank, num_splits, float(scale), BLOCK_G=cfg.block_g, BLOCK_R=block_r,
            BLOCK_N=block_n, DOT_FP32=dot_fp32, num_warps=cfg.num_warps,
        )  # fmt: skip
    return y
