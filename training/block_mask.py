"""The conversion's attention mask over [x_t | x_0] (ISD.md section 6), dense or block-sparse.

Rows/keys 0..L-1 are the masked copy x_t, L..2L-1 the clean copy x_0; both use positions
0..L-1, and blocks of b = N-1 positions (block(i) = i // b):
  x_t -> x_t: same block and j <= i      x_t -> x_0: block(j) < block(i)
  x_0 -> x_0: j <= i (plain AR)          x_0 -> x_t: never
`allowed` is written with tensor ops only, so it is both the dense builder's body and a
flex_attention `mask_mod`.
"""

from __future__ import annotations

import torch


def allowed(
    q_idx: torch.Tensor, kv_idx: torch.Tensor, seq_len: int, block_size: int
) -> torch.Tensor:
    """Elementwise: may query `q_idx` attend to key `kv_idx` (indices into the 2L sequence)?"""
    q_clean = q_idx >= seq_len
    k_clean = kv_idx >= seq_len
    q_pos = q_idx - q_clean * seq_len
    k_pos = kv_idx - k_clean * seq_len
    q_blk = q_pos // block_size
    k_blk = k_pos // block_size
    causal = k_pos <= q_pos
    noisy_noisy = ~q_clean & ~k_clean & (q_blk == k_blk) & causal
    noisy_clean = ~q_clean & k_clean & (k_blk < q_blk)
    clean_clean = q_clean & k_clean & causal
    return noisy_noisy | noisy_clean | clean_clean


def dense_mask(seq_len: int, block_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Boolean [1, 1, 2L, 2L] mask, True = attend (SDPA convention)."""
    idx = torch.arange(2 * seq_len, device=device)
    return allowed(idx[:, None], idx[None, :], seq_len, block_size)[None, None]


def flex_block_mask(seq_len: int, block_size: int, device: torch.device | str = "cuda"):
    """flex_attention BlockMask: only the non-empty 128x128 tiles are ever computed or stored."""
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, q_idx, kv_idx):
        return allowed(q_idx, kv_idx, seq_len, block_size)

    return create_block_mask(
        mask_mod, B=None, H=None, Q_LEN=2 * seq_len, KV_LEN=2 * seq_len, device=device
    )


def build_mask(seq_len: int, block_size: int, kind: str, device: torch.device | str):
    """The mask the model's attention implementation expects ("dense" -> SDPA, "flex")."""
    if kind == "flex":
        return flex_block_mask(seq_len, block_size, device)
    return dense_mask(seq_len, block_size, device)
