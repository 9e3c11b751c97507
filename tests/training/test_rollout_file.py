"""Rollout files (vLLM's answers) as training windows: whole documents, MASK rows only."""

from __future__ import annotations

import json

import pytest
import torch

from idlm_training.config import ConvertConfig, TrainConfig
from idlm_training.convert import _training_data
from idlm_training.distributed import DistInfo
from idlm_training.objective import IGNORE, build_idlm_batch
from idlm_training.packing import PackedData
from idlm_training.rollouts import mix_windows, read_rollout_file, rollout_windows

MASK = 99
PAD = 0


def _record(index: int, prompt: list[int], answer: list[int], temperature: float = 0.0) -> dict:
    return {
        "index": index,
        "prompt_ids": prompt,
        "completion_ids": answer,
        "greedy": temperature == 0,
        "temperature": temperature,
    }


def test_documents_are_packed_whole_with_prompt_rows_unlabelled():
    records = [_record(0, [5, 6], [7, 8, 9]), _record(1, [10], [11, 12]), _record(2, [13], [14])]
    data = rollout_windows(records, 8, PAD, MASK)
    assert len(data) == 2  # 5 + 3 tokens fill one window, the 2-token document starts another
    docs = {}
    for w in range(len(data)):
        for d in set(data.doc_ids[w].tolist()) - {-1}:
            sel = data.doc_ids[w] == d
            docs[tuple(data.input_ids[w][sel].tolist())] = data.loss_mask[w][sel].tolist()
    assert docs == {
        (5, 6, 7, 8, 9): [False, False, True, True, True],
        (10, 11, 12): [False, True, True],
        (13, 14): [False, True],
    }
    pad = data.doc_ids == -1
    assert (data.input_ids[pad] == PAD).all() and not data.loss_mask[pad].any()


def test_rollout_windows_carry_no_clean_labels_except_the_chosen_temperatures():
    records = [_record(i, [5], [6, 7, 8], t) for i, t in enumerate([0.0, 0.7, 1.0, 1.0])]
    data = rollout_windows(records, 4, PAD, MASK, clean_temperatures=(1.0,))
    assert data.clean_loss.tolist().count(True) == 2  # the T = 1 answers, in windows of their own
    for w in range(len(data)):
        batch = build_idlm_batch(
            data.input_ids[w : w + 1], data.loss_mask[w : w + 1], MASK, data.clean_loss[w : w + 1]
        )
        # MASK rows of 6 and 7 predict 7 and 8 (8 is last); clean rows of 5, 6, 7 predict 6, 7, 8
        assert (batch.mask_labels != IGNORE).sum() == 2
        assert ((batch.clean_labels != IGNORE).sum() == 3) == bool(data.clean_loss[w])
    plain = rollout_windows(records, 4, PAD, MASK)
    assert not plain.clean_loss.any()


def test_long_documents_are_cut_and_empty_answers_dropped():
    records = [_record(0, [5, 6], list(range(10, 30))), _record(1, [5], [])]
    data = rollout_windows(records, 8, PAD, MASK)
    assert data.input_ids.tolist() == [[5, 6, 10, 11, 12, 13, 14, 15]]


def test_a_mask_token_or_an_empty_prompt_is_refused():
    with pytest.raises(ValueError, match="rollout 3 contains the MASK token 99"):
        rollout_windows([_record(3, [5], [6, MASK])], 8, PAD, MASK)
    # An answer right after another document's answer would take its first token as a label.
    with pytest.raises(ValueError, match="rollout 4 has an empty prompt"):
        rollout_windows([_record(4, [], [6, 7])], 8, PAD, MASK)


def test_packing_order_is_seeded():
    records = [_record(i, [5], list(range(10, 10 + 1 + i % 5))) for i in range(30)]
    a, b = (rollout_windows(records, 16, PAD, MASK, seed=s) for s in (1, 1))
    c = rollout_windows(records, 16, PAD, MASK, seed=2)
    assert torch.equal(a.input_ids, b.input_ids) and not torch.equal(a.input_ids, c.input_ids)


def test_mix_windows_share_of_the_draws():
    corpus = PackedData(torch.full((50, 4), 1), torch.ones(50, 4, dtype=torch.bool))
    rolls = rollout_windows([_record(i, [5], [6, 7, 8]) for i in range(6)], 4, PAD, MASK)
    mixed = mix_windows(corpus, rolls, 0.25, 40, seed=0)
    assert len(mixed) == 40 and int((~mixed.clean_loss).sum()) == 10
    assert (mixed.doc_ids[mixed.clean_loss] == 0).all()  # corpus windows: one document each
    assert mix_windows(None, rolls, 0.25, 40, 0) is rolls
    assert mix_windows(corpus, rolls, 1.0, 40, 0) is rolls


def test_read_rollout_file_skips_a_torn_last_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(
        json.dumps(_record(1, [5], [6])) + "\n" + json.dumps(_record(0, [5], [7])) + "\n{"
    )
    assert [r["index"] for r in read_rollout_file(path)] == [0, 1]
    with pytest.raises(ValueError, match="does not exist"):
        read_rollout_file(tmp_path / "missing.jsonl")


def test_training_data_from_a_rollout_file_needs_no_corpus(tmp_path, tiny_tokenizer, mask_id):
    path = tmp_path / "r.jsonl"
    path.write_text(
        "".join(json.dumps(_record(i, [5, 6], [7 + i, 8, 9], 0.7)) + "\n" for i in range(12))
    )
    ccfg = ConvertConfig(rollouts=1.0, rollout_file=str(path))
    tcfg = TrainConfig(steps=3, batch_size=2, seq_len=10)
    data = _training_data(None, tiny_tokenizer, [], ccfg, tcfg, mask_id, DistInfo())
    assert len(data) == 6 and not data.clean_loss.any() and data.doc_ids is not None
    with pytest.raises(ValueError, match="needs corpus documents"):
        half = ConvertConfig(rollouts=0.5, rollout_file=str(path))
        _training_data(None, tiny_tokenizer, [], half, tcfg, mask_id, DistInfo())


def test_rollout_file_needs_a_share():
    with pytest.raises(ValueError, match="needs rollouts > 0"):
        ConvertConfig(rollout_file="r.jsonl")
