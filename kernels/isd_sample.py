"""ISD verify-and-draft: one pass over a batch's logits that verifies drafts and samples new ones.

Vocabulary (the same words as the verifier and vLLM's rejection sampler):

- **request rows**: request i owns ``1 + n_i + m_i`` consecutive logits rows: ``n_i`` target rows (row r
  scores draft r), one bonus row, then ``m_i`` MASK rows whose distributions become the next drafts.
- **draft tokens** ``d_r`` and **draft probs** ``q~_r``: the tokens proposed by the previous step and
  the filtered distribution each was drawn from. A **point-mass draft** (a lookup in the request's
  own text proposes one token for certain) has ``q~_r = 1{d_r}``; it carries no probs row
  (``draft_prob_index`` -1), so no vocab-sized one-hot is ever built for it.
- **target probs** ``p~``: ``filter(softmax(logits / T))`` in fp32 with MASK forced to -inf, where
  filter is the request's top-k then top-p (vLLM's semantics). The same transform makes the target
  probs of every row kind and the draft probs of MASK rows.
- **accepted**: random requests accept ``d_r`` iff ``q~_r(d_r) > 0`` and ``p~_r(d_r) >= u_r q~_r(d_r)``
  (a point mass: iff ``p~_r(d_r) >= u_r``); greedy requests (``T < 1e-5``) iff ``d_r == argmax p~_r``.
  Verification stops at the first rejection.
- **recovered**: the token emitted at the first rejection: ``argmax(max(0, p~ - q~) / noise)`` (``p~``
  when that residual is all zero; for a point mass, ``p~`` with ``d_r`` removed), ``argmax p~`` for
  greedy requests.
- **bonus**: the token emitted when every draft is accepted: the bonus row's ``argmax(p~ / noise)``
  (exponential race), ``argmax p~`` for greedy requests.

The target probs (``idlm_kernels.target_probs``) and the row argmaxes (``idlm_kernels.argmax``)
have modules of their own; this one lays out the rows and verifies, recovers and drafts.

Randomness is an argument (``uniforms``, ``noise``) so the Triton kernel and this reference agree
exactly. Ties at a top-k/top-p threshold are kept (vLLM keeps an arbitrary sort-order subset of them;
the two agree whenever the boundary value is unique, i.e. almost surely for real logits).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from idlm_kernels.argmax import argmax_without
from idlm_kernels.target_probs import SAMPLING_EPS, target_probs


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


def _check_inputs(
    logits: Tensor,
    draft_token_ids: Tensor,
    draft_probs: Tensor,
    num_draft_tokens: Tensor,
    num_mask_tokens: Tensor,
    uniforms: Tensor,
    noise: Tensor,
    draft_prob_index: Tensor | None,
) -> None:
    num_rows, vocab = logits.shape
    num_drafts = draft_token_ids.shape[0]
    expected_rows = int((1 + num_draft_tokens.long() + num_mask_tokens.long()).sum())
    if num_rows != expected_rows:
        raise ValueError(f"logits has {num_rows} rows, the layout needs {expected_rows}")
    if int(num_draft_tokens.sum()) != num_drafts:
        raise ValueError(f"{num_drafts} draft tokens, num_draft_tokens sums to a different count")
    check_draft_prob_shapes(draft_probs, draft_prob_index, num_drafts, vocab)
    if uniforms.shape != (num_drafts,) or noise.shape != logits.shape:
        raise ValueError(f"uniforms {tuple(uniforms.shape)} / noise {tuple(noise.shape)} mis-sized")


def check_draft_prob_shapes(
    draft_probs: Tensor, draft_prob_index: Tensor | None, num_drafts: int, vocab: int
) -> None:
    """``draft_probs`` [num drafts, V] (or empty), or any number of rows with an index [num drafts]."""
    if draft_probs.ndim != 2 or draft_probs.shape[1] != vocab:
        raise ValueError(f"draft_probs {tuple(draft_probs.shape)}, expected [*, {vocab}]")
    if draft_prob_index is None:
        if draft_probs.shape[0] not in (0, num_drafts):
            raise ValueError(
                f"draft_probs {tuple(draft_probs.shape)}, expected [{num_drafts}, {vocab}]"
            )
    elif draft_prob_index.shape != (num_drafts,):
        raise ValueError(
            f"draft_prob_index {tuple(draft_prob_index.shape)}, expected [{num_drafts}]"
        )


def check_draft_probs(
    draft_probs: Tensor,
    num_draft_tokens: Tensor,
    temperature: Tensor,
    draft_prob_index: Tensor | None = None,
) -> None:
    """Refuse to verify sampled drafts without their draft probs (both backends).

    An empty ``draft_probs`` without an index is allowed only when every request with drafts is
    greedy (greedy drafts are argmaxes, verified by equality). Checked only when ``draft_probs``
    is empty, so the device sync it costs never touches a batch that carries probs; with an index,
    every draft says where its probs are (or that it is a point mass).
    """
    if draft_prob_index is not None:
        return
    if draft_probs.shape[0] or not bool((num_draft_tokens > 0).any()):
        return
    random_with_drafts = (num_draft_tokens > 0) & (temperature >= SAMPLING_EPS)
    if bool(random_with_drafts.any()):
        raise ValueError("draft_probs is empty but a random request has drafts")


def draft_prob_rows(
    draft_probs: Tensor, draft_prob_index: Tensor | None, num_drafts: int
) -> Tensor:
    """The row of ``draft_probs`` holding each draft's probs, -1 for a point mass ([D] int64)."""
    if draft_prob_index is not None:
        return draft_prob_index.long()
    device = draft_probs.device
    if draft_probs.shape[0]:
        return torch.arange(num_drafts, device=device)
    return torch.full((num_drafts,), -1, dtype=torch.long, device=device)


