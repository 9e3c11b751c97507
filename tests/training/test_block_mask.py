"""The conversion attention mask equals a brute-force construction from ISD.md's four rules."""

from __future__ import annotations

import pytest
import torch

from idlm_training.block_mask import dense_mask
from idlm_training.modeling import hidden_states
from idlm_training.objective import build_idlm_batch


def brute_force(seq_len: int, block: int) -> torch.Tensor:
    n = 2 * seq_len
    out = torch.zeros(n, n, dtype=torch.bool)
    for q in range(n):
        for k in range(n):
            qi, ki = q % seq_len, k % seq_len
            q_clean, k_clean = q >= seq_len, k >= seq_len
            if not q_clean and not k_clean:
                out[q, k] = qi // block == ki // block and ki <= qi
            elif not q_clean and k_clean:
                out[q, k] = ki // block < qi // block
            elif q_clean and k_clean:
                out[q, k] = ki <= qi
    return out


@pytest.mark.parametrize(
    "seq_len,stride", [(1, 2), (5, 2), (6, 3), (7, 4), (16, 4), (9, 5), (12, 8)]
)
def test_dense_mask_matches_four_rules(seq_len, stride):
    mask = dense_mask(seq_len, stride - 1)
    assert mask.shape == (1, 1, 2 * seq_len, 2 * seq_len)
    assert torch.equal(mask[0, 0], brute_force(seq_len, stride - 1))


def test_hand_case_stride_3_length_4():
    """Blocks {0,1},{2,3}: MASK at position 2 sees clean 0,1 and itself only."""
    mask = dense_mask(4, 2)[0, 0]
    assert mask[2].nonzero().squeeze(1).tolist() == [2, 4, 5]
    assert mask[3].nonzero().squeeze(1).tolist() == [2, 3, 4, 5]
    assert mask[0].nonzero().squeeze(1).tolist() == [0]
    assert mask[6].nonzero().squeeze(1).tolist() == [4, 5, 6]  # clean rows are plain AR


def test_every_row_attends_somewhere():
    assert dense_mask(13, 3)[0, 0].any(dim=1).all()


def test_model_attends_exactly_where_the_mask_allows(tiny_model, mask_id):
    """Each family's HF class must take the 4D mask as given: a later x_0 token (a key past
    the query's index) reaches a MASK row of the next block, a token the rules hide does not,
    and the clean half is the plain causal forward. Fails if the class ANDs in a causal mask."""
    seq_len, block = 8, 3  # blocks {0,1,2} {3,4,5} {6,7}
    ids = torch.randint(mask_id + 1, 300, (1, seq_len), generator=torch.Generator().manual_seed(0))
    loss_mask = torch.ones_like(ids, dtype=torch.bool)
    mask = dense_mask(seq_len, block)

    def hidden(x0):
        batch = build_idlm_batch(x0, loss_mask, mask_id)
        with torch.no_grad():
            return hidden_states(tiny_model, batch.input_ids, batch.position_ids, mask)[0]

    base = hidden(ids)
    with torch.no_grad():
        plain = hidden_states(tiny_model, ids)[0]
    torch.testing.assert_close(base[seq_len:], plain, atol=1e-5, rtol=1e-5)
    changed = ids.clone()
    changed[0, 4] = 299 if changed[0, 4] != 299 else 298  # clean position 4, block 1
    moved = (hidden(changed) - base).abs().amax(-1)
    assert moved[6] > 0 and moved[7] > 0  # MASK rows of block 2 see clean 0..5
    assert float(moved[:6].max()) == 0.0  # MASK rows of blocks 0-1 never see clean 4
