"""The proposer's slot layout: drafts + MASKs after a full accept, MASKs otherwise; lookup
drafts where the request's own text repeats; what it records for the sampler."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from vllm_idlm.config import IsdOptions
from vllm_idlm.engine.proposer import IsdProposer
from vllm_idlm.engine.state import Proposal
from vllm_idlm.seam.runner import RunnerView

MASK = 99


def proposer(k=3, uniform=False, lookup=None, adaptive=False, params=None, req_ids="abcd"):
    options = IsdOptions(
        num_drafts=k,
        uniform_query_len=uniform,
        adaptive=adaptive,
        lookup=lookup,
        mask_token_id=MASK,
        ks=tuple(range(1, k + 1)),
    )
    config = SimpleNamespace(additional_config={"idlm": options.to_dict()})
    p = IsdProposer(config)
    params = params or {r: SimpleNamespace(structured_outputs=None) for r in req_ids}
    runner = SimpleNamespace(
        input_batch=SimpleNamespace(req_ids=list(params)),
        requests={r: SimpleNamespace(sampling_params=v) for r, v in params.items()},
    )
    p.bind_runner(RunnerView(runner))
    return p


def pending(**drafts):
    return {r: (d, None) for r, d in drafts.items()}


def test_full_accept_gives_drafts_then_masks_and_rejection_a_cold_start():
    p = proposer()
    p.state.pending = pending(a=[5, 6, 7], c=[1, 2, 3], d=[4])
    out = p.propose([[10], [11], [], [12]])
    assert out == [
        [5, 6, 7, MASK, MASK, MASK],  # all drafts passed: next drafts + K MASKs
        [MASK, MASK, MASK],  # a draft was rejected (nothing pending): cold start
        [],  # nothing sampled (prefill chunk / discarded): no drafts
        [4, MASK, MASK, MASK],  # vLLM trimmed the MASK slots: the drafts that exist
    ]
    assert not p.state.pending
    assert p.state.proposed["a"] == Proposal((5, 6, 7), 0, None)
    assert set(p.state.proposed) == {"a", "d"}  # what the sampler pairs the slots with


def test_uniform_query_len_pads_every_step_to_2k_slots():
    p = proposer(k=2, uniform=True)
    p.state.pending = pending(a=[5, 6], b=[7])
    out = p.propose([[1], [2], [3], [4]])
    assert out == [[5, 6, MASK, MASK], [7, MASK, MASK, MASK], [MASK] * 4, [MASK] * 4]


def test_proposals_of_requests_without_drafts_are_dropped():
    p = proposer(k=1)
    p.state.proposed = {r: Proposal((3,)) for r in "abcd"}
    p.state.pending = pending(a=[3])
    assert p.propose([[1], [2], [], [4]]) == [[3, MASK], [MASK], [], [MASK]]
    assert set(p.state.proposed) == {"a"}


def test_proposals_pair_only_with_a_prefix_of_their_own_drafts():
    proposal = Proposal((5, 6, 7), 1, torch.arange(2.0)[:, None])
    assert proposal.matching((5, 6)) and proposal.matching(())
    assert not proposal.matching((5, 8)) and not proposal.matching((6,))


def batch_tokens(*texts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """token_ids_cpu and num_tokens_no_spec of requests with these texts."""
    width = max(map(len, texts))
    ids = np.zeros((len(texts), width), dtype=np.int32)
    for i, t in enumerate(texts):
        ids[i, : len(t)] = t
    return np.array([len(t) for t in texts], dtype=np.int32), ids


def test_a_cold_start_takes_the_lookups_continuation_where_the_text_repeats():
    """a: "1 2 3 4 5 6 1 2" repeats: after a rejection (no MASK drafts) its lookup proposes
    the continuation "3 4 5" and, within the stride's 2K = 6 slots, "6 1" in place of two MASK
    slots, point masses recorded as such; b's text does not repeat: a plain cold start."""
    p = proposer(lookup=(2, 4), req_ids="ab")
    lengths, ids = batch_tokens([1, 2, 3, 4, 5, 6, 1, 2], [9, 8, 7, 6, 5])
    out = p.propose([[2], [5]], lengths, ids)
    assert out == [[3, 4, 5, 6, 1, MASK], [MASK, MASK, MASK]]
    assert p.state.proposed["a"] == Proposal((3, 4, 5, 6, 1), 5, None)
    assert "b" not in p.state.proposed


