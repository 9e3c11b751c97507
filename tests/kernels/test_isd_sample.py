"""isd_verify_and_draft_ref: hand-computed cases, a textbook per-request oracle, then statistics."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from idlm_kernels.argmax import _ARGMAX_BLOCK, _ARGMAX_BLOCKED_FROM, argmax_rows
from idlm_kernels.isd_sample import isd_verify_and_draft_ref
from idlm_kernels.target_probs import filter_logits, target_probs
from idlm_kernels.testing import IsdBatch, make_isd_batch

NEG = -20.0


def _one_hot_logits(argmaxes: list[int], vocab: int) -> Tensor:
    logits = torch.full((len(argmaxes), vocab), NEG)
    logits[torch.arange(len(argmaxes)), torch.tensor(argmaxes)] = 5.0
    return logits


def _run(
    logits: Tensor,
    drafts: list[int],
    num_masks: int,
    temperature: float = 0.0,
    draft_probs: Tensor | None = None,
    uniforms: list[float] | None = None,
    noise: Tensor | None = None,
    mask_token_id: int = 0,
    top_k: int = 0,
    top_p: float = 1.0,
    draft_prob_index: list[int] | None = None,
):
    vocab = logits.shape[1]
    return isd_verify_and_draft_ref(
        logits,
        torch.tensor(drafts, dtype=torch.long),
        torch.zeros(0, vocab) if draft_probs is None else draft_probs,
        torch.tensor([len(drafts)]),
        torch.tensor([num_masks]),
        torch.tensor([temperature]),
        torch.tensor([top_k]),
        torch.tensor([top_p]),
        torch.tensor(uniforms or [0.5] * len(drafts), dtype=torch.float64),
        torch.ones_like(logits) if noise is None else noise,
        mask_token_id,
        None,
        None if draft_prob_index is None else torch.tensor(draft_prob_index, dtype=torch.long),
    )


# ---- hand-computed cases -------------------------------------------------------------------


def test_greedy_drafts_123_target_argmax_15_emits_1_5() -> None:
    # rows: targets for drafts 0..2 (argmax 1, 5, 3), bonus (7), MASK rows (8, 9)
    step = _run(_one_hot_logits([1, 5, 3, 7, 8, 9], 10), [1, 2, 3], num_masks=2)
    assert step.output_token_ids.tolist() == [[1, 5, -1, -1]]
    assert step.num_accepted.tolist() == [1]
    assert step.next_draft_ids.tolist() == [8, 9]
    assert torch.equal(step.next_draft_probs, torch.zeros(2, 10))


def test_greedy_all_drafts_accepted_emits_bonus_argmax() -> None:
    step = _run(_one_hot_logits([1, 2, 3, 7, 8], 10), [1, 2, 3], num_masks=1)
    assert step.output_token_ids.tolist() == [[1, 2, 3, 7]]
    assert step.num_accepted.tolist() == [3]


def test_greedy_first_draft_rejected_emits_target_argmax_only() -> None:
    step = _run(_one_hot_logits([4, 2, 3, 7], 10), [1, 2, 3], num_masks=0)
    assert step.output_token_ids.tolist() == [[4, -1, -1, -1]]
    assert step.num_accepted.tolist() == [0]


def test_greedy_argmax_tie_takes_first_index() -> None:
    logits = torch.zeros(2, 6)
    logits[0, [2, 4]] = 3.0
    step = _run(logits, [4], num_masks=0)
    assert step.output_token_ids.tolist() == [[2, -1]]


def _two_row_random(target_probs: list[float]) -> Tensor:
    """Logits whose softmax at T=1 is ``target_probs`` in both the target and the bonus row."""
    return torch.tensor([target_probs, target_probs]).log()


def test_random_accepts_iff_target_prob_at_least_u_times_draft_prob() -> None:
    # p(d=2) = 0.2, q(d=2) = 0.6: accept iff u <= 1/3
    logits = _two_row_random([0.0, 0.4, 0.2, 0.4])
    draft_probs = torch.tensor([[0.0, 0.2, 0.6, 0.2]])
    accept = _run(logits, [2], 0, 1.0, draft_probs, [0.33], mask_token_id=0)
    reject = _run(logits, [2], 0, 1.0, draft_probs, [0.34], mask_token_id=0)
    assert accept.num_accepted.tolist() == [1] and reject.num_accepted.tolist() == [0]


def test_random_rejection_emits_argmax_of_residual_over_noise() -> None:
    # p = [0, 0.4, 0.2, 0.4], q = [0, 0.2, 0.6, 0.2]: residual max(0, p - q) = [0, 0.2, 0, 0.2]
    logits = _two_row_random([0.0, 0.4, 0.2, 0.4])
    draft_probs = torch.tensor([[0.0, 0.2, 0.6, 0.2]])
    noise = torch.ones(2, 4)
    noise[0, 1] = 100.0  # tokens 1 and 3 tie on the residual; the noise makes 3 win the race
    step = _run(logits, [2], 0, 1.0, draft_probs, [0.99], noise, mask_token_id=0)
    assert step.output_token_ids.tolist() == [[3, -1]]


def test_random_all_zero_residual_falls_back_to_target() -> None:
    logits = _two_row_random([0.0, 0.25, 0.25, 0.5])
    draft_probs = torch.tensor([[0.0, 0.25, 0.25, 0.5]])  # equals p
    noise = torch.tensor([[1.0, 4.0, 1.0, 4.0], [1.0, 1.0, 1.0, 1.0]])
    step = _run(logits, [2], 0, 1.0, draft_probs, [1.0 + 1e-9], noise, mask_token_id=0)
    assert step.output_token_ids.tolist() == [[2, -1]]  # argmax(p / noise) = 2


def test_random_draft_with_zero_draft_prob_is_rejected() -> None:
    logits = _two_row_random([0.0, 0.4, 0.2, 0.4])
    draft_probs = torch.tensor([[0.0, 0.5, 0.0, 0.5]])
    step = _run(logits, [2], 0, 1.0, draft_probs, [0.0], mask_token_id=0)
    assert step.num_accepted.tolist() == [0]


def test_point_mass_draft_is_accepted_iff_u_at_most_its_target_prob() -> None:
    logits = torch.log(torch.tensor([[1e-9, 0.25, 0.25, 0.5], [0.25, 0.25, 0.25, 0.25]]))
    no_rows = torch.zeros(0, 4)
    accept = _run(logits, [3], 0, 1.0, no_rows, [0.49], mask_token_id=0, draft_prob_index=[-1])
    reject = _run(logits, [3], 0, 1.0, no_rows, [0.51], mask_token_id=0, draft_prob_index=[-1])
    assert accept.num_accepted.tolist() == [1] and reject.num_accepted.tolist() == [0]


def test_point_mass_rejection_emits_the_target_without_the_drafted_token() -> None:
    """p~ = [0, .25, .25, .5], draft 3 rejected: the residual is [0, .25, .25, 0]; noise that
    would pick 3 from p~ picks 2 from the residual (q~ = 1 at 3 takes all of p~(3))."""
    logits = torch.log(torch.tensor([[1e-9, 0.25, 0.25, 0.5], [0.25, 0.25, 0.25, 0.25]]))
    noise = torch.tensor([[1.0, 1.0, 0.9, 0.1], [1.0, 1.0, 1.0, 1.0]])
    step = _run(
        logits,
        [3],
        0,
        1.0,
        torch.zeros(0, 4),
        [0.99],
        noise,
        mask_token_id=0,
        draft_prob_index=[-1],
    )
    assert step.output_token_ids.tolist() == [[2, -1]]


def test_point_masses_and_probs_rows_mix_in_one_request_through_the_index() -> None:
    """Drafts [lookup 1, MASK-row 2]: the first a point mass, the second read from probs row 0.
    u = .3 <= p~(1) = .5 accepts the first; the second has q~(2) = 0 (row 0 puts nothing there)
    and is rejected; the residual there is p~ itself minus row 0 = [0, 0, 0, 1] at row 1."""
    logits = torch.log(
        torch.tensor([[1e-9, 0.5, 0.25, 0.25], [1e-9, 1e-9, 1e-9, 1.0], [0.25, 0.25, 0.25, 0.25]])
    )
    row0 = torch.tensor([[0.0, 0.5, 0.0, 0.5]])
    step = _run(logits, [1, 2], 0, 1.0, row0, [0.3, 0.0], mask_token_id=0, draft_prob_index=[-1, 0])
    assert step.num_accepted.tolist() == [1]
    assert step.output_token_ids.tolist() == [[1, 3, -1]]


def test_random_bonus_is_exponential_race_on_bonus_row() -> None:
    logits = _two_row_random([0.0, 0.4, 0.2, 0.4])
    draft_probs = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    noise = torch.ones(2, 4)
    noise[1, 1] = 10.0  # bonus row: scores [0, 0.04, 0.2, 0.4] -> 3
    step = _run(logits, [2], 0, 1.0, draft_probs, [0.1], noise, mask_token_id=0)
    assert step.output_token_ids.tolist() == [[2, 3]]


def test_mask_token_is_never_emitted_nor_drafted() -> None:
    batch = make_isd_batch(16, 50, 3, 3, mode="mixed", seed=1)
    step = isd_verify_and_draft_ref(*batch.args())
    assert not (step.output_token_ids == batch.mask_token_id).any()
    assert not (step.next_draft_ids == batch.mask_token_id).any()
    assert not step.next_draft_probs[:, batch.mask_token_id].any()


def test_zero_drafts_emit_the_bonus_and_zero_masks_give_no_next_drafts() -> None:
    batch = make_isd_batch(3, 40, [0, 0, 0], [0, 2, 0], mode="random", seed=2)
    step = isd_verify_and_draft_ref(*batch.args())
    assert step.output_token_ids.shape == (3, 1) and step.num_accepted.tolist() == [0, 0, 0]
    assert step.next_draft_ids.shape == (2,) and step.next_draft_probs.shape == (2, 40)
    empty = make_isd_batch(2, 40, [1, 0], [0, 0], mode="greedy", seed=3)
    step = isd_verify_and_draft_ref(*empty.args())
    assert step.next_draft_ids.shape == (0,) and step.next_draft_probs.shape == (0, 40)


def test_top_k_keeps_ties_at_the_threshold() -> None:
    z = torch.tensor([[1.0, 3.0, 2.0, 2.0, 0.0]])
    out = filter_logits(z, torch.tensor([2]), torch.tensor([1.0]))
    assert torch.isfinite(out).tolist() == [[False, True, True, True, False]]


def test_top_p_drops_entries_with_ascending_cumsum_at_most_one_minus_top_p() -> None:
    # probs [0.5, 0.3, 0.15, 0.05], top_p 0.75: ascending cumsum [0.05, 0.2, 0.5, 1] -> drop 0.05, 0.15
    z = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    out = filter_logits(z, torch.tensor([0]), torch.tensor([0.75]))
    assert torch.isfinite(out).tolist() == [[True, True, False, False]]
    only_max = filter_logits(z, torch.tensor([0]), torch.tensor([0.0]))
    assert torch.isfinite(only_max).tolist() == [[True, False, False, False]]


def test_ref_leaves_its_inputs_untouched() -> None:
    batch = make_isd_batch(4, 30, 2, 2, seed=4)
    before = [t.clone() if isinstance(t, Tensor) else t for t in batch.args()]
    isd_verify_and_draft_ref(*batch.args())
    for a, b in zip(batch.args(), before, strict=True):
        assert torch.equal(a, b) if isinstance(a, Tensor) else a == b


# ---- randomized: the ref against a textbook per-request loop ---------------------------------


def _oracle_probs(row: Tensor, temperature: float, top_k: int, top_p: float, mask: int) -> Tensor:
    """vLLM's apply_top_k_top_p_pytorch semantics, written literally, one row, float64."""
    z = row.double().clone()
    z[mask] = float("-inf")
    z = z / temperature
    if 0 < top_k < z.numel():
        z[z < z.sort(descending=True).values[top_k - 1]] = float("-inf")
    if top_p < 1:
        order = z.argsort()
        ascending_cumsum = z[order].softmax(0).cumsum(0)
        drop = ascending_cumsum <= 1 - top_p
        drop[-1] = False
        z[order[drop]] = float("-inf")
    return z.softmax(0)


