"""What vLLM schedules for a request splits into real drafts and the rows after them."""

from __future__ import annotations

from vllm_idlm.slots import num_real_drafts, plan_slots

M = 99


def test_drafts_then_masks_keep_the_masks_outputs_as_next_drafts():
    plan = plan_slots([[5, 6, 7, M, M, M], [M, M, M]], M, 3)
    assert plan.drafts == ((5, 6, 7), ())
    assert plan.num_rows_after == (3, 3)
    assert plan.keeps_next_drafts == (True, True)
    assert plan.draft_token_ids == [5, 6, 7]


def test_placeholder_slots_are_not_drafts_and_give_no_next_drafts():
    """vLLM pads a new decode with -1 after a prefix-cache hit: [-1] * 2K -> a cold start
    whose rows are ignored (the engine used to verify the -1s as drafts and die)."""
    plan = plan_slots([[-1] * 6], M, 3)
    assert plan.drafts == ((),)
    assert plan.num_rows_after == (6,)
    assert plan.keeps_next_drafts == (False,)


def test_trimmed_slots_keep_what_arrived():
    plan = plan_slots([[5, 6, 7, M], [5, 6], [], [5, M, -1]], M, 3)
    assert plan.drafts == ((5, 6, 7), (5, 6), (), (5,))
    assert plan.num_rows_after == (1, 0, 0, 2)
    assert plan.keeps_next_drafts == (True, False, False, False)


def test_a_draft_after_a_mask_is_not_a_draft():
    assert num_real_drafts([5, M, 6], M, 3) == 1
    assert num_real_drafts([0, 1], M, 3) == 2  # token 0 is a real token


def test_without_drafts_turns_requests_into_cold_starts_over_the_same_rows():
    plan = plan_slots([[5, 6, M, M], [7, M]], M, 3).without_drafts([0])
    assert plan.drafts == ((), (7,))
    assert plan.num_rows_after == (4, 1)  # same rows, now all ignored
    assert plan.keeps_next_drafts == (False, True)


def test_more_leading_tokens_than_k_are_filler_not_drafts():
    """vLLM 0.32 replaces every proposal with 2K zeros near max_model_len; 6 zeros at K=3
    are not six drafts of token 0 (the metrics used to overflow their K counters)."""
    plan = plan_slots([[0] * 6, [0, 0, 0, M]], M, 3)
    assert plan.drafts == ((), (0, 0, 0))
    assert plan.num_rows_after == (6, 1)
    assert plan.keeps_next_drafts == (False, True)
