"""The ISD verifier: exact speculative acceptance plus drafting from MASK rows.

vLLM-free. Vocabulary (the code uses these words):

- **request layout**: each request of a step owns the consecutive logits rows of
  `[last, d_0 .. d_{n-1}, MASK_1 .. MASK_m]`: row r < n is the *target* row of draft r,
  row n is the *bonus* row, rows n+1 .. n+m are *MASK rows*. A *cold start* has n = 0.
- **target probs** p~: softmax(logits / T) of a target or bonus row after the request's
  top-k / top-p filter, with the MASK logit forced to -inf; T = 0 is greedy (one-hot at
  the argmax).
- **draft tokens** d_r and **draft probs** q~_r: the tokens proposed by the previous
  step's MASK rows and the distribution they were sampled from (the same transform
  applied to the MASK row), or by a lookup in the request's own text: a *point mass*,
  q~_r = 1{d_r}, which carries no probs row. Greedy drafts carry no probs.
- **accepted**: draft r is accepted with probability min(1, p~_r(d_r) / q~_r(d_r))
  (greedy: iff d_r == argmax p~_r), left to right, stopping at the first rejection.
- **recovered** token: at the first rejection, a sample of norm(max(0, p~_r - q~_r))
  (p~_r if that is all zero; greedy: argmax p~_r).
- **bonus** token: when all n drafts are accepted, a sample of the bonus row's p~.
- **next drafts**: samples (greedy: argmaxes) of the MASK rows' q~, valid for the next
  step only when all n drafts were accepted (otherwise they were conditioned on a
  rejected token and the next step is a cold start).
- **gate** (lossless mode): the adapter is active on MASK rows only; see gated_lora.

This is Leviathan et al.'s rule with the target and draft distributions formed by one
transform everywhere, so every emitted token is distributed exactly as the model's own
sampling with the request's parameters. The math itself is `idlm_kernels.ops`
(`isd_verify_and_draft`, a Triton kernel on CUDA, its PyTorch reference elsewhere); this
module draws the randomness in one place, honouring per-request generators.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from idlm_kernels.argmax import argmax_without
from idlm_kernels.ops import IsdStep, isd_verify_and_draft

__all__ = [
    "IsdStep",
    "draw_randomness",
    "sample_without_drafts",
    "verify_and_draft",
    "verify_greedy",
]


def draw_randomness(
    num_rows_per_request: list[int],
    num_draft_tokens: list[int],
    vocab_size: int,
    generators: dict[int, torch.Generator] | None,
    device: torch.device,
    need_noise: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniforms (one per draft, fp64) and Exp(1) noise (one row per logits row, fp32).

    A request with its own generator draws all of its numbers from it, in a fixed order
    (uniforms, then noise rows), so a seeded request is reproducible whatever else is in
    the batch. The rest share the global RNG. fp64 uniforms avoid an exact 0.
    """
    num_rows = sum(num_rows_per_request)
    uniforms = torch.rand(sum(num_draft_tokens), dtype=torch.float64, device=device)
    if need_noise:
        noise = torch.empty(num_rows, vocab_size, dtype=torch.float32, device=device)
        noise.exponential_()
    else:
        noise = torch.ones(num_rows, 0, dtype=torch.float32, device=device)
    if generators:
        row, draft = 0, 0
        for i, (rows, n) in enumerate(zip(num_rows_per_request, num_draft_tokens, strict=True)):
            gen = generators.get(i)
            if gen is not None:
                if n:
                    uniforms[draft : draft + n].uniform_(generator=gen)
                if need_noise:
                    noise[row : row + rows].exponential_(generator=gen)
            row += rows
            draft += n
    return uniforms, noise