def _oracle_draft_probs(batch: IsdBatch, draft: int, token: int) -> Tensor:
    """q~ of a draft, written out: its probs row, or a one-hot at the token for a point mass."""
    index = draft if batch.draft_prob_index is None else int(batch.draft_prob_index[draft])
    if index >= 0:
        return batch.draft_probs[index].double()
    q = torch.zeros(batch.logits.shape[1], dtype=torch.float64)
    q[token] = 1.0
    return q


def _oracle(batch: IsdBatch) -> tuple[list[list[int]], list[int], list[int], list[Tensor]]:
    """Per request, per draft, left to right, as in the speculative sampling papers."""
    outputs, num_accepted, next_ids, next_probs = [], [], [], []
    row, draft = 0, 0
    for i in range(batch.num_draft_tokens.numel()):
        n, m = int(batch.num_draft_tokens[i]), int(batch.num_mask_tokens[i])
        params = (float(batch.temperature[i]), int(batch.top_k[i]), float(batch.top_p[i]))
        greedy = params[0] < 1e-5

        def probs(r: int, params=params) -> Tensor:
            return _oracle_probs(batch.logits[r], *params, batch.mask_token_id)

        def argmax(r: int) -> int:
            masked = batch.logits[r].clone()
            masked[batch.mask_token_id] = float("-inf")
            return int(masked.argmax())

        def race(r: int, weights: Tensor) -> int:
            return int((weights / batch.noise[r].double()).argmax())

        tokens: list[int] = []
        for r in range(n):
            d = int(batch.draft_token_ids[draft + r])
            if greedy:
                ok, emitted = d == argmax(row + r), argmax(row + r)
            else:
                p, q = probs(row + r), _oracle_draft_probs(batch, draft + r, d)
                ok = bool(q[d] > 0) and bool(p[d] >= batch.uniforms[draft + r] * q[d])
                residual = (p - q).clamp_min(0)
                emitted = race(row + r, residual if residual.sum() > 0 else p)
            if not ok:
                num_accepted.append(r)
                tokens.append(emitted)
                break
            tokens.append(d)
        else:
            num_accepted.append(n)
            tokens.append(argmax(row + n) if greedy else race(row + n, probs(row + n)))
        outputs.append(tokens)
        for j in range(row + n + 1, row + n + 1 + m):
            next_ids.append(argmax(j) if greedy else race(j, probs(j)))
            next_probs.append(
                torch.zeros(batch.logits.shape[1], dtype=torch.float64) if greedy else probs(j)
            )
        row, draft = row + 1 + n + m, draft + n
    return outputs, num_accepted, next_ids, next_probs


