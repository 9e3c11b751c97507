"""The verifier's shortcuts (a step without draft slots, an all-greedy step on the host)
emit what the full step emits."""

from __future__ import annotations

import torch

from idlm_kernels.argmax import argmax_without
from vllm_idlm.verifier import sample_without_drafts, verify_and_draft, verify_greedy

MASK = 5


def full_step(logits, temperature, generators):
    n = logits.shape[0]
    step = verify_and_draft(
        logits,
        torch.zeros(0, dtype=torch.int64),
        None,
        [0] * n,
        [0] * n,
        temperature,
        None,
        None,
        generators,
        MASK,
    )
    return step.output_token_ids[:, 0]


def test_greedy_shortcut_equals_the_full_step_and_skips_the_mask_token():
    logits = torch.randn(16, 40, generator=torch.Generator().manual_seed(0))
    logits[::3, MASK] = 50.0  # the MASK token is the argmax of every third row
    fast = sample_without_drafts(logits, None, None, MASK, all_greedy=True)
    assert torch.equal(fast, full_step(logits, torch.zeros(16), None))
    assert not (fast == MASK).any()
    assert torch.equal(fast[1::3], logits[1::3].argmax(dim=-1))


def test_seeded_rows_draw_the_numbers_the_full_step_draws():
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(1))
    temperature = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0, 1.0])

    def generators():
        return {i: torch.Generator().manual_seed(100 + i) for i in (1, 2, 5)}

    fast = sample_without_drafts(logits, temperature, generators(), MASK, all_greedy=False)
    full = full_step(logits, temperature, generators())
    seeded = [0, 1, 2, 3, 5]  # the unseeded random row 4 draws from the global RNG
    assert torch.equal(fast[seeded], full[seeded])
    assert torch.equal(fast[[0, 3]], logits[[0, 3]].argmax(dim=-1))


def test_greedy_host_verification_emits_what_the_full_step_emits():
    """`verify_greedy` (the sampler's all-greedy path on CPU) against `verify_and_draft` on
    random layouts: cold starts, drafts all accepted, rejected at every position, no MASK
    rows, and MASK rows whose argmax is the MASK token."""
    gen = torch.Generator().manual_seed(2)
    vocab = 40
    for trial in range(200):
        num_reqs = 1 + trial % 9
        n = torch.randint(0, 5, (num_reqs,), generator=gen).tolist()
        m = torch.randint(0, 4, (num_reqs,), generator=gen).tolist()
        rows = sum(1 + a + b for a, b in zip(n, m, strict=True))
        logits = torch.randn(rows, vocab, generator=gen)
        logits[torch.rand(rows, generator=gen) < 0.2, MASK] = 50.0
        target = argmax_without(logits, MASK).tolist()
        drafts, row = [], 0
        for a, b in zip(n, m, strict=True):
            # Drafts that match their target rows up to a random point, then do not.
            keep = int(torch.randint(0, a + 1, (1,), generator=gen))
            own = [target[row + j] if j < keep else (target[row + j] + 1) % vocab for j in range(a)]
            drafts.append(tuple(t if t != MASK else MASK + 1 for t in own))
            row += 1 + a + b
        emitted, accepted, next_ids = verify_greedy(target, drafts, m)
        full = verify_and_draft(
            logits,
            torch.tensor([t for d in drafts for t in d], dtype=torch.int64),
            None,
            n,
            m,
            torch.zeros(num_reqs),
            None,
            None,
            None,
            MASK,
        )
        width = full.output_token_ids.shape[1]
        padded = [e + [-1] * (width - len(e)) for e in emitted]
        assert padded == full.output_token_ids.tolist()
        assert accepted == full.num_accepted.tolist()
        assert next_ids == full.next_draft_ids.tolist()
        assert MASK not in next_ids and all(MASK not in e for e in emitted)