def verify_and_draft(
    logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    num_draft_tokens: list[int] | torch.Tensor,
    num_mask_tokens: list[int] | torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    generators: dict[int, torch.Generator] | None,
    mask_token_id: int,
    all_greedy: bool | None = None,
    draft_prob_index: torch.Tensor | None = None,
) -> IsdStep:
    """One ISD step for a batch laid out as described in the module docstring.

    temperature: [B] fp32, 0 (or < 1e-5) means greedy. top_k: [B] (0 = off) or None.
    top_p: [B] (1 = off) or None. draft_probs: [num drafts, V] fp32 (rows of greedy
    requests are ignored) or None when every request is greedy; with draft_prob_index
    ([num drafts] int64), any number of rows: draft d's probs are row draft_prob_index[d],
    -1 for a point mass. all_greedy: whether every request is greedy, when the caller
    knows it on the host (saves a device sync).
    """
    device = logits.device
    num_requests = temperature.shape[0]
    n = torch.as_tensor(num_draft_tokens, dtype=torch.int64).tolist()
    m = torch.as_tensor(num_mask_tokens, dtype=torch.int64).tolist()
    rows = [1 + a + b for a, b in zip(n, m, strict=True)]
    if sum(rows) != logits.shape[0]:
        raise ValueError(
            f"verify_and_draft: layout needs {sum(rows)} logits rows, got {logits.shape[0]}"
        )
    vocab_size = logits.shape[-1]
    if all_greedy is None:
        all_greedy = bool((temperature < 1e-5).all())
    uniforms, noise = draw_randomness(
        rows, n, vocab_size, generators, device, need_noise=not all_greedy
    )
    if all_greedy:
        # Never read on the greedy path: a broadcast view instead of an [R, V] tensor.
        noise = torch.ones(1, vocab_size, dtype=torch.float32, device=device).expand(sum(rows), -1)
    if draft_probs is None:
        draft_probs = torch.zeros(0, vocab_size, dtype=torch.float32, device=device)
    if top_k is None:
        top_k = torch.zeros(num_requests, dtype=torch.int64, device=device)
    if top_p is None:
        top_p = torch.ones(num_requests, dtype=torch.float32, device=device)
    return isd_verify_and_draft(
        logits,
        draft_token_ids.to(device=device, dtype=torch.int64),
        draft_probs,
        torch.tensor(n, dtype=torch.int64, device=device),
        torch.tensor(m, dtype=torch.int64, device=device),
        temperature.to(torch.float32),
        top_k.to(torch.int64),
        top_p.to(torch.float32),
        uniforms,
        noise,
        mask_token_id,
        max_num_draft_tokens=max(n, default=0),  # known here: saves a device sync
        draft_prob_index=(None if draft_prob_index is None else draft_prob_index.to(device=device)),
    )


def sample_without_drafts(
    logits: torch.Tensor,
    temperature: torch.Tensor | None,
    generators: dict[int, torch.Generator] | None,
    mask_token_id: int,
    all_greedy: bool,
) -> torch.Tensor:
    """One token per request for a step in which no request carries draft slots (one logits
    row each): what `verify_and_draft` emits for it (every row a bonus row, the same random
    numbers from the same generators), without its layout work when every request is greedy.
    temperature: as for `verify_and_draft` (None when every request is greedy). [B] int64."""
    if all_greedy:
        return argmax_without(logits, mask_token_id)
    num_requests = logits.shape[0]
    step = verify_and_draft(
        logits,
        torch.zeros(0, dtype=torch.int64, device=logits.device),
        None,
        [0] * num_requests,
        [0] * num_requests,
        temperature,
        None,
        None,
        generators,
        mask_token_id,
        all_greedy=False,
    )
    return step.output_token_ids[:, 0]


def verify_greedy(
    row_ids: list[int], drafts: Sequence[Sequence[int]], num_mask_tokens: Sequence[int]
) -> tuple[list[list[int]], list[int], list[int]]:
    """`verify_and_draft` for a batch of greedy requests, on the host, from the argmax of every
    logits row with the MASK token excluded (`row_ids`, in the layout of the module docstring).

    A greedy draft is accepted iff it is its target row's argmax, and the token emitted at the
    first rejection (or after the last draft) is that row's argmax: so each request's output is
    its drafts up to the first mismatch plus the argmax of the row there, and its next drafts
    are its MASK rows' argmaxes. Per request: the emitted tokens; the number of accepted
    drafts; the next drafts of all requests, in order. The same tokens as `verify_and_draft`
    (tested against it), without its ~100 small tensor operations.
    """
    rows = sum(1 + len(d) + m for d, m in zip(drafts, num_mask_tokens, strict=True))
    if rows != len(row_ids):
        raise ValueError(f"verify_greedy: layout needs {rows} logits rows, got {len(row_ids)}")
    emitted: list[list[int]] = []
    accepted: list[int] = []
    next_ids: list[int] = []
    row = 0
    for d, m in zip(drafts, num_mask_tokens, strict=True):
        n = len(d)
        a = 0
        while a < n and d[a] == row_ids[row + a]:
            a += 1
        emitted.append([*d[:a], row_ids[row + a]])
        accepted.append(a)
        row += n + 1
        next_ids += row_ids[row : row + m]
        row += m
    return emitted, accepted, next_ids