@pytest.mark.parametrize("point_masses", [0.0, 0.5], ids=["probs", "point-masses"])
@pytest.mark.parametrize("mode", ["greedy", "random", "mixed"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("vocab", [97, 1000])
def test_ref_matches_textbook_oracle_on_random_batches(
    mode: str, seed: int, vocab: int, point_masses: float
) -> None:
    """vocab 1000 > the ref's 256-value sorted prefix: exercises its top-k shortcut and the
    full-sort fallback for wide nuclei as well as the full sort. Point masses: half the random
    drafts are a lookup's (q~ a one-hot in the oracle, no probs row in the batch)."""
    gen = torch.Generator().manual_seed(100 + seed)
    num_reqs = int(torch.randint(1, 9, (1,), generator=gen))
    drafts = torch.randint(0, 4, (num_reqs,), generator=gen).tolist()
    masks = torch.randint(0, 4, (num_reqs,), generator=gen).tolist()
    scale = 1.0 if vocab < 200 else 3.0
    batch = make_isd_batch(
        num_reqs,
        vocab,
        drafts,
        masks,
        mode=mode,
        seed=seed,
        logit_scale=scale,
        point_masses=point_masses,
    )
    step = isd_verify_and_draft_ref(*batch.args())
    outputs, num_accepted, next_ids, next_probs = _oracle(batch)
    width = max(drafts) + 1
    expected = torch.tensor([t + [-1] * (width - len(t)) for t in outputs])
    assert torch.equal(step.output_token_ids, expected)
    assert step.num_accepted.tolist() == num_accepted
    assert step.next_draft_ids.tolist() == next_ids
    if next_probs:
        torch.testing.assert_close(
            step.next_draft_probs.double(), torch.stack(next_probs), atol=1e-6, rtol=1e-5
        )


# ---- statistics: the emitted tokens are distributed as the target ----------------------------


def _chi_square_p_value(samples: Tensor, probs: Tensor) -> float:
    """Pearson chi-square p-value of integer ``samples`` against ``probs`` (zero-prob cells must be empty)."""
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    support = probs > 0
    assert counts[~support].sum() == 0, "a token outside the target's support was emitted"
    expected = probs[support].double() * samples.numel()
    statistic = ((counts[support] - expected) ** 2 / expected).sum()
    dof = torch.tensor(float(int(support.sum()) - 1))
    return float(torch.special.gammaincc(dof / 2, statistic / 2))


def test_emitted_tokens_follow_the_target_after_rejection_and_at_the_bonus() -> None:
    """20k identical requests (1 draft, 1 MASK), T=0.8, top-k 6, top-p 0.95 over a vocab of 8.

    Checks four laws with a chi-square test at alpha = 1e-3 each (false-alarm rate <= 4e-3 for an
    unseeded run; the seed makes this run deterministic): the first emitted token ~ p~ of the target
    row (accepted or recovered), the recovered token ~ norm(max(0, p~ - q~)), the bonus ~ p~ of the
    bonus row, the next draft ~ q~ of the MASK row.
    """
    gen = torch.Generator().manual_seed(7)
    num_reqs, vocab, mask = 20_000, 8, 7
    base = torch.randn(3, vocab, generator=gen) * 1.5  # target row, bonus row, MASK row
    draft_logits = base[0] + torch.randn(vocab, generator=gen)
    params = [torch.tensor([v] * 3) for v in (0.8, 6, 0.95)]
    target = target_probs_rows(base, params, mask)
    draft = target_probs_rows(draft_logits[None], [p[:1] for p in params], mask)[0]
    drafts = torch.multinomial(draft, num_reqs, replacement=True, generator=gen)
    step = isd_verify_and_draft_ref(
        base.repeat(num_reqs, 1),
        drafts,
        draft.repeat(num_reqs, 1),
        torch.ones(num_reqs, dtype=torch.long),
        torch.ones(num_reqs, dtype=torch.long),
        torch.full((num_reqs,), 0.8),
        torch.full((num_reqs,), 6),
        torch.full((num_reqs,), 0.95),
        torch.rand(num_reqs, generator=gen, dtype=torch.float64),
        torch.empty(3 * num_reqs, vocab).exponential_(generator=gen),
        mask,
    )
    accepted = step.num_accepted == 1
    residual = (target[0] - draft).clamp_min(0)
    assert 0.05 < accepted.double().mean() < 0.95  # both branches are exercised
    assert _chi_square_p_value(step.output_token_ids[:, 0], target[0]) > 1e-3
    assert (
        _chi_square_p_value(step.output_token_ids[~accepted, 0], residual / residual.sum()) > 1e-3
    )
    assert _chi_square_p_value(step.output_token_ids[accepted, 1], target[1]) > 1e-3
    assert _chi_square_p_value(step.next_draft_ids, target[2]) > 1e-3


def test_point_mass_drafts_leave_the_emitted_token_distributed_as_the_target() -> None:
    """20k requests whose one draft is a lookup's point mass, the target's second most likely
    token (so it is rejected often), T=0.8, top-p 0.95 over a vocab of 8: the first emitted
    token ~ p~ (accepted or recovered), the recovered one ~ p~ without the draft, renormalised,
    and the acceptance rate is p~(draft) (alpha = 1e-3 each)."""
    gen = torch.Generator().manual_seed(11)
    num_reqs, vocab, mask = 20_000, 8, 7
    base = torch.randn(2, vocab, generator=gen) * 1.5  # target row, bonus row
    params = [torch.tensor([v] * 2) for v in (0.8, 0, 0.95)]
    target = target_probs_rows(base, params, mask)
    token = int(target[0].argsort(descending=True)[1])
    step = isd_verify_and_draft_ref(
        base.repeat(num_reqs, 1),
        torch.full((num_reqs,), token),
        torch.zeros(0, vocab),
        torch.ones(num_reqs, dtype=torch.long),
        torch.zeros(num_reqs, dtype=torch.long),
        torch.full((num_reqs,), 0.8),
        torch.zeros(num_reqs, dtype=torch.long),
        torch.full((num_reqs,), 0.95),
        torch.rand(num_reqs, generator=gen, dtype=torch.float64),
        torch.empty(2 * num_reqs, vocab).exponential_(generator=gen),
        mask,
        None,
        torch.full((num_reqs,), -1, dtype=torch.long),
    )
    accepted = step.num_accepted == 1
    rate = float(accepted.double().mean())
    expected = float(target[0, token])
    assert abs(rate - expected) < 4 * (expected * (1 - expected) / num_reqs) ** 0.5
    residual = target[0].clone()
    residual[token] = 0
    assert _chi_square_p_value(step.output_token_ids[:, 0], target[0]) > 1e-3
    assert (
        _chi_square_p_value(step.output_token_ids[~accepted, 0], residual / residual.sum()) > 1e-3
    )
    assert _chi_square_p_value(step.output_token_ids[accepted, 1], target[1]) > 1e-3


def target_probs_rows(logits: Tensor, params: list[Tensor], mask: int) -> Tensor:
    return target_probs(logits, params[0].float(), params[1], params[2].float(), mask)


@pytest.mark.parametrize("vocab", [2048, 5003, 49152])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocked_cpu_argmax_returns_torch_argmax_ties_nan_and_tail_included(
    vocab: int, dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(vocab)
    rows = max(16, -(-_ARGMAX_BLOCKED_FROM // vocab))
    logits = torch.randn(rows, vocab, generator=gen)
    logits[0, [3, vocab - 1]] = 9.0  # a tie across blocks: the first wins
    logits[1, [vocab - 2, vocab - 1]] = 9.0  # a tie in the last (short) block
    logits[2, [_ARGMAX_BLOCK + 1, _ARGMAX_BLOCK + 7]] = 9.0  # a tie within one block
    logits[3] = float("-inf")
    logits[4, [5, 700]] = float("nan")  # NaN counts as the largest
    logits[5, vocab - 1] = 9.0  # the maximum alone in the tail
    logits[6] = 1.0  # every column ties
    logits = logits.to(dtype)
    assert logits.numel() >= _ARGMAX_BLOCKED_FROM and vocab >= 8 * _ARGMAX_BLOCK  # blocked path
    assert torch.equal(argmax_rows(logits), logits.argmax(dim=-1))
    view = logits[::2]  # a strided view as well
    assert torch.equal(argmax_rows(view), view.argmax(dim=-1))
