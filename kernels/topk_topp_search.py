"""Exact top-k / top-p thresholds of one logits row in a Triton program, without sorting.

Rows are read as ``z = logits / T`` (IEEE division, as torch) with MASK = -inf. fp32 values map to
order-preserving integer keys, so a threshold is a key and can be found exactly by narrowing an
integer interval: each streaming pass over the row tests NUM_PIVOTS keys at once (a [SUB,
NUM_PIVOTS] comparison tile), shrinking the interval (NUM_PIVOTS + 1)-fold, so a 2^32-key range
takes at most 8 passes at 16 pivots. Semantics: ``idlm_kernels.isd_sample.filter_logits``.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Key of -inf: fp32 bits 0xFF800000 with the magnitude bits flipped (see order_key). A constexpr:
# compiled kernels may only read constexpr globals.
KEY_NEG_INF = tl.constexpr(-2139095041)


@triton.jit
def order_key(z):
    """Order-preserving int32 key of fp32 values (z must not be -0.0; callers add 0.0).

    Searches run on int64 intervals (their widths reach 2^32); the per-entry comparisons stay
    int32, the cheaper type on the GPU."""
    bits = z.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def load_scaled(logits_row, offs, vocab, mask_token_id, temp):
    """``logits[offs] / temp`` in fp32, -inf at MASK and outside [0, vocab) (offs may be a scalar
    draft id, supplied by the caller)."""
    in_range = (offs >= 0) & (offs < vocab)
    x = tl.load(logits_row + offs, mask=in_range, other=float("-inf")).to(tl.float32)
    x = tl.where(offs == mask_token_id, float("-inf"), x)
    # IEEE division like torch's (div_rn does not broadcast a scalar); + 0.0 turns -0.0 into +0.0
    return tl.math.div_rn(x, tl.zeros_like(x) + temp) + 0.0


@triton.jit
def _pivots(lo, hi, NUM_PIVOTS: tl.constexpr):
    """NUM_PIVOTS keys splitting [lo, hi) evenly; all in [lo, hi), one > lo whenever hi - lo >= 2."""
    j = tl.arange(0, NUM_PIVOTS).to(tl.int64) + 1
    return lo + ((hi - lo) * j) // (NUM_PIVOTS + 1)


@triton.jit
def _count_at_least(logits_row, vocab, mask_token_id, temp, pivots, SUB: tl.constexpr):
    """For each pivot key: how many entries have key >= pivot (one pass, all pivots at once)."""
    count = tl.zeros(pivots.shape, tl.int32)
    pivots = pivots.to(tl.int32)  # pivots lie in [KEY_NEG_INF - 1, max key]
    for start in range(0, vocab, SUB):
        offs = start + tl.arange(0, SUB)
        key = order_key(load_scaled(logits_row, offs, vocab, mask_token_id, temp))
        key = tl.where(offs < vocab, key, KEY_NEG_INF - 1)
        count += tl.sum((key[:, None] >= pivots[None, :]).to(tl.int32), 0)
    return count


@triton.jit
def _mass_above_pivots(
    logits_row, vocab, mask_token_id, temp, z_max, floor, pivots, SUB: tl.constexpr
):
    """For each pivot key: sum of exp(z - z_max) over entries with key > pivot and key >= floor."""
    mass = tl.zeros(pivots.shape, tl.float32)
    pivots = pivots.to(tl.int32)  # pivots lie in [KEY_NEG_INF - 1, max key]
    for start in range(0, vocab, SUB):
        offs = start + tl.arange(0, SUB)
        z = load_scaled(logits_row, offs, vocab, mask_token_id, temp)
        key = order_key(z)
        weight = tl.where(key >= floor, tl.exp(z - z_max), 0.0)
        mass += tl.sum(tl.where(key[:, None] > pivots[None, :], weight[:, None], 0.0), 0)
    return mass


@triton.jit
def mass_above(logits_row, vocab, mask_token_id, temp, z_max, floor, bound, BLOCK: tl.constexpr):
    """Sum of exp(z - z_max) over entries with key > bound and key >= floor."""
    mass = tl.full((), 0.0, tl.float32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        z = load_scaled(logits_row, offs, vocab, mask_token_id, temp)
        key = order_key(z)
        mass += tl.sum(tl.where((key > bound) & (key >= floor), tl.exp(z - z_max), 0.0), 0)
    return mass


@triton.jit
def top_k_key(
    logits_row, vocab, mask_token_id, temp, k, key_max, NUM_PIVOTS: tl.constexpr, SUB: tl.constexpr
):
    """Key of the k-th largest z: the largest key with at least k entries at or above it.

    Search over integer keys with the invariant count(>= lo) >= k > count(>= hi); each pass tests
    NUM_PIVOTS keys, so the interval shrinks (NUM_PIVOTS + 1)-fold: <= 8 passes for 16 pivots.
    """
    lo = tl.full((), KEY_NEG_INF, tl.int64)  # every entry is >= -inf
    hi = key_max + 1  # no entry is above the max
    while hi - lo > 1:
        pivots = _pivots(lo, hi, NUM_PIVOTS)
        enough = _count_at_least(logits_row, vocab, mask_token_id, temp, pivots, SUB) >= k
        lo = tl.max(tl.where(enough, pivots, lo), 0)
        hi = tl.min(tl.where(enough, hi, pivots), 0)
    return lo


@triton.jit
def top_p_key(
    logits_row, vocab, mask_token_id, temp, z_max, floor, key_max, top_p,
    NUM_PIVOTS: tl.constexpr, SUB: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Smallest key whose strictly-larger mass (within the top-k set) is < top_p of that set.

    Invariant: mass_above(lo) >= budget > mass_above(hi); pivots as in top_k_key.
    """
    kept_mass = mass_above(logits_row, vocab, mask_token_id, temp, z_max, floor, floor - 1, BLOCK)
    budget = top_p * kept_mass
    lo = floor - 1  # mass above = kept_mass >= budget
    hi = key_max  # mass above = 0 < budget when top_p > 0
    lo = tl.where(budget > 0, lo, hi - 1)  # top_p <= 0 keeps only the max
    while hi - lo > 1:
        pivots = _pivots(lo, hi, NUM_PIVOTS)
        mass = _mass_above_pivots(logits_row, vocab, mask_token_id, temp, z_max, floor, pivots, SUB)
        small = mass < budget
        hi = tl.min(tl.where(small, pivots, hi), 0)
        lo = tl.max(tl.where(small, lo, pivots), 0)
    return hi