# Rows of [R, V] temporaries processed at once: bounds the reference path's extra memory
# (a [256, 151936] fp32 chunk is 148 MB) whatever the batch.
_CHUNK_ROWS = 256


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
    draft_prob_index: Tensor | None = None,
) -> IsdStep:
    """Verify every request's drafts and sample the next drafts (pure PyTorch; the CPU path).

    ``max_num_draft_tokens`` (optional, = max n_i) avoids a device-to-host sync for the output width.
    ``draft_prob_index`` (optional, [D] int64): the row of ``draft_probs`` of each draft, -1 for a
    point mass; without it, draft d's probs are row d (none when ``draft_probs`` is empty).
    Probabilities are formed only for the rows of random requests and the residual only at each
    request's first rejected draft; greedy rows need argmaxes only, and their noise is never read.
    """
    _check_inputs(
        logits,
        draft_token_ids,
        draft_probs,
        num_draft_tokens,
        num_mask_tokens,
        uniforms,
        noise,
        draft_prob_index,
    )
    check_draft_probs(draft_probs, num_draft_tokens, temperature, draft_prob_index)
    q_rows = draft_prob_rows(draft_probs, draft_prob_index, draft_token_ids.shape[0])
    num_rows, vocab = logits.shape
    device = logits.device
    n = num_draft_tokens.long()
    layout = row_layout(n, num_mask_tokens, num_rows)
    greedy_row = (temperature < SAMPLING_EPS)[layout.row_req]
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
        probs, slot, argmax_ids, layout.draft_rows, draft_token_ids, draft_probs, q_rows, uniforms
    )
    output_token_ids, num_accepted = _assemble(
        draft_token_ids,
        n,
        accepted,
        lambda first_reject: _recovered(
            probs,
            slot,
            argmax_ids,
            noise,
            layout.draft_rows,
            draft_token_ids,
            draft_probs,
            q_rows,
            first_reject,
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
    q_rows: Tensor,
    uniforms: Tensor,
) -> Tensor:
    """Per draft (independently of the others): accepted [D] bool. Greedy: the draft is the
    argmax; random: ``q~(d) > 0`` and ``p~(d) >= u q~(d)`` in fp64 (``q~(d) = 1`` for a point
    mass)."""
    accepted = draft_token_ids == argmax_ids[draft_rows]
    draft_slot = slot[draft_rows]
    random = torch.nonzero(draft_slot >= 0).flatten()
    if random.numel() == 0:
        return accepted
    ids = draft_token_ids[random][:, None]
    target_prob = probs[draft_slot[random]].gather(1, ids).squeeze(1).double()
    draft_prob = _draft_prob_of(draft_probs, q_rows[random], ids)
    accepted[random] = (draft_prob > 0) & (target_prob >= uniforms[random] * draft_prob)
    return accepted


def _draft_prob_of(draft_probs: Tensor, q_rows: Tensor, ids: Tensor) -> Tensor:
    """``q~(d)`` in fp64 of drafts whose probs sit at ``q_rows`` (-1: a point mass, 1)."""
    out = torch.ones(q_rows.numel(), dtype=torch.float64, device=q_rows.device)
    held = torch.nonzero(q_rows >= 0).flatten()
    if held.numel():
        out[held] = draft_probs[q_rows[held]].gather(1, ids[held]).squeeze(1).double()
    return out


def _recovered(
    probs: Tensor,
    slot: Tensor,
    argmax_ids: Tensor,
    noise: Tensor,
    draft_rows: Tensor,
    draft_token_ids: Tensor,
    draft_probs: Tensor,
    q_rows: Tensor,
    drafts: Tensor,
) -> Tensor:
    """The recovered token of the given drafts (each request's first rejected one): greedy, the
    argmax; random, ``argmax(max(0, p~ - q~) / noise)`` (``p~`` where that is all zero; for a
    point mass, ``p~`` with the draft token removed)."""
    rows = draft_rows[drafts]
    recovered = argmax_ids[rows]
    random = torch.nonzero(slot[rows] >= 0).flatten()
    if random.numel():
        target = probs[slot[rows[random]]]
        which = q_rows[drafts[random]]
        draft = torch.zeros_like(target)  # q~ of each rejected draft
        held = torch.nonzero(which >= 0).flatten()
        if held.numel():
            draft[held] = draft_probs[which[held]]
        points = torch.nonzero(which < 0).flatten()
        if points.numel():
            draft[points, draft_token_ids[drafts[random][points]]] = 1.0
        residual = (target - draft).clamp_min_(0)
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
