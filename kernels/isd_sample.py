"""ISD verify-and-draft: one pass over a batch's logits that verifies drafts and samples new ones.

Vocabulary (the same words as the verifier and vLLM's rejection sampler):

- **request rows**: request i owns ``1 + n_i + m_i`` consecutive logits rows: ``n_i`` target rows (row r
  scores draft r), one bonus row, then ``m_i`` MASK rows whose distributions become the next drafts.
- **draft tokens** ``d_r`` and **draft probs** ``q~_r``: the tokens proposed by the previous step and
  the filtered distribution each was drawn from.
- **target probs** ``p~``: ``filter(softmax(logits / T))`` in fp32 with MASK forced to -inf, where
  filter is the request's top-k then top-p (vLLM's semantics). The same transform makes the target
  probs of every row kind and the draft probs of MASK rows.
- **accepted**: random requests accept ``d_r`` iff ``q~_r(d_r) > 0`` and ``p~_r(d_r) >= u_r q~_r(d_r)``;
  greedy requests (``T < 1e-5``) iff ``d_r == argmax p~_r``. Verification stops at the first rejection.
- **recovered**: the token emitted at the first rejection: ``argmax(max(0, p~ - q~) / noise)`` (``p~``
  when that residual is all zero), ``argmax p~`` for greedy requests.
- **bonus**: the token emitted when every draft is accepted: the bonus row's ``argmax(p~ / noise)``
  (exponential race), ``argmax p~`` for greedy requests.

Randomness is an argument (``uniforms``, ``noise``) so the Triton kernel and this reference agree
exactly. Ties at a top-k/top-p threshold are kept (vLLM keeps an arbitrary sort-order subset of them;
the two agree whenever the boundary value is unique, i.e. almost surely for real logits).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

# vLLM treats temperatures below this as greedy.
_SAMPLING_EPS = 1e-5


class IsdStep(NamedTuple):
    """Result of one verify-and-draft step."""

    # [B, max(n)+1] int64: the accepted drafts, then the emitted token, then -1
    output_token_ids: Tensor
    num_accepted: Tensor  # [B] int64
    next_draft_ids: Tensor  # [M] int64, M = sum(m_i)
    next_draft_probs: Tensor  # [M, V] float32; zeros for greedy requests


class RowLayout(NamedTuple):
    """Where each request's rows sit in the logits (all int64, on the logits' device)."""

    row_req: Tensor  # [R] request index of each row
    draft_rows: Tensor  # [D] target row of each draft
    bonus_rows: Tensor  # [B] bonus row of each request
    mask_rows: Tensor  # [M] rows whose outputs are the next drafts
    cu_num_draft_tokens: Tensor  # [B] exclusive cumulative sum of n_i


def row_layout(num_draft_tokens: Tensor, num_mask_tokens: Tensor, num_rows: int) -> RowLayout:
    """Row layout of a batch; ``num_rows`` = R must equal sum(1 + n_i + m_i)."""
    n = num_draft_tokens.long()
    m = num_mask_tokens.long()
    device = n.device
    rows_per_req = 1 + n + m
    start = torch.cumsum(rows_per_req, 0) - rows_per_req
    req_ids = torch.arange(n.numel(), device=device)
    row_req = torch.repeat_interleave(req_ids, rows_per_req, output_size=num_rows)
    local = torch.arange(num_rows, device=device) - start[row_req]
    n_row = n[row_req]
    return RowLayout(
        row_req=row_req,
        draft_rows=torch.nonzero(local < n_row).flatten(),
        bonus_rows=start + n,
        mask_rows=torch.nonzero(local > n_row).flatten(),
        cu_num_draft_tokens=torch.cumsum(n, 0) - n,
    )


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
    greedy = temperature < _SAMPLING_EPS
    z = logits.to(dtype, copy=True)
    z[:, mask_token_id] = float("-inf")
    z = z / torch.where(greedy, 1.0, temperature).to(dtype)[:, None]
    off_k = torch.zeros_like(top_k)
    off_p = torch.ones_like(top_p)
    z = filter_logits(z, torch.where(greedy, off_k, top_k), torch.where(greedy, off_p, top_p))
    return z.softmax(dim=-1)


def _check_inputs(
    logits: Tensor,
    draft_token_ids: Tensor,
    draft_probs: Tensor,
    num_draft_tokens: Tensor,
    num_mask_tokens: Tensor,
    uniforms: Tensor,
    noise: Tensor,
) -> None:
    num_rows, vocab = logits.shape
    num_drafts = draft_token_ids.shape[0]
    expected_rows = int((1 + num_draft_tokens.long() + num_mask_tokens.long()).sum())
    if num_rows != expected_rows:
        raise ValueError(f"logits has {num_rows} rows, the layout needs {expected_rows}")
    if int(num_draft_tokens.sum()) != num_drafts:
        raise ValueError(f"{num_drafts} draft tokens, num_draft_tokens sums to a different count")
    if draft_probs.shape[0] not in (0, num_drafts) or draft_probs.shape[1] != vocab:
        raise ValueError(
            f"draft_probs {tuple(draft_probs.shape)}, expected [{num_drafts}, {vocab}]"
        )
    if uniforms.shape != (num_drafts,) or noise.shape != logits.shape:
        raise ValueError(f"uniforms {tuple(uniforms.shape)} / noise {tuple(noise.shape)} mis-sized")


def check_draft_probs(draft_probs: Tensor, num_draft_tokens: Tensor, temperature: Tensor) -> None:
    """Refuse to verify sampled drafts without their draft probs (both backends).

    An empty ``draft_probs`` is allowed only when every request with drafts is greedy (greedy
    drafts are argmaxes, verified by equality). Checked only when ``draft_probs`` is empty, so
    the device sync it costs never touches a batch that carries probs.
    """
    if draft_probs.shape[0] or not bool((num_draft_tokens > 0).any()):
        return
    random_with_drafts = (num_draft_tokens > 0) & (temperature >= _SAMPLING_EPS)
    if bool(random_with_drafts.any()):
        raise ValueError("draft_probs is empty but a random request has drafts")


# Rows of [R, V] temporaries processed at once: bounds the reference path's extra memory
# (a [256, 151936] fp32 chunk is 148 MB) whatever the batch.
_CHUNK_ROWS = 256


# CPU argmax in blocks (`argmax_rows`): block width, and the least size worth it (elements).
_ARGMAX_BLOCK = 256
_ARGMAX_BLOCKED_FROM = 1 << 17


def argmax_rows(logits: Tensor) -> Tensor:
    """``logits.argmax(dim=-1)`` of a 2-D tensor, the same indices (the first of a row's
    maxima, NaN counting as the largest), faster on CPU for large tensors.

    PyTorch's CPU argmax is a scalar loop (18 ms at 448 x 49,152 fp32 on one core of this
    machine), its max-reduction vectorised (3 ms). So on CPU the row's maximum comes from
    block maxima, then the argmax runs over the first block that holds it only. Rows with a
    NaN, or a tensor too small to gain, go to PyTorch's argmax as they are.
    """
    rows, vocab = logits.shape
    small = logits.numel() < _ARGMAX_BLOCKED_FROM or vocab < 8 * _ARGMAX_BLOCK
    if logits.device.type != "cpu" or small:
        return logits.argmax(dim=-1)
    block = _ARGMAX_BLOCK
    full = vocab - vocab % block
    blocks = logits[:, :full].reshape(rows, full // block, block).amax(dim=-1)
    if full < vocab:
        blocks = torch.cat([blocks, logits[:, full:].amax(dim=-1, keepdim=True)], dim=1)
    best = blocks.amax(dim=-1, keepdim=True)
    first = (blocks == best).to(torch.uint8).argmax(dim=-1, keepdim=True)  # first block with it
    # The columns of that block (the last one may be short: its tail repeats column V-1,
    # which comes after every real column of the block, so the first maximum is unchanged).
    columns = (first * block + torch.arange(block, device=logits.device)).clamp_(max=vocab - 1)
    ids = columns.gather(1, logits.gather(1, columns).argmax(dim=-1, keepdim=True)).squeeze(1)
    nan = torch.isnan(best.squeeze(1))
    if bool(nan.any()):
        ids[nan] = logits[nan].argmax(dim=-1)
    return ids


def argmax_without(logits: Tensor, token_id: int) -> Tensor:
    """argmax of every row with ``token_id`` excluded, without copying the logits."""
    ids = argmax_rows(logits)
    hit = torch.nonzero(ids == token_id).flatten()
    if hit.numel():
        rows = logits[hit].clone()
        rows[:, token_id] = float("-inf")
        ids[hit] = rows.argmax(dim=-1)
    return ids


def _probs_of_rows(
    logits: Tensor, rows: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, mask_id: int
) -> Tensor:
    """``target_probs`` of the given rows only ([len(rows), V]), built chunk by chunk."""
    out = torch.empty(rows.numel(), logits.shape[-1], dtype=torch.float32, device=logits.device)
    for start in range(0, rows.numel(), _CHUNK_ROWS):
        idx = rows[start : start + _CHUNK_ROWS]
        out[start : start + idx.numel()] = target_probs(
            logits[idx], temperature[idx], top_k[idx], top_p[idx], mask_id
        )
    return out


def _race(probs: Tensor, noise: Tensor) -> Tensor:
    """``argmax(probs / noise)`` per row (an exponential race: a sample of each row)."""
    ids = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
    for start in range(0, probs.shape[0], _CHUNK_ROWS):
        end = start + _CHUNK_ROWS
        ids[start:end] = (probs[start:end] / noise[start:end]).argmax(dim=-1)
    return ids


def isd_verify_and_draft_ref(
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
) -> IsdStep:
    """Verify every request's drafts and sample the next drafts (pure PyTorch; the CPU path).

    ``max_num_draft_tokens`` (optional, = max n_i) avoids a device-to-host sync for the output width.
    Probabilities are formed only for the rows of random requests and the residual only at each
    request's first rejected draft; greedy rows need argmaxes only, and their noise is never read.
    """
    _check_inputs(
        logits, draft_token_ids, draft_probs, num_draft_tokens, num_mask_tokens, uniforms, noise
    )
    check_draft_probs(draft_probs, num_draft_tokens, temperature)
    num_rows, vocab = logits.shape
    device = logits.device
    n = num_draft_tokens.long()
    layout = row_layout(n, num_mask_tokens, num_rows)
    greedy_row = (temperature < _SAMPLING_EPS)[layout.row_req]
    row_ids = argmax_without(logits, mask_token_id)  # greedy: bonus tokens and next drafts
    argmax_ids = row_ids.clone()
    random_rows = torch.nonzero(~greedy_row).flatten()
    # Where each row sits among the random rows (-1: greedy row).
    slot = torch.full((num_rows,), -1, dtype=torch.long, device=device)
    slot[random_rows] = torch.arange(random_rows.numel(), device=device)
    probs = _probs_of_rows(
        logits,
        random_rows,
        temperature[layout.row_req],
        top_k[layout.row_req],
        top_p[layout.row_req],
        mask_token_id,
    )
    row_ids[random_rows] = _race(probs, noise[random_rows]) if random_rows.numel() else row_ids[:0]

    accepted = _accept(
        probs, slot, argmax_ids, layout.draft_rows, draft_token_ids, draft_probs, uniforms
    )
    output_token_ids, num_accepted = _assemble(
        draft_token_ids,
        n,
        accepted,
        lambda first_reject: _recovered(
            probs, slot, argmax_ids, noise, layout.draft_rows, draft_probs, first_reject
        ),
        row_ids[layout.bonus_rows],
        layout.cu_num_draft_tokens,
        max_num_draft_tokens,
    )
    mask_rows = layout.mask_rows
    mask_slot = slot[mask_rows]
    if random_rows.numel() == 0:  # all greedy: no probabilities to keep (a zero view)
        next_probs = torch.zeros(1, vocab, device=device).expand(mask_rows.numel(), vocab)
    else:
        next_probs = torch.zeros(mask_rows.numel(), vocab, device=device)
        random_masks = torch.nonzero(mask_slot >= 0).flatten()
        next_probs[random_masks] = probs[mask_slot[random_masks]]
    return IsdStep(output_token_ids, num_accepted, row_ids[mask_rows], next_probs)


def _accept(
    probs: Tensor,
    slot: Tensor,
    argmax_ids: Tensor,
    draft_rows: Tensor,
    draft_token_ids: Tensor,
    draft_probs: Tensor,
    uniforms: Tensor,
) -> Tensor:
    """Per draft (independently of the others): accepted [D] bool. Greedy: the draft is the
    argmax; random: ``q~(d) > 0`` and ``p~(d) >= u q~(d)`` in fp64."""
    accepted = draft_token_ids == argmax_ids[draft_rows]
    draft_slot = slot[draft_rows]
    random = torch.nonzero(draft_slot >= 0).flatten()
    if random.numel() == 0:
        return accepted
    ids = draft_token_ids[random][:, None]
    target_prob = probs[draft_slot[random]].gather(1, ids).squeeze(1).double()
    draft_prob = draft_probs[random].gather(1, ids).squeeze(1).double()
    accepted[random] = (draft_prob > 0) & (target_prob >= uniforms[random] * draft_prob)
    return accepted


def _recovered(
    probs: Tensor,
    slot: Tensor,
    argmax_ids: Tensor,
    noise: Tensor,
    draft_rows: Tensor,
    draft_probs: Tensor,
    drafts: Tensor,
) -> Tensor:
    """The recovered token of the given drafts (each request's first rejected one): greedy, the
    argmax; random, ``argmax(max(0, p~ - q~) / noise)`` (``p~`` where that is all zero)."""
    rows = draft_rows[drafts]
    recovered = argmax_ids[rows]
    random = torch.nonzero(slot[rows] >= 0).flatten()
    if random.numel():
        target = probs[slot[rows[random]]]
        residual = (target - draft_probs[drafts[random]]).clamp_min_(0)
        residual = torch.where(residual.amax(dim=-1, keepdim=True) > 0, residual, target)
        recovered[random] = (residual / noise[rows[random]]).argmax(dim=-1)
    return recovered


def _assemble(
    draft_token_ids: Tensor,
    num_draft_tokens: Tensor,
    accepted: Tensor,
    recovered_at: Callable[[Tensor], Tensor],
    bonus_ids: Tensor,
    cu_num_draft_tokens: Tensor,
    max_num_draft_tokens: int | None,
) -> tuple[Tensor, Tensor]:
    """Stop each request at its first rejection: output_token_ids [B, max(n)+1] and num_accepted.

    ``recovered_at(drafts)`` gives the recovered token of the given draft indices; it is asked
    only for each request's first rejected draft.
    """
    num_reqs = num_draft_tokens.shape[0]
    device = draft_token_ids.device
    if max_num_draft_tokens is None:
        max_num_draft_tokens = int(num_draft_tokens.max()) if num_reqs else 0
    pos = torch.arange(max_num_draft_tokens, device=device)
    valid = pos[None, :] < num_draft_tokens[:, None]
    accepted_pad = torch.zeros(num_reqs, max_num_draft_tokens, dtype=torch.bool, device=device)
    accepted_pad[valid] = accepted
    num_accepted = accepted_pad.long().cumprod(dim=1).sum(dim=1)
    drafts_pad = torch.full((num_reqs, max_num_draft_tokens), -1, dtype=torch.long, device=device)
    drafts_pad[valid] = draft_token_ids
    rejected = num_accepted < num_draft_tokens
    emitted = bonus_ids.clone()
    rejecting = torch.nonzero(rejected).flatten()
    if rejecting.numel():
        first_reject = cu_num_draft_tokens[rejecting] + num_accepted[rejecting]
        emitted[rejecting] = recovered_at(first_reject)
    output = torch.full((num_reqs, max_num_draft_tokens + 1), -1, dtype=torch.long, device=device)
    output[:, :max_num_draft_tokens] = torch.where(
        pos[None, :] < num_accepted[:, None], drafts_pad, -1
    )
    output.scatter_(1, num_accepted[:, None], emitted[:, None])
    return output, num_accepted