def test_a_lookup_runs_to_2k_minus_1_tokens_whatever_the_stride():
    """K = 3: the lookup's continuation takes up to 5 of the 6 slots vLLM holds at any stride;
    the stride's MASK slots follow, as many as fit (m = min(k, 2K - n))."""
    p = proposer(lookup=(2, 4), req_ids="a")
    lengths, ids = batch_tokens([1, 2, 3, 4, 5, 6, 7, 8, 1, 2])
    p.state.policy.fixed = 1
    assert p.propose([[2]], lengths, ids) == [[3, 4, 5, 6, 7, MASK]]
    assert p.state.proposed["a"].num_lookup == 5
    lengths, ids = batch_tokens([1, 2, 3, 1, 2])  # "1 2" -> "3 1 2", the text's end
    assert p.propose([[2]], lengths, ids) == [[3, 1, 2, MASK]]
    p.state.policy.fixed = 3
    assert p.propose([[2]], lengths, ids) == [[3, 1, 2, MASK, MASK, MASK]]


def test_at_k_0_a_lookup_drafts_alone_where_it_pays_for_its_rows():
    """K = 0 (plain decoding for the batch; pinned step 10 ms, 0.1 ms a row: a row costs 2% of
    the step of two requests): a request whose lookup's first token has matched the emitted
    one takes its continuation alone, no MASK slot; one whose lookup has nearly always missed
    decodes plainly (its lookup still scored)."""
    p = proposer(lookup=(2, 4), adaptive={"step_ms": 10, "row_ms": 0.1}, req_ids="ab")
    p.state.policy.fixed = 0
    lengths, ids = batch_tokens([1, 2, 3, 1, 2], [1, 2, 3, 1, 2])
    for _ in range(20):
        p.state.policy.score_sources("a", lookup_first=3, mask_first=None, emitted=3)
        p.state.policy.score_sources("b", lookup_first=3, mask_first=None, emitted=4)
    assert p.propose([[2], [2]], lengths, ids) == [[3, 1, 2], []]
    assert p.state.proposed["a"] == Proposal((3, 1, 2), 3, None)
    assert p.state.offered == {"a": (3, None), "b": (3, None)}


def test_where_its_own_text_has_no_match_a_lookup_searches_recent_outputs():
    """A finished request's output "5 6 7 8 .. 12" is remembered: b's own text ends in "6 7",
    which it never wrote before, so its lookup continues from the remembered output; a seeded
    random request's does not (its tokens must repeat per seed whatever ran before it), a
    seeded greedy one's does."""
    kinds = {
        "a": SimpleNamespace(structured_outputs=None, seed=None, temperature=1.0),
        "b": SimpleNamespace(structured_outputs=None, seed=3, temperature=1.0),
        "c": SimpleNamespace(structured_outputs=None, seed=3, temperature=0.0),
    }
    p = proposer(lookup=(2, 4, 8), params=kinds)
    lengths, ids = batch_tokens([1, 6, 7], [1, 6, 7], [1, 6, 7])
    assert p.propose([[7]] * 3, lengths, ids) == [[MASK] * 3] * 3  # nothing remembered yet
    p.remember([5, 6, 7, 8, 9, 10, 11, 12, -1])
    out = p.propose([[7]] * 3, lengths, ids)
    assert out == [[8, 9, 10, 11, 12, MASK], [MASK] * 3, [8, 9, 10, 11, 12, MASK]]
    own = proposer(lookup=(2, 4), params=kinds)  # recent 0: its own text only
    own.remember([5, 6, 7, 8, 9, 10, 11, 12])
    assert own.propose([[7]] * 3, lengths, ids) == [[MASK] * 3] * 3


