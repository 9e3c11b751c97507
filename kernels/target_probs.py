"""Target probs: ``p~ = filter(softmax(logits / T))`` per row, vLLM's top-k then top-p.

The one transform behind every probability of an ISD step (``idlm_kernels.isd_sample``): the
target probs of the rows that verify drafts, of the bonus row and of the MASK rows whose
distributions become the next drafts. fp32 by default; the tests ask for fp64 gold values.
"""

from __future__ import annotations

import torch
from torch import Tensor

# vLLM treats temperatures below this as greedy.
SAMPLING_EPS = 1e-5


# Top-p first looks at the largest _SORTED_PREFIX values of a row (a topk, ~5x cheaper than a full
# sort at 448 x 8192 on CPU); rows whose nucleus is wider fall back to a full sort.
_SORTED_PREFIX = 256


def filter_logits(scaled_logits: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """Top-k then top-p on temperature-scaled logits [R, V] (per-row k, p); dropped entries -> -inf.

    Top-k keeps entries >= the k-th largest value. Top-p keeps entry v iff the probability mass (after
    top-k) of entries strictly larger than v is < top_p (equivalently vLLM's "ascending cumsum
    > 1 - top_p"), and always the largest. ``top_k <= 0 or >= V`` and ``top_p >= 1`` are off.
    """
    vocab = scaled_logits.shape[-1]
    use_k = (top_k > 0) & (top_k < vocab)
    use_p = top_p < 1
    rows = torch.nonzero(use_k | use_p).flatten()
    if rows.numel() == 0:
        return scaled_logits
    z, use_k, use_p = scaled_logits[rows], use_k[rows], use_p[rows]
    k = torch.where(use_k, top_k[rows], 1).long()
    p = torch.where(use_p, top_p[rows], 1.0).to(z.dtype)
    width = min(vocab, max(_SORTED_PREFIX, int(k.max())))
    threshold, resolved = _thresholds(z, use_k, k, use_p, p, width)
    if not bool(resolved.all()):
        redo = torch.nonzero(~resolved).flatten()
        threshold[redo] = _thresholds(z[redo], use_k[redo], k[redo], use_p[redo], p[redo], vocab)[0]
    out = scaled_logits.clone()
    out[rows] = z.masked_fill(z < threshold[:, None], float("-inf"))
    return out


def _thresholds(
    z: Tensor, use_k: Tensor, k: Tensor, use_p: Tensor, top_p: Tensor, width: int
) -> tuple[Tensor, Tensor]:
    """Per row: the smallest kept value, and whether the ``width`` largest values sufficed."""
    top = z.topk(width, dim=-1).values  # descending
    kth = torch.where(use_k[:, None], top.gather(1, (k - 1)[:, None]), float("-inf"))
    top = top.masked_fill(top < kth, float("-inf"))
    log_total = torch.logsumexp(z.masked_fill(z < kth, float("-inf")), dim=-1, keepdim=True)
    top_probs = (top - log_total).exp()
    # Mass strictly above each sorted entry; a rounded cumsum of non-negatives is non-decreasing, so
    # the kept entries form a prefix and the threshold is the last kept value (its ties kept too).
    cumulative = torch.cumsum(top_probs, dim=-1)
    mass_above = torch.cat([torch.zeros_like(cumulative[:, :1]), cumulative[:, :-1]], dim=1)
    num_kept = (mass_above < top_p[:, None]).sum(-1).clamp_min(1)
    p_threshold = top.gather(1, (num_kept - 1)[:, None])
    threshold = torch.where(use_p[:, None], torch.maximum(p_threshold, kth), kth).squeeze(1)
    resolved = ~use_p | (num_kept < width) | (width == z.shape[-1]) | (top[:, -1] == float("-inf"))
    return threshold, resolved


def target_probs(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    mask_token_id: int,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """``p~`` of every row of ``logits`` [R, V] under per-row sampling params (each [R]).

    Greedy rows (``T < 1e-5``) get the unfiltered ``softmax(logits)``: their consumers only use the
    argmax, which no filter changes. ``dtype=float64`` gives the tests' gold values.
    """
    greedy = temperature < SAMPLING_EPS
    z = logits.to(dtype, copy=True)
    z[:, mask_token_id] = float("-inf")
    z = z / torch.where(greedy, 1.0, temperature).to(dtype)[:, None]
    off_k = torch.zeros_like(top_k)
    off_p = torch.ones_like(top_p)
    z = filter_logits(z, torch.where(greedy, off_k, top_k), torch.where(greedy, off_p, top_p))
    return z.softmax(dim=-1)
