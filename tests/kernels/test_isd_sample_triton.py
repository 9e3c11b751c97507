"""isd_verify_and_draft_triton against the reference: tokens torch.equal, probs by the tolerance rule.

On CPU the kernel runs under TRITON_INTERPRET=1 (see conftest) at small sizes; on a GPU the same
tests run compiled, plus the full-vocab cases marked ``gpu``.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from idlm_kernels import ops  # noqa: E402
from idlm_kernels.isd_sample import isd_verify_and_draft_ref  # noqa: E402
from idlm_kernels.isd_sample_triton import IsdTuning, isd_verify_and_draft_triton  # noqa: E402
from idlm_kernels.testing import assert_isd_steps_match, make_isd_batch  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _check(batch, tuning: IsdTuning | None = None) -> None:
    reference = isd_verify_and_draft_ref(*batch.args())
    actual = isd_verify_and_draft_triton(*batch.args(), tuning=tuning)
    assert_isd_steps_match(actual, reference, batch)


@pytest.mark.parametrize("mode", ["greedy", "random", "mixed"])
@pytest.mark.parametrize("seed", [0, 1])
def test_kernel_matches_ref_vocab_100(mode: str, seed: int) -> None:
    batch = make_isd_batch(
        5, 100, [3, 0, 2, 1, 3], [3, 3, 0, 1, 2], mode=mode, seed=seed, device=DEVICE
    )
    _check(batch)


@pytest.mark.parametrize("mode", ["random", "mixed"])
@pytest.mark.parametrize("point_masses", [0.5, 1.0], ids=["some", "all"])
def test_kernel_matches_ref_with_point_mass_drafts(mode: str, point_masses: float) -> None:
    """Lookup drafts (point masses, no probs row) beside MASK-row drafts read through the index;
    all point masses: an empty ``draft_probs`` with every random draft indexed -1."""
    batch = make_isd_batch(
        5, 100, [3, 0, 2, 1, 3], [3, 3, 0, 1, 2], mode=mode, seed=21, device=DEVICE,
        draft_noise=1.0, point_masses=point_masses,
    )  # fmt: skip
    if point_masses == 1.0 and mode == "random":
        assert batch.draft_probs.shape[0] == 0
    _check(batch)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_matches_ref_half_precision_logits(dtype: torch.dtype) -> None:
    _check(make_isd_batch(3, 100, 3, 3, mode="mixed", dtype=dtype, seed=5, device=DEVICE))


@pytest.mark.parametrize("mode", ["random", "mixed"])
def test_kernel_matches_ref_batch_of_one(mode: str) -> None:
    _check(make_isd_batch(1, 100, 3, 3, mode=mode, seed=6, device=DEVICE))


def test_kernel_matches_ref_zero_drafts_cold_start() -> None:
    _check(make_isd_batch(3, 100, 0, 3, mode="mixed", seed=7, device=DEVICE))


def test_kernel_matches_ref_zero_masks() -> None:
    _check(make_isd_batch(3, 100, 3, 0, mode="mixed", seed=8, device=DEVICE))


def test_kernel_keeps_ties_at_top_k_and_top_p_thresholds_like_ref() -> None:
    """Integer-valued logits: many ties at the k-th value and inside the nucleus."""
    batch = make_isd_batch(6, 100, 2, 2, mode="random", seed=9, device=DEVICE)
    batch.logits = batch.logits.round()
    batch.top_k = torch.tensor([1, 3, 10, 0, 7, 0], device=DEVICE)
    batch.top_p = torch.tensor([1.0, 0.5, 0.9, 0.3, 0.0, 0.99], device=DEVICE)
    _check(batch)


def test_kernel_matches_ref_vocab_8193_mixed() -> None:
    """An awkward vocab (one past a power of two) spans several blocks."""
    _check(make_isd_batch(3, 8193, [3, 1, 0], [3, 2, 3], mode="mixed", seed=10, device=DEVICE))


def test_dispatcher_routes_to_the_forced_backend() -> None:
    batch = make_isd_batch(2, 100, 2, 2, mode="mixed", seed=11, device=DEVICE)
    with ops.use_backend("triton"):
        actual = ops.isd_verify_and_draft(*batch.args())
    with ops.use_backend("ref"):
        reference = ops.isd_verify_and_draft(*batch.args())
    assert_isd_steps_match(actual, reference, batch)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("vocab", [100, 8193, 151936])
@pytest.mark.parametrize("num_reqs", [1, 8, 64])
@pytest.mark.parametrize("mode", ["greedy", "random", "mixed"])
def test_kernel_matches_ref_full_grid_on_gpu(vocab: int, num_reqs: int, mode: str) -> None:
    _check(make_isd_batch(num_reqs, vocab, 3, 3, mode=mode, seed=num_reqs, device="cuda"))


def test_kernel_handles_rows_whose_first_block_is_all_minus_inf() -> None:
    """Regression: the online max/sum computed exp(-inf - -inf) = NaN for a row whose first vocab
    block (4096 entries) was entirely -inf, which poisoned the normaliser of unfiltered rows."""
    batch = make_isd_batch(2, 8193, 1, 1, mode="random", seed=12, device=DEVICE)
    batch.logits[:, :5000] = float("-inf")
    batch.top_k.zero_()
    batch.top_p.fill_(1.0)
    _check(batch)


@pytest.mark.parametrize("seed", [13, 14])
def test_kernel_matches_ref_at_extreme_sampling_params(seed: int) -> None:
    """k = 1 and V - 1, top-p just below 1 and near 0, temperatures 2e-5 / 1e-4 / 100, -inf holes."""
    batch = make_isd_batch(
        4, 100, [3, 2, 1, 0], [1, 2, 3, 3], mode="random", seed=seed, device=DEVICE
    )
    batch.logits[:, 10:20] = float("-inf")
    batch.top_k = torch.tensor([1, 99, 50, 0], device=DEVICE)
    batch.top_p = torch.tensor([0.999999, 1e-6, 0.5, 0.3], device=DEVICE)
    batch.temperature = torch.tensor([2e-5, 1e-4, 100.0, 1.0], device=DEVICE)
    _check(batch)


@pytest.mark.parametrize("cap", [0, 4])
@pytest.mark.parametrize("vocab", [100, 8193])
def test_kernel_matches_ref_when_thresholds_search_the_whole_row(cap: int, vocab: int) -> None:
    """cap 0: never the compacted candidates; cap 4: only when at most 4 entries pass the edge."""
    batch = make_isd_batch(3, vocab, [2, 1, 0], [1, 2, 2], mode="random", seed=15, device=DEVICE)
    batch.top_k = torch.tensor([3, 0, 40], device=DEVICE)
    batch.top_p = torch.tensor([0.9, 0.7, 1.0], device=DEVICE)
    _check(batch, IsdTuning(cap=cap))


def test_kernel_matches_ref_with_more_than_64_requests() -> None:
    """Past 64 requests each program locates its request in a wider block (BLOCK_B = 128)."""
    gen = torch.Generator().manual_seed(16)
    drafts = torch.randint(0, 2, (66,), generator=gen).tolist()
    masks = torch.randint(0, 2, (66,), generator=gen).tolist()
    _check(make_isd_batch(66, 40, drafts, masks, mode="mixed", seed=16, device=DEVICE))


def test_all_greedy_batch_accepts_a_broadcast_noise_view() -> None:
    """Greedy rows never read the noise, so an all-greedy caller may pass ones(1, V).expand(R, V)
    (row stride 0) instead of allocating [R, V]."""
    batch = make_isd_batch(3, 100, 2, 2, mode="greedy", seed=17, device=DEVICE)
    batch.noise = torch.ones(1, 100, device=DEVICE).expand(batch.logits.shape[0], 100)
    _check(batch)


@pytest.mark.parametrize("impl", [isd_verify_and_draft_ref, isd_verify_and_draft_triton])
def test_both_backends_refuse_sampled_drafts_without_draft_probs(impl) -> None:
    """Regression: the Triton path used to treat missing draft probs as zeros and reject
    every sampled draft silently; it now refuses, exactly like the reference."""
    batch = make_isd_batch(3, 100, [2, 0, 1], 2, mode="mixed", seed=11, device=DEVICE)
    batch.temperature = torch.tensor([0.0, 0.0, 0.9], device=DEVICE)
    batch.draft_probs = batch.draft_probs[:0]
    with pytest.raises(ValueError, match="draft_probs is empty but a random request has drafts"):
        impl(*batch.args())
    batch.temperature = torch.tensor([0.0, 0.9, 0.0], device=DEVICE)  # random, but no drafts
    impl(*batch.args())