def test_where_the_lookup_leads_the_mask_rows_drafts_follow_it():
    """a holds MASK drafts [7, 8, 9] with their probs and the lookup matches one token ahead
    ("1 2" -> 3): once the lookup's first token has been the emitted one more often, the
    drafts are the lookup's 3 then the MASK rows' 8, 9 (their probs rows 1 and 2)."""
    p = proposer(lookup=(2, 4), req_ids="a")
    lengths, ids = batch_tokens([1, 2, 3, 0, 1, 2])
    probs = torch.eye(3, 100)
    p.state.pending = {"a": ([7, 8, 9], probs)}
    assert p.propose([[2]], lengths, ids)[0] == [7, 8, 9, MASK, MASK, MASK]  # a tie: MASK rows
    for _ in range(3):
        p.state.policy.score_sources("a", lookup_first=3, mask_first=7, emitted=3)
    p.state.pending = {"a": ([7, 8, 9], probs)}
    assert p.propose([[2]], lengths, ids)[0] == [3, 0, 1, 2, MASK, MASK]  # the lookup's 4
    lengths, ids = batch_tokens([5, 1, 2, 3, 9, 1, 2])  # "3 9 1 2" follows "1 2"
    p.state.pending = {"a": ([7, 8, 9], probs)}
    assert p.propose([[2]], lengths, ids)[0] == [3, 9, 1, 2, MASK, MASK]
    lengths, ids = batch_tokens([1, 2, 3])
    p.state.pending = {"a": ([7, 8, 9], probs)}
    assert p.propose([[2]], lengths, ids)[0] == [7, 8, 9, MASK, MASK, MASK]  # nothing matched
    lengths, ids = batch_tokens([1, 2, 3, 1, 2])
    p.lookup.max_model_len = 6  # one token left before max_model_len: a lookup of one
    p.state.pending = {"a": ([7, 8, 9], probs)}
    assert p.propose([[2]], lengths, ids)[0] == [3, 8, 9, MASK, MASK, MASK]  # then MASK drafts
    proposal = p.state.proposed["a"]
    assert proposal.num_lookup == 1 and torch.equal(proposal.probs, probs[1:])


def test_each_sources_first_draft_is_scored_against_the_token_emitted_next():
    p = proposer(lookup=(2, 4), req_ids="a")
    lengths, ids = batch_tokens([1, 2, 3, 0, 1, 2])
    p.state.pending = {"a": ([7, 8, 9], None)}
    p.propose([[2]], lengths, ids)
    assert p.state.offered == {"a": (3, 7)}
    before = p.state.policy.requests["a"]
    lookup, mask = before.lookup_first, before.mask_first
    p.propose([[3]], lengths, ids)  # the request emitted 3: the lookup was right
    after = p.state.policy.requests["a"]
    assert after.lookup_first > lookup and after.mask_first < mask


def test_a_seeded_random_request_decodes_plainly_under_the_policy_not_at_a_fixed_k():
    """Under a step cost that makes the policy draft for everyone, an unseeded request and a
    seeded greedy one (greedy tokens do not depend on the strides) get MASK slots; a seeded
    random one none (its tokens must repeat per seed, whatever the load). A fixed K drafts
    for it."""
    kinds = {
        "a": SimpleNamespace(structured_outputs=None, seed=None, temperature=1.0),
        "b": SimpleNamespace(structured_outputs=None, seed=7, temperature=1.0),
        "c": SimpleNamespace(structured_outputs=None, seed=7, temperature=0.0),
    }
    drafting = {"step_ms": 100.0, "row_ms": 0.001}
    p = proposer(adaptive=drafting, params=kinds)
    for _ in range(3):
        assert p.propose([[1], [2], [3]]) == [[MASK] * 3, [], [MASK] * 3]
    fixed = proposer(adaptive=False, params={"b": kinds["b"]})
    assert fixed.propose([[2]]) == [[MASK] * 3]


def test_structured_output_requests_never_draft():
    kinds = {
        "a": SimpleNamespace(structured_outputs=object(), seed=None, temperature=0.0),
        "b": SimpleNamespace(structured_outputs=None, seed=None, temperature=0.0),
    }
    p = proposer(params=kinds, lookup=(1, 2))
    lengths, ids = batch_tokens([1, 1, 1, 1], [1, 1, 1, 1])
    structured, free = p.propose([[1], [1]], lengths, ids)
    assert structured == [] and free[0] == 1 and free[-1] == MASK  # b: lookup drafts


def test_the_engine_fetches_no_drafts_that_came_with_the_output():
    """After a step whose output brought its drafts (IsdScheduler applied them), the engine
    skips vLLM's fetch of the drafts from the worker; otherwise it fetches them as before."""
    from vllm.v1.engine.core import EngineCore

    from vllm_idlm.seam import patch
    from vllm_idlm.seam.table import touch_of

    patch.apply(touch_of("vllm.v1.engine.core:EngineCore.post_step"))
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
