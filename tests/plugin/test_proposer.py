"""The proposer's slot layout: drafts + MASKs after a full accept, MASKs otherwise."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import torch

from vllm_idlm.config import IsdOptions
from vllm_idlm.engine.proposer import IsdProposer
from vllm_idlm.engine.state import StoredDrafts

MASK = 99


def proposer(k=3, uniform=False):
    options = IsdOptions(
        num_drafts=k, uniform_query_len=uniform, adaptive=False, mask_token_id=MASK
    )
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
    p.state.pending = {"a": [5, 6, 7], "c": [1, 2, 3], "d": [4]}
    out = p.propose([[10], [11], [], [12]])
    assert out == [
        [5, 6, 7, MASK, MASK, MASK],  # all drafts passed: next drafts + K MASKs
        [MASK, MASK, MASK],  # a draft was rejected (nothing pending): cold start
        [],  # nothing sampled (prefill chunk / discarded): no drafts
        [4, MASK, MASK, MASK],  # vLLM trimmed the MASK slots: the drafts that exist
    ]
    assert not p.state.pending


def test_uniform_query_len_pads_every_step_to_2k_slots():
    p = proposer(k=2, uniform=True)
    p.state.pending = {"a": [5, 6], "b": [7]}
    out = p.propose([[1], [2], [3], [4]])
    assert out == [[5, 6, MASK, MASK], [7, MASK, MASK, MASK], [MASK] * 4, [MASK] * 4]


def test_stored_probs_of_requests_without_drafts_are_freed():
    p = proposer(k=1)
    probs = torch.ones(1, 8)
    p.state.draft_probs = {r: StoredDrafts((3,), probs) for r in "abcd"}
    p.state.pending = {"a": [3]}
    assert p.propose([[1], [2], [], [4]]) == [[3, MASK], [MASK], [], [MASK]]
    assert set(p.state.draft_probs) == {"a"}


def test_stored_drafts_pair_probs_only_with_a_prefix_of_their_own_drafts():
    stored = StoredDrafts((5, 6, 7), torch.arange(3.0)[:, None])
    assert torch.equal(stored.matching((5, 6)), torch.tensor([[0.0], [1.0]]))
    assert stored.matching((5, 8)) is None
    assert stored.matching((6,)) is None


def adaptive_proposer(k: int, temperatures=(1.0, 1.0)) -> IsdProposer:
    """An adaptive proposer (strides 1..k) for two requests, a and b, sampled at
    `temperatures` (0: greedy)."""
    strides = tuple(range(1, k + 1))
    options = IsdOptions(num_drafts=k, adaptive=True, mask_token_id=MASK, strides=strides)
    p = IsdProposer(SimpleNamespace(additional_config={"idlm": options.to_dict()}))
    p.bind_runner(
        SimpleNamespace(
            input_batch=SimpleNamespace(req_ids=["a", "b"]),
            requests={
                r: SimpleNamespace(
                    sampling_params=SimpleNamespace(structured_outputs=None, temperature=t)
                )
                for r, t in zip("ab", temperatures, strict=True)
            },
        )
    )
    return p


def plain_policy(p: IsdProposer):
    """Pin `p`'s policy where every stride is 0 (rows are all that cost) and no probe
    comes."""
    policy = p.state.policy
    policy.cost.a, policy.cost.b, policy.cost.d = 1e-4, 1e-3, 0.0
    policy.config = replace(policy.config, probe_every=1000)
    return policy


def test_a_random_request_turned_plain_still_verifies_the_drafts_it_has():
    """Adaptive policy at k = 0 (compute-bound): a random request's probe drafts are
    verified the next step with no MASK slots after them (its verdicts need the drafts'
    probabilities against the target's), so the policy observes them; with none, plain
    decoding."""
    p = adaptive_proposer(k=3)
    plain_policy(p)
    probs = torch.ones(1, 8)
    p.state.draft_probs = {"a": StoredDrafts((5,), probs)}
    p.state.pending = {"a": [5]}
    assert p.propose([[1], [2]]) == [[5], []]
    assert set(p.state.draft_probs) == {"a"}  # kept: its draft is verified this step
    assert p.propose([[1], [2]]) == [[], []]
    assert not p.state.draft_probs and not p.state.scoring


def test_greedy_drafts_on_a_plain_step_are_scored_against_the_emitted_tokens():
    """Every stride 0, greedy requests: the drafts in hand are not verified (the step stays
    plain, and a request whose drafts pass emits no more than the others) but scored
    against the tokens each request emits in the steps after: the verdicts greedy
    verification would give, handed to the policy as each one closes."""
    p = adaptive_proposer(k=3, temperatures=(0.0, 0.0))
    policy = plain_policy(p)
    p.state.pending = {"a": [5], "b": [7, 8]}
    assert p.propose([[1], [2]]) == [[], []]  # no slot: vLLM's plain path
    assert p.state.scoring == {"a": ([5], 0), "b": ([7, 8], 0)}
    assert policy.observed == [0, 0, 0]
    assert p.propose([[5], [7]]) == [[], []]  # a: its draft was the token; b: one of two
    assert p.state.scoring == {"b": ([7, 8], 1)} and p.state.num_scored == 1
    assert policy.observed == [1, 0, 0]
    a_first = policy.requests["a"].conditional[0]
    assert p.propose([[6], [9]]) == [[], []]  # b's second draft was not the token
    assert not p.state.scoring and p.state.num_scored == 2
    assert policy.observed == [2, 1, 0]
    b = policy.requests["b"].conditional
    assert b[0] > policy.config.prior > b[1]  # accepted, then rejected
    assert a_first > policy.config.prior  # accepted
    p.state.pending = {"a": [3, 4]}
    p.propose([[1], [2]])
    p.state.finish(["a"])  # a request that finishes mid-score leaves nothing behind
    assert not p.state.scoring and p.state.num_tracked == len(policy.requests)


def test_the_drafts_a_batch_holds_as_it_stops_drafting_are_verified_not_scored():
    """Greedy drafts of a drafting batch are verified (the step is speculative anyway), and
    so are those in hand on its first plain step after drafting ones (the batch's own, up
    to K per request, worth their rows); only the step after a plain batch's probe scores
    them."""
    p = adaptive_proposer(k=2, temperatures=(0.0, 0.0))
    policy = p.state.policy
    policy.cost.a, policy.cost.b, policy.cost.d = 0.010, 1e-6, 0.0  # rows nearly free: K=2
    policy.config = replace(policy.config, probe_every=1000)
    p.state.pending = {"a": [5, 6], "b": [7, 8]}
    assert p.propose([[1], [2]]) == [[5, 6, MASK, MASK], [7, 8, MASK, MASK]]
    policy.cost.a, policy.cost.b = 1e-4, 1e-3  # now rows are all that cost
    for _ in range(20):  # k held for min_dwell steps, then plain
        p.state.pending = {"a": [5, 6], "b": [7, 8]}
        layout = p.propose([[1], [2]])
        if layout == [[5, 6], [7, 8]]:  # no MASK: plain, but this step's drafts verified
            break
        assert layout == [[5, 6, MASK, MASK], [7, 8, MASK, MASK]], layout
    else:
        raise AssertionError("the policy never stopped drafting")
    assert not p.state.scoring
    p.state.pending = {"a": [5]}  # as a joint probe would leave them: now scored
    assert p.propose([[1], [2]]) == [[], []]
    assert p.state.scoring == {"a": ([5], 0)}


def test_a_random_request_among_them_keeps_the_step_speculative_and_verified():
    """Every stride 0, one greedy and one random request with drafts in hand: the random
    one's drafts must be verified, so the step is speculative and the greedy drafts are
    verified with them, as before (no scoring)."""
    p = adaptive_proposer(k=3, temperatures=(0.0, 0.7))
    plain_policy(p)
    p.state.pending = {"a": [5], "b": [7]}
    p.state.draft_probs = {"b": StoredDrafts((7,), torch.ones(1, 8))}
    assert p.propose([[1], [2]]) == [[5], [7]]
    assert not p.state.scoring


def test_a_plain_probe_drops_the_drafts_in_hand_so_the_step_is_plain():
    """A batch that drafts on every step (every step warm) and whose cost grew since start
    is held plain for one step in `plain_probe_every`: that step carries no slot at all, not
    even the drafts the step before proposed (verifying them would keep it speculative and
    the cost fit blind); the step after it drafts again from a cold start."""
    p = adaptive_proposer(k=2)
    policy = p.state.policy
    policy.cost.a, policy.cost.b, policy.cost.d = 0.010, 1e-6, 0.0  # rows nearly free: K=2
    policy.cost.a_start = 0.002  # measured at start; steps now cost 10 ms
    policy.config = replace(policy.config, probe_every=1000, plain_probe_every=4)
    layouts = []
    for _ in range(14):
        p.state.pending = {"a": [5, 6], "b": [7, 8]}  # every step fully accepted
        layouts.append(p.propose([[1], [2]]))
    warm = [[5, 6, MASK, MASK], [7, 8, MASK, MASK]]
    plain = [[], []]
    assert layouts == ([warm] * 3 + [plain]) * 3 + [warm] * 2  # one step in four
    assert policy.probed["plain_steps"] == 3


def test_a_seeded_random_request_decodes_plainly_whatever_the_policy_chooses():
    """Under a step cost that makes the policy draft K=3 for everyone, an unseeded request
    and a seeded greedy one (greedy tokens do not depend on the strides) get K MASKs; a
    seeded random one gets no slots on any step (its tokens must repeat per seed, whatever
    the load); alone, it still gets none. A fixed K drafts for it."""
    options = IsdOptions(num_drafts=3, adaptive=True, mask_token_id=MASK, strides=(1, 2, 3))
    p = IsdProposer(SimpleNamespace(additional_config={"idlm": options.to_dict()}))
    kinds = {
        "a": SimpleNamespace(structured_outputs=None, seed=None, temperature=1.0),
        "b": SimpleNamespace(structured_outputs=None, seed=7, temperature=1.0),
        "c": SimpleNamespace(structured_outputs=None, seed=7, temperature=0.0),
    }
    p.bind_runner(
        SimpleNamespace(
            input_batch=SimpleNamespace(req_ids=list(kinds)),
            requests={r: SimpleNamespace(sampling_params=v) for r, v in kinds.items()},
        )
    )
    policy = p.state.policy
    policy.cost.a, policy.cost.b, policy.cost.d, policy.cost.e = 1.0, 1e-6, 0.0, 0.0
    policy.config = replace(policy.config, probe_every=1000)
    for _ in range(3):
        assert p.propose([[1], [2], [3]]) == [[MASK] * 3, [], [MASK] * 3]
    p._runner.input_batch.req_ids = ["b"]  # nobody left for the policy to choose for
    assert p.propose([[2]]) == [[]]
    fixed = IsdOptions(num_drafts=3, adaptive=False, mask_token_id=MASK)
    p = IsdProposer(SimpleNamespace(additional_config={"idlm": fixed.to_dict()}))
    p.bind_runner(
        SimpleNamespace(
            input_batch=SimpleNamespace(req_ids=["b"]),
            requests={"b": SimpleNamespace(sampling_params=kinds["b"])},
        )
    )
    assert p.propose([[2]]) == [[MASK] * 3]


def test_the_engine_fetches_no_drafts_that_came_with_the_output():
    """After a step whose output brought its drafts (IsdScheduler applied them), the engine
    skips vLLM's fetch of the drafts from the worker; otherwise it fetches them as before."""
    from vllm.v1.engine.core import EngineCore

    from vllm_idlm.engine import scheduler

    scheduler.install()
    fetched = []
    executor = SimpleNamespace(take_draft_token_ids=lambda: fetched.append(1))
    for from_output in (True, False):
        core = SimpleNamespace(
            check_for_draft_tokens=True,
            async_scheduling=False,
            model_executor=executor,
            scheduler=SimpleNamespace(drafts_from_output=from_output),
        )
        EngineCore.post_step(core, model_executed=True)
    assert fetched == [1]  # only the step whose output came without drafts
