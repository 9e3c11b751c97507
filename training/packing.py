"""Tokenise documents and pack them into fixed-length windows.

Each window carries `input_ids` and `loss_mask`: True where a token is response text (it may be
masked and is a prediction target), False for clean prompt tokens and padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .corpus import Document


@dataclass
class PackedData:
    input_ids: torch.Tensor  # [num_windows, seq_len] int64
    loss_mask: torch.Tensor  # [num_windows, seq_len] bool
    # [num_windows] bool; False = the window trains MASK rows only, never the clean (AR) rows
    # (the model's own rollouts: see rollouts.py). None = every window trains both.
    clean_loss: torch.Tensor | None = None
    # [num_windows, seq_len] int64: which packed document each token belongs to; attention
    # never crosses documents (-1 = padding). None = one stream, attention crosses documents.
    doc_ids: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def clean_rows(self, idx: torch.Tensor) -> torch.Tensor:
        """Per-window clean-loss flags of the windows `idx`."""
        if self.clean_loss is None:
            return torch.ones(idx.shape[0], dtype=torch.bool)
        return self.clean_loss[idx]

    def doc_rows(self, idx: torch.Tensor) -> torch.Tensor | None:
        """Document ids of the windows `idx` (None when attention may cross documents)."""
        return None if self.doc_ids is None else self.doc_ids[idx]

    def select(self, idx: torch.Tensor) -> PackedData:
        return PackedData(
            self.input_ids[idx],
            self.loss_mask[idx],
            self.clean_rows(idx),
            self.doc_rows(idx),
        )


def concat(parts: list[PackedData]) -> PackedData:
    """Windows of several sets, in order; a set without document ids is one document per window
    (which is what its attention did: windows never see each other)."""
    if any(p.doc_ids is not None for p in parts):
        docs = [
            p.doc_ids if p.doc_ids is not None else torch.zeros_like(p.input_ids) for p in parts
        ]
        doc_ids = torch.cat(docs)
    else:
        doc_ids = None
    return PackedData(
        torch.cat([p.input_ids for p in parts]),
        torch.cat([p.loss_mask for p in parts]),
        torch.cat([p.clean_rows(torch.arange(len(p))) for p in parts]),
        doc_ids,
    )

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.sum())


def tokenize_documents(tokenizer, docs: list[Document]) -> tuple[list[int], list[bool]]:
    """One stream of ids (documents separated by EOS) and its loss flags."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("tokenizer has no eos token")
    ids: list[int] = []
    flags: list[bool] = []
    prompts = tokenizer([d.prompt for d in docs], add_special_tokens=False)["input_ids"]
    texts = tokenizer([d.text for d in docs], add_special_tokens=False)["input_ids"]
    for p, t in zip(prompts, texts, strict=True):
        ids += p + t + [eos]
        flags += [False] * len(p) + [True] * (len(t) + 1)
    return ids, flags


def pack(
    ids: list[int], flags: list[bool], seq_len: int, pad_id: int, max_tokens: int = 0
) -> PackedData:
    """Cut the stream into windows of `seq_len`; the last one is padded (padding has no loss)."""
    if max_tokens:
        ids, flags = ids[:max_tokens], flags[:max_tokens]
    n = -(-len(ids) // seq_len)
    if n == 0:
        raise ValueError("no tokens to pack")
    pad = n * seq_len - len(ids)
    input_ids = torch.tensor(ids + [pad_id] * pad, dtype=torch.long).view(n, seq_len)
    loss_mask = torch.tensor(flags + [False] * pad, dtype=torch.bool).view(n, seq_len)
    return PackedData(input_ids, loss_mask)


def pack_documents(
    tokenizer, docs: list[Document], seq_len: int, max_tokens: int = 0
) -> PackedData:
    ids, flags = tokenize_documents(tokenizer, docs)
    return pack(ids, flags, seq_len, tokenizer.eos_token_id, max_tokens)


def batch_indices(num_windows: int, batch_size: int, step: int, seed: int) -> torch.Tensor:
    """Window indices of a step: epoch-wise permutations, a pure function of (seed, step).

    Resuming at step s draws exactly what an uninterrupted run draws.
    """
    start = step * batch_size
    out = []
    while len(out) < batch_size:
        epoch, offset = divmod(start + len(out), num_windows)
        gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        perm = torch.randperm(num_windows, generator=gen)
        take = min(batch_size - len(out), num_windows - offset)
        out += perm[offset : offset + take].tolist()
    return torch.tensor(out, dtype=torch.long)
