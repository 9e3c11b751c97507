"""Self-rollout data: the model's own continuations, MASK rows only, and the soft-target term."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from idlm_training.config import ConvertConfig
from idlm_training.isd_reference import greedy_generate
from idlm_training.objective import IGNORE, build_idlm_batch, idlm_loss
from idlm_training.packing import PackedData
from idlm_training.rollouts import continue_prompts, mix_in_rollouts

MASK = 99


def test_greedy_rollouts_are_the_models_greedy_continuations(tiny_model, mask_id):
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, mask_id, (5, 6), generator=gen)
    # Batch of 2: the KV cache and batching must not change any row.
    out = continue_prompts(
        tiny_model, prompts, 12, torch.ones(5, dtype=torch.bool), [mask_id], gen, batch_size=2
    )
    assert torch.equal(out[:, :6], prompts)
    for row, prompt in zip(out, prompts, strict=True):
        assert row[6:].tolist() == greedy_generate(tiny_model, prompt.tolist(), 12, mask_id)


def test_sampled_rollouts_are_seeded_and_never_emit_banned_ids(tiny_model, mask_id):
    prompts = torch.zeros(8, 3, dtype=torch.long)
    greedy = torch.zeros(8, dtype=torch.bool)
    # Ban the 3 most likely first tokens too: a ban that failed would show up in 8 x 40 draws.
    with torch.no_grad():
        first = tiny_model(input_ids=prompts[:1]).logits[0, -1]
    banned = [mask_id, *first.topk(3).indices.tolist()]

    def draw(seed):
        g = torch.Generator().manual_seed(seed)
        return continue_prompts(tiny_model, prompts, 40, greedy, banned, g)

    a, b, c = draw(1), draw(1), draw(2)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert not torch.isin(a[:, 3:], torch.tensor(banned)).any()
    # Sampling, not argmax: identical prompts give different continuations.
    assert len({tuple(r.tolist()) for r in a}) > 1


def _corpus(n: int, seq_len: int) -> PackedData:
    ids = torch.arange(n * seq_len).view(n, seq_len) % 90 + 4
    flags = torch.ones(n, seq_len, dtype=torch.bool)
    flags[:, :2] = False  # a clean prompt part, kept on the rollouts built from it
    return PackedData(ids, flags)


def test_mix_sizes_flags_and_prefixes(tiny_model, mask_id):
    data = _corpus(40, 16)
    mixed = mix_in_rollouts(tiny_model, data, 0.25, 0.5, 5, 32, mask_id, seed=3)
    assert len(mixed) == 32  # one epoch of the 32 windows the run will draw
    clean = mixed.clean_rows(torch.arange(32))
    assert int((~clean).sum()) == 8  # 25% rollouts, the rest corpus windows
    roll_ids, roll_flags = mixed.input_ids[~clean], mixed.loss_mask[~clean]
    corpus_rows = {tuple(r.tolist()) for r in data.input_ids}
    assert all(tuple(r.tolist()) in corpus_rows for r in mixed.input_ids[clean])
    # Each rollout starts with a corpus window's first 5 tokens and keeps its prompt flags.
    starts = {tuple(r[:5].tolist()) for r in data.input_ids}
    assert all(tuple(r[:5].tolist()) in starts for r in roll_ids)
    assert not roll_flags[:, :2].any() and roll_flags[:, 2:].all()
    again = mix_in_rollouts(tiny_model, data, 0.25, 0.5, 5, 32, mask_id, seed=3)
    assert torch.equal(again.input_ids, mixed.input_ids)


def test_no_rollouts_leaves_the_data_alone(tiny_model, mask_id):
    data = _corpus(4, 8)
    assert mix_in_rollouts(tiny_model, data, 0.0, 0.5, 2, 100, mask_id, seed=0) is data


def test_rollout_windows_carry_no_clean_labels():
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    flags = torch.ones(2, 4, dtype=torch.bool)
    batch = build_idlm_batch(ids, flags, MASK, torch.tensor([True, False]))
    assert batch.clean_labels.tolist() == [[2, 3, 4, IGNORE], [IGNORE] * 4]
    assert batch.mask_labels.tolist() == [[2, 3, 4, IGNORE], [6, 7, 8, IGNORE]]


def _batch_and_hidden():
    torch.manual_seed(0)
    ids = torch.randint(4, 20, (2, 6))
    batch = build_idlm_batch(ids, torch.ones(2, 6, dtype=torch.bool), MASK)
    return batch, torch.randn(2, 12, 8, requires_grad=True), nn.Linear(8, 30, bias=False)


def test_distill_zero_is_the_data_ce_and_one_is_the_soft_ce():
    batch, hidden, head = _batch_and_hidden()
    plain = idlm_loss(hidden, head, batch, 0.0, "fixed")
    assert torch.equal(idlm_loss(hidden, head, batch, 0.0, "fixed", 0.0).total, plain.total)
    soft = idlm_loss(hidden, head, batch, 0.0, "fixed", 1.0)
    # By hand: MASK row i against the clean row i's distribution, rows with a MASK label.
    rows = batch.mask_labels != IGNORE
    q = head(hidden[:, :6][rows]).log_softmax(-1)
    p = head(hidden[:, 6:][rows]).softmax(-1)
    assert torch.allclose(soft.total, -(p * q).sum(-1).mean())
    assert torch.allclose(soft.mask_ce, plain.mask_ce)  # the log always shows the data CE
    half = idlm_loss(hidden, head, batch, 0.0, "fixed", 0.5).total
    assert torch.allclose(half, 0.5 * plain.total + 0.5 * soft.total)


def test_distill_teacher_gets_no_gradient():
    batch, hidden, head = _batch_and_hidden()
    idlm_loss(hidden, head, batch, 0.0, "fixed", 1.0).total.backward()
    assert hidden.grad[:, 6:].abs().sum() == 0 and hidden.grad[:, :6].abs().sum() > 0


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"rollouts": 1.5}, "rollouts=1.5"),
        ({"rollout_greedy": -0.1}, "rollout_greedy"),
        ({"distill": 2.0}, "distill=2.0"),
        ({"rollout_prompt": 0}, "rollout_prompt=0"),
    ],
)
def test_rollout_options_are_checked(kwargs, words):
    with pytest.raises(ValueError, match=words):
        ConvertConfig(**kwargs)


def test_rollout_prompt_must_leave_room_to_generate():
    with pytest.raises(ValueError, match="rollout_prompt=32 leaves nothing"):
        ConvertConfig(rollouts=0.5).check_seq_len(32)
