"""Triton kernel for ``isd_verify_and_draft`` (semantics and vocabulary: ``idlm_kernels.isd_sample``).

One program per logits row streams the row in vocab blocks (no sort, no [R, V] temporaries):

1. online max, first argmax and normaliser of the scaled logits ``z = logits / T`` (MASK = -inf);
   greedy rows stop here;
2. top-k / top-p thresholds, exact, by ``idlm_kernels.topk_topp_search``: one bracketing pass,
   one pass compacting the candidates into a per-row scratch buffer, pivot searches over those
   (falling back to pivot passes over the whole row when there are more than ``cap``), then the
   normaliser over the kept entries;
3. the draft's target prob (acceptance) and one pass that races ``p~ / noise`` (bonus and next
   drafts) and ``max(0, p~ - q~) / noise`` (recovered), writing ``q~`` of MASK rows.

A second small program per request finds the first rejection and writes the output tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from idlm_kernels.isd_sample import (
    IsdStep,
    check_draft_prob_shapes,
    check_draft_probs,
    draft_prob_rows,
)
from idlm_kernels.ops import interpreted
from idlm_kernels.topk_topp_search import filter_thresholds, load_scaled, order_key


@triton.jit
def _max_argmax_sum(logits_row, vocab, mask_token_id, temp, BLOCK: tl.constexpr):
    """max z, its first index, and sum(exp(z - max z)) (online: rescaled when the max grows)."""
    best = tl.full((), float("-inf"), tl.float32)
    best_idx = tl.full((), 0, tl.int64)
    total = tl.full((), 0.0, tl.float32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        z = load_scaled(logits_row, offs, vocab, mask_token_id, temp)
        block_max = tl.max(z, 0)
        block_idx = start + tl.argmax(z, 0, tie_break_left=True).to(tl.int64)
        take = block_max > best
        new_best = tl.maximum(best, block_max)
        # exp(-inf - -inf) is NaN while every entry so far is -inf (a masked head of a row)
        block_sum = tl.where(new_best > float("-inf"), tl.sum(tl.exp(z - new_best), 0), 0.0)
        total = tl.where(new_best == best, total, total * tl.exp(best - new_best)) + block_sum
        best_idx = tl.where(take, block_idx, best_idx)
        best = new_best
    return best, best_idx, total


@triton.jit
def _race(
    logits_row,
    noise_row,
    q_row,
    probs_row,
    q_limit,
    point_id,
    probs_limit,
    vocab,
    mask_token_id,
    temp,
    z_max,
    threshold,
    total,
    BLOCK: tl.constexpr,
):
    """argmax(p~ / noise), argmax(max(0, p~ - q~) / noise), whether that residual is non-zero.

    q~ is read below ``q_limit`` and p~ written below ``probs_limit`` (vocab or 0: a bound, not a
    flag, because the interpreter rejects a scalar flag broadcast into a mask); a point-mass draft
    has q~ = 1 at ``point_id`` (-1: none).
    """
    best_p = tl.full((), -1.0, tl.float32)
    best_r = tl.full((), -1.0, tl.float32)
    idx_p = tl.full((), 0, tl.int64)
    idx_r = tl.full((), 0, tl.int64)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        in_range = offs < vocab
        z = load_scaled(logits_row, offs, vocab, mask_token_id, temp)
        p = tl.where(order_key(z) >= threshold, tl.exp(z - z_max) / total, 0.0)
        tl.store(probs_row + offs, p, mask=offs < probs_limit)
        noise = tl.load(noise_row + offs, mask=in_range, other=1.0)
        q = tl.load(q_row + offs, mask=offs < q_limit, other=0.0)
        q = tl.where(offs == point_id, 1.0, q)
        score_p = p / noise
        score_r = tl.maximum(p - q, 0.0) / noise
        block_p = tl.max(score_p, 0)
        block_r = tl.max(score_r, 0)
        take_p = block_p > best_p
        take_r = block_r > best_r
        idx_p = tl.where(
            take_p, start + tl.argmax(score_p, 0, tie_break_left=True).to(tl.int64), idx_p
        )
        idx_r = tl.where(
            take_r, start + tl.argmax(score_r, 0, tie_break_left=True).to(tl.int64), idx_r
        )
        best_p = tl.maximum(best_p, block_p)
        best_r = tl.maximum(best_r, block_r)
    return idx_p, idx_r, best_r > 0


@triton.jit
def _locate(num_draft, num_mask, num_reqs, row, BLOCK_B: tl.constexpr):
    """For logits row ``row``: its request, the request's first row, first draft index, first
    MASK index and draft count (from the per-request counts; no host-side layout needed)."""
    idx = tl.arange(0, BLOCK_B)
    ok = idx < num_reqs
    n = tl.load(num_draft + idx, mask=ok, other=0).to(tl.int64)
    m = tl.load(num_mask + idx, mask=ok, other=0).to(tl.int64)
    rows = tl.where(ok, 1 + n + m, 0)
    req = tl.sum(((tl.cumsum(rows, 0) <= row) & ok).to(tl.int64), 0)
    before = idx < req
    return (
        req,
        tl.sum(tl.where(before, rows, 0), 0),
        tl.sum(tl.where(before, n, 0), 0),
        tl.sum(tl.where(before, m, 0), 0),
        tl.sum(tl.where(idx == req, n, 0), 0),
    )


@triton.jit
def _isd_rows_kernel(
    logits, stride_logits, noise, stride_noise, draft_probs, stride_draft_probs, draft_prob_index,
    draft_ids, uniforms,
    num_draft, num_mask, num_reqs, temperature, top_k, top_p,
    accepted_out, recovered_out, bonus_out, next_ids_out, next_probs_out, stride_next_probs,
    scratch, cap, vocab, mask_token_id, HAS_DRAFT_PROBS: tl.constexpr, BLOCK: tl.constexpr,
    NUM_PIVOTS: tl.constexpr, SUB: tl.constexpr, BLOCK_B: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    req, first_row, first_draft, first_mask, n = _locate(
        num_draft, num_mask, num_reqs, row, BLOCK_B
    )
    local = row - first_row
    is_draft = local < n
    is_bonus = local == n
    is_mask = local > n
    draft_idx = first_draft + local
    mask_idx = first_mask + local - n - 1
    logits_row = logits + row * stride_logits
    next_probs_row = next_probs_out + mask_idx * stride_next_probs
    temp = tl.load(temperature + req)
    greedy = temp < 1e-5
    temp = tl.where(greedy, 1.0, temp)
    z_max, top, total = _max_argmax_sum(logits_row, vocab, mask_token_id, temp, BLOCK)
    if greedy:
        draft = tl.load(draft_ids + draft_idx, mask=is_draft, other=0)
        tl.store(accepted_out + draft_idx, (draft == top).to(tl.int8), mask=is_draft)
        tl.store(recovered_out + draft_idx, top, mask=is_draft)
        tl.store(bonus_out + req, top, mask=is_bonus)
        tl.store(next_ids_out + mask_idx, top, mask=is_mask)
        if is_mask:
            for start in range(0, vocab, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                tl.store(next_probs_row + offs, tl.zeros((BLOCK,), tl.float32), mask=offs < vocab)
    else:
        threshold, total = filter_thresholds(
            logits_row, vocab, mask_token_id, temp, z_max, total, tl.load(top_k + req),
            tl.load(top_p + req), scratch + row * cap, cap, NUM_PIVOTS, SUB, BLOCK, 1.0,
        )  # fmt: skip
        draft = tl.load(draft_ids + draft_idx, mask=is_draft, other=-1)
        q_index = tl.load(draft_prob_index + draft_idx, mask=is_draft, other=-1)
        point = is_draft & (q_index < 0)  # a point mass: q~ = 1 at the draft, no probs row
        q_row = draft_probs + tl.maximum(q_index, 0) * stride_draft_probs
        if HAS_DRAFT_PROBS:  # noqa: SIM108 (a compile-time branch reads clearer in a kernel)
            q_limit = tl.where(is_draft & (q_index >= 0), vocab, 0)
        else:  # no probs rows: only point masses carry a q~
            q_limit = tl.where(is_draft, 0, 0)
        raced, recovered, residual_nonzero = _race(
            logits_row, noise + row * stride_noise, q_row, next_probs_row,
            q_limit, tl.where(point, draft, -1), tl.where(is_mask, vocab, 0),
            vocab, mask_token_id, temp, z_max, threshold, total, BLOCK,
        )  # fmt: skip
        if is_draft:
            z_draft = load_scaled(logits_row, draft, vocab, mask_token_id, temp)
            p_draft = tl.where(
                order_key(z_draft) >= threshold, tl.exp(z_draft - z_max) / total, 0.0
            )
            draft_in_vocab = (draft >= 0) & (draft < vocab)
            q_draft = tl.load(q_row + draft, mask=(q_limit > 0) & draft_in_vocab, other=0.0)
            q_draft = tl.where(point, 1.0, q_draft)
            u = tl.load(uniforms + draft_idx)
            ok = (q_draft > 0) & (p_draft.to(tl.float64) >= u * q_draft.to(tl.float64))
            tl.store(accepted_out + draft_idx, ok.to(tl.int8))
            tl.store(recovered_out + draft_idx, tl.where(residual_nonzero, recovered, raced))
        tl.store(bonus_out + req, raced, mask=is_bonus)
        tl.store(next_ids_out + mask_idx, raced, mask=is_mask)


@triton.jit
def _assemble_kernel(
    draft_ids, accepted, recovered, bonus, num_draft, num_reqs, output, num_accepted_out,
    width, BLOCK_W: tl.constexpr, BLOCK_B: tl.constexpr,
):  # fmt: skip
    req = tl.program_id(0).to(tl.int64)
    idx = tl.arange(0, BLOCK_B)
    counts = tl.load(num_draft + idx, mask=idx < num_reqs, other=0).to(tl.int64)
    n = tl.sum(tl.where(idx == req, counts, 0), 0)
    first = tl.sum(tl.where(idx < req, counts, 0), 0)
    pos = tl.arange(0, BLOCK_W).to(tl.int64)
    valid = pos < n
    ok = tl.load(accepted + first + pos, mask=valid, other=0)
    num_accepted = tl.min(tl.where(valid & (ok == 0), pos, n), 0)
    drafts = tl.load(draft_ids + first + pos, mask=valid, other=-1)
    rejected = num_accepted < n
    recovered_id = tl.load(recovered + first + num_accepted, mask=rejected, other=0)
    emitted = tl.where(rejected, recovered_id, tl.load(bonus + req))
    tokens = tl.where(pos < num_accepted, drafts, tl.where(pos == num_accepted, emitted, -1))
    tl.store(output + req * width + pos, tokens, mask=pos < width)
    tl.store(num_accepted_out + req, num_accepted)


@dataclass(frozen=True)
class IsdTuning:
    """Launch parameters of the row kernel.

    Not timed yet (no GPU this session). Chosen from ptxas -v for sm_90a (Triton 3.9): block 2048
    with 8 warps uses 64 registers, no spills (4 programs per SM); block 4096 uses 110 (2 per SM),
    block 1024 48. ``benchmarks/gpu_kernels.py`` times the alternatives.
    """

    block: int = 2048  # vocab entries per streaming step
    num_pivots: int = 16  # keys tested per top-k/top-p search pass (<= 8 passes at 16)
    sub: int = 256  # entries per [sub, num_pivots] comparison tile in a search pass
    num_warps: int = 8
    cap: int = 2048  # most candidates per row searched in the scratch buffer (0: always the row)

    def __post_init__(self) -> None:
        for name in ("block", "num_pivots", "sub"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"IsdTuning.{name}={value} must be a power of two")
        if self.cap < 0:
            raise ValueError(f"IsdTuning.cap={self.cap} must be >= 0")


def _ptr(t: Tensor) -> Tensor:
    """A tensor safe to pass as a kernel pointer: empty tensors may have a null data pointer."""
    return t if t.numel() else torch.zeros(1, dtype=t.dtype, device=t.device)


def _check(
    name: str, t: Tensor, ndim: int, dtypes: tuple[torch.dtype, ...], device: torch.device
) -> None:
    if t.ndim != ndim or t.dtype not in dtypes or t.device != device:
        raise ValueError(
            f"{name}: got {t.ndim}-d {t.dtype} on {t.device}, "
            f"expected {ndim}-d {'/'.join(str(d) for d in dtypes)} on {device}"
        )
    if t.numel() and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim (strides {t.stride()})")


def _check_inputs(
    logits: Tensor,
    draft_token_ids: Tensor,
    draft_probs: Tensor,
    uniforms: Tensor,
    noise: Tensor,
    mask_token_id: int,
    draft_prob_index: Tensor | None,
) -> None:
    device, (_, vocab), num_drafts = logits.device, logits.shape, draft_token_ids.shape[0]
    _check("logits", logits, 2, (torch.float32, torch.bfloat16, torch.float16), device)
    _check("noise", noise, 2, (torch.float32,), device)
    _check("draft_probs", draft_probs, 2, (torch.float32,), device)
    _check("draft_token_ids", draft_token_ids, 1, (torch.int64,), device)
    _check("uniforms", uniforms, 1, (torch.float64,), device)
    if draft_prob_index is not None:
        _check("draft_prob_index", draft_prob_index, 1, (torch.int64,), device)
    if noise.shape != logits.shape or uniforms.shape[0] != num_drafts:
        raise ValueError(f"noise {tuple(noise.shape)} / uniforms {tuple(uniforms.shape)} mis-sized")
    check_draft_prob_shapes(draft_probs, draft_prob_index, num_drafts, vocab)
    if not 0 <= mask_token_id < vocab:
        raise ValueError(f"mask_token_id {mask_token_id} outside the vocab of {vocab}")


def isd_verify_and_draft_triton(
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
    *,
    tuning: IsdTuning | None = None,
) -> IsdStep:
    """Triton twin of ``isd_verify_and_draft_ref`` (same signature, same outputs).

    ``tuning`` (keyword only) overrides the launch parameters (the GPU benchmark sweeps them).

    Like the ref, it refuses an empty ``draft_probs`` when a random request has drafts.
    """
    _check_inputs(
        logits, draft_token_ids, draft_probs, uniforms, noise, mask_token_id, draft_prob_index
    )
    check_draft_probs(draft_probs, num_draft_tokens, temperature, draft_prob_index)
    q_rows = draft_prob_rows(draft_probs, draft_prob_index, draft_token_ids.shape[0])
    device = logits.device
    num_rows, vocab = logits.shape
    num_reqs, num_drafts = num_draft_tokens.shape[0], draft_token_ids.shape[0]
    n = num_draft_tokens.to(device=device)
    m = num_mask_tokens.to(device=device)
    num_masks = num_rows - num_reqs - num_drafts
    if max_num_draft_tokens is None:
        max_num_draft_tokens = int(n.max()) if num_reqs else 0

    accepted = torch.empty(num_drafts, dtype=torch.int8, device=device)
    recovered = torch.empty(num_drafts, dtype=torch.int64, device=device)
    bonus = torch.empty(num_reqs, dtype=torch.int64, device=device)
    next_ids = torch.empty(num_masks, dtype=torch.int64, device=device)
    next_probs = torch.empty(num_masks, vocab, dtype=torch.float32, device=device)
    output = torch.empty(num_reqs, max_num_draft_tokens + 1, dtype=torch.int64, device=device)
    num_accepted = torch.empty(num_reqs, dtype=torch.int64, device=device)
    if num_reqs == 0:
        return IsdStep(output, num_accepted, next_ids, next_probs)
    # Each program finds its request from the per-request counts: at least 64 wide, so batch
    # sizes up to 64 share one compiled kernel.
    block_b = max(64, triton.next_power_of_2(num_reqs))
    tuning = tuning or IsdTuning()
    scratch = torch.empty(num_rows * max(tuning.cap, 1), dtype=torch.float32, device=device)
    block = min(triton.next_power_of_2(vocab), tuning.block)
    # The interpreter is fastest with the largest tiles.
    sub = block if interpreted(_isd_rows_kernel) else min(block, tuning.sub)
    _isd_rows_kernel[(num_rows,)](
        logits, logits.stride(0), noise, noise.stride(0), _ptr(draft_probs), draft_probs.stride(0),
        _ptr(q_rows), _ptr(draft_token_ids), _ptr(uniforms),
        n, m, num_reqs,
        temperature.to(device=device, dtype=torch.float32),
        top_k.to(device=device, dtype=torch.int64),
        top_p.to(device=device, dtype=torch.float32),
        _ptr(accepted), _ptr(recovered), bonus, _ptr(next_ids), _ptr(next_probs), vocab,
        scratch, tuning.cap, vocab, mask_token_id,
        HAS_DRAFT_PROBS=draft_probs.shape[0] > 0, BLOCK=block, NUM_PIVOTS=tuning.num_pivots,
        SUB=sub, BLOCK_B=block_b, num_warps=tuning.num_warps,
    )  # fmt: skip
    width = max_num_draft_tokens + 1
    _assemble_kernel[(num_reqs,)](
        _ptr(draft_token_ids), _ptr(accepted), _ptr(recovered), bonus, n, num_reqs, output,
        num_accepted, width, BLOCK_W=triton.next_power_of_2(width), BLOCK_B=block_b,
    )  # fmt: skip
    return IsdStep(output, num_accepted, next_ids, next_probs)
