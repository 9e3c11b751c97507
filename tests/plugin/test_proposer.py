"""The proposer's slot layout: drafts + MASKs after a full accept, MASKs otherwise."""

from __future__ import annotations

from types import SimpleNamespace

from vllm_idlm.config import IsdOptions
from vllm_idlm.engine.proposer import IsdProposer
from vllm_idlm.engine.state import StepDrafts

MASK = 99


def proposer(k=3, uniform=False):
    options = IsdOptions(num_drafts=k, uniform_query_len=uniform, mask_token_id=MASK)
    config = SimpleNamespace(additional_config={"idlm": options.to_dict()})
    p = IsdProposer(config)
    params = SimpleNamespace(structured_outputs=None)
    runner = SimpleNamespace(
        input_batch=SimpleNamespace(req_ids=["a", "b", "c", "d"]),
        requests={r: SimpleNamespace(sampling_params=params) for r in "abcd"},
    )
    p.bind_runner(runner)
    return p


def test_full_accept_gives_drafts_then_masks_and_rejection_a_cold_start():
    p = proposer()
    p.state.last_step = StepDrafts(["a", "b", "c", "d"], [[5, 6, 7], None, [1, 2, 3], [4]])
    out = p.propose([[10], [11], [], [12]])
    assert out == [
        [5, 6, 7, MASK, MASK, MASK],  # all drafts passed: next drafts + K MASKs
        [MASK, MASK, MASK],  # a draft was rejected: cold start
        [],  # nothing sampled (prefill chunk / discarded): no drafts
        [MASK, MASK, MASK],  # fewer than K next drafts: cold start
    ]
    assert p.state.last_step is None


def test_uniform_query_len_pads_cold_starts_to_2k_slots():
    p = proposer(k=2, uniform=True)
    p.state.last_step = StepDrafts(["a", "b", "c", "d"], [[5, 6], None, None, None])
    out = p.propose([[1], [2], [3], [4]])
    assert [len(x) for x in out] == [4, 4, 4, 4]
    assert out[0] == [5, 6, MASK, MASK] and out[1] == [MASK] * 4


def test_no_sampled_step_means_cold_starts_for_everyone():
    p = proposer(k=1)
    assert p.propose([[1], [2], [3], [4]]) == [[MASK]] * 4
