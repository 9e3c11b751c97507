"""Row argmaxes of logits: the greedy token of every row, faster than PyTorch's on CPU.

Greedy requests need nothing but these (a bonus token, a recovered token, the next drafts);
``argmax_without`` leaves out the MASK token, which the model never emits.
"""

from __future__ import annotations

import torch
from torch import Tensor

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
