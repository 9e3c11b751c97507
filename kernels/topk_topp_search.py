"""Exact top-k / top-p thresholds of one logits row in a Triton program, without sorting.

Rows are read as ``z = logits / T`` (IEEE division, as torch) with MASK = -inf. fp32 values map to
order-preserving integer keys, so a threshold is a key and can be found exactly by narrowing an
integer interval: each streaming pass over the row tests NUM_PIVOTS keys at once (a [SUB,
NUM_PIVOTS] comparison tile), shrinking the interval (NUM_PIVOTS + 1)-fold, so a 2^32-key range
takes at most 8 passes at 16 pivots. Semantics: ``idlm_kernels.target_probs.filter_logits``.
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
    logits_row, vocab, mask_token_id, temp, z_max, floor, key_max, budget,
    NUM_PIVOTS: tl.constexpr, SUB: tl.constexpr,
):  # fmt: skip
    """Smallest key whose strictly-larger mass (entries >= floor) is < budget = top_p x kept mass.

    Invariant: mass_above(lo) >= budget > mass_above(hi); pivots as in top_k_key.
    """
    lo = floor - 1  # mass above = the kept mass >= budget
    hi = key_max  # mass above = 0 < budget when top_p > 0
    lo = tl.where(budget > 0, lo, hi - 1)  # top_p <= 0 keeps only the max
    while hi - lo > 1:
        pivots = _pivots(lo, hi, NUM_PIVOTS)
        mass = _mass_above_pivots(logits_row, vocab, mask_token_id, temp, z_max, floor, pivots, SUB)
        small = mass < budget
        hi = tl.min(tl.where(small, pivots, hi), 0)
        lo = tl.max(tl.where(small, lo, pivots), 0)
    return hi


@triton.jit
def _thresholds(
    src, length, mask_token_id, temp, z_max, key_max, total, k, use_k, top_p, use_p,
    NUM_PIVOTS: tl.constexpr, SUB: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Top-k then top-p key thresholds over ``src`` (the row, or a superset of its kept entries),
    and the kept mass sum(exp(z - z_max)); ``total`` is the whole row's (no filter)."""
    threshold = tl.full((), KEY_NEG_INF, tl.int64)
    if use_k:
        threshold = top_k_key(src, length, mask_token_id, temp, k, key_max, NUM_PIVOTS, SUB)
        total = mass_above(src, length, mask_token_id, temp, z_max, threshold, threshold - 1, BLOCK)
    if use_p:
        threshold = top_p_key(
            src, length, mask_token_id, temp, z_max, threshold, key_max, top_p * total,
            NUM_PIVOTS, SUB,
        )  # fmt: skip
        total = mass_above(src, length, mask_token_id, temp, z_max, threshold, threshold - 1, BLOCK)
    return threshold, total


@triton.jit
def _value_bracket(logits_row, vocab, mask_token_id, temp, z_max, NUM_PIVOTS: tl.constexpr,
                   SUB: tl.constexpr, STEP: tl.constexpr):  # fmt: skip
    """Edges z_max - j * STEP (j = 1..NUM_PIVOTS) with the count and mass of entries >= each."""
    edges = z_max - (tl.arange(0, NUM_PIVOTS) + 1).to(tl.float32) * STEP
    count = tl.zeros((NUM_PIVOTS,), tl.int32)
    mass = tl.zeros((NUM_PIVOTS,), tl.float32)
    for start in range(0, vocab, SUB):
        offs = start + tl.arange(0, SUB)
        z = load_scaled(logits_row, offs, vocab, mask_token_id, temp)
        at_least = z[:, None] >= edges[None, :]
        count += tl.sum(at_least.to(tl.int32), 0)
        mass += tl.sum(tl.where(at_least, tl.exp(z - z_max)[:, None], 0.0), 0)
    return edges, count, mass


@triton.jit
def _compact_at_least(logits_row, vocab, mask_token_id, temp, edge, out_row, BLOCK: tl.constexpr):
    """Write z of every entry >= edge to out_row[0..n) (row order); return n."""
    n = tl.full((), 0, tl.int32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        z = load_scaled(logits_row, offs, vocab, mask_token_id, temp)
        keep = (z >= edge).to(tl.int32)
        tl.store(out_row + n + tl.cumsum(keep, 0) - 1, z, mask=keep > 0)
        n += tl.sum(keep, 0)
    return n


@triton.jit
def filter_thresholds(
    logits_row, vocab, mask_token_id, temp, z_max, total, k, top_p, scratch_row, cap,
    NUM_PIVOTS: tl.constexpr, SUB: tl.constexpr, BLOCK: tl.constexpr, STEP: tl.constexpr,
):  # fmt: skip
    """Key threshold of the row's top-k / top-p set (KEY_NEG_INF when both are off) and its mass.

    One bracketing pass finds the highest edge z_max - j * STEP whose entries already hold the
    top-k set (count >= k) or the nucleus (mass >= top_p * total), taking one edge lower as a
    margin for the fp32 sums. When at most ``cap`` entries pass it they are compacted into
    ``scratch_row`` and the exact searches run there (a few cache-resident entries instead of
    ~8 passes over the row); otherwise, or when no edge qualifies, over the whole row.
    """
    use_k = (k > 0) & (k < vocab)
    use_p = top_p < 1.0
    key_max = order_key(z_max).to(tl.int64)
    threshold = tl.full((), KEY_NEG_INF, tl.int64)
    if use_k | use_p:
        edges, count, mass = _value_bracket(
            logits_row, vocab, mask_token_id, temp, z_max, NUM_PIVOTS, SUB, STEP
        )
        holds = tl.where(use_k, count >= k, mass >= top_p * total)
        idx = tl.arange(0, NUM_PIVOTS)
        first = tl.min(tl.where(holds, idx, NUM_PIVOTS), 0)
        pick = tl.minimum(first + 1, NUM_PIVOTS - 1)
        num_kept = tl.sum(tl.where(idx == pick, count, 0), 0)
        if (first < NUM_PIVOTS) & (num_kept <= cap):
            edge = tl.sum(tl.where(idx == pick, edges, 0.0), 0)
            length = _compact_at_least(
                logits_row, vocab, mask_token_id, temp, edge, scratch_row, BLOCK
            )
            threshold, total = _thresholds(
                scratch_row, length, -1, 1.0, z_max, key_max, total, k, use_k, top_p, use_p,
                NUM_PIVOTS, SUB, BLOCK,
            )  # fmt: skip
        else:
            threshold, total = _thresholds(
                logits_row, vocab, mask_token_id, temp, z_max, key_max, total, k, use_k, top_p,
                use_p, NUM_PIVOTS, SUB, BLOCK,
            )  # fmt: skip
    return threshold, total
