"""One target distribution at GPU precision: the ISD sampler filters like vLLM's sampler.

bf16 logits have many ties; a top-k / top-p filter that resolves a tie at its threshold
differently from vLLM's would draw the first token (vLLM's sampler) and the later ones
(ISD's rows) from different distributions. The ISD sampler runs inside the real vLLM
rejection-sampler interface here, on real `SpecDecodeMetadata` / `SamplingMetadata`.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
from vllm.v1.sample.sampler import Sampler
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

from idlm_kernels.target_probs import filter_logits
from vllm_idlm.config import IsdOptions
from vllm_idlm.engine.sampler import IsdRejectionSampler
from vllm_idlm.engine.state import IsdState
from vllm_idlm.plugin import register
from vllm_idlm.seam.runner import RunnerView

register()  # what vLLM does in every process it starts (the CPU build's fixes included)

K, VOCAB, MASK = 3, 48, 47
TEMPERATURE = [0.9, 0.9, 1.0, 0.7]
TOP_K = [5, 48, 8, 48]
TOP_P = [1.0, 0.6, 0.7, 0.5]


def spec_metadata(slots: list[list[int]]) -> SpecDecodeMetadata:
    num_slots = np.array([len(s) for s in slots])
    cu_sampled = np.cumsum(num_slots + 1)
    starts = cu_sampled - num_slots - 1
    target = np.concatenate([s + np.arange(n) for s, n in zip(starts, num_slots, strict=True)])
    as_tensor = lambda a: torch.tensor(a, dtype=torch.int32)  # noqa: E731
    return SpecDecodeMetadata(
        draft_token_ids=as_tensor([t for s in slots for t in s]),
        num_draft_tokens=num_slots.tolist(),
        cu_num_draft_tokens=as_tensor(np.cumsum(num_slots)),
        cu_num_sampled_tokens=as_tensor(cu_sampled),
        target_logits_indices=as_tensor(target),
        bonus_logits_indices=as_tensor(cu_sampled - 1),
        logits_indices=as_tensor(np.arange(cu_sampled[-1])),
    )


def sampling_metadata(num_reqs: int, max_num_logprobs=None) -> SamplingMetadata:
    """Request i uses the parameters of entry i % 4 of the tables above."""
    zeros = torch.zeros(num_reqs)
    tiled = lambda values: torch.tensor([values[i % 4] for i in range(num_reqs)])  # noqa: E731
    return SamplingMetadata(
        temperature=tiled(TEMPERATURE),
        all_greedy=False,
        all_random=True,
        top_p=tiled(TOP_P),
        top_k=tiled(TOP_K),
        generators={},
        max_num_logprobs=max_num_logprobs,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=zeros,
        presence_penalties=zeros,
        repetition_penalties=zeros + 1,
        output_token_ids=[[] for _ in range(num_reqs)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )


def isd_sampler(num_reqs: int, logprobs_mode="raw_logprobs") -> IsdRejectionSampler:
    req_ids = [f"r{i}" for i in range(num_reqs)]
    runner = SimpleNamespace(
        input_batch=SimpleNamespace(
            req_ids=req_ids,
            spec_token_ids=[[MASK] * K for _ in req_ids],
            greedy_reqs=set(),
        ),
        requests={},
    )
    options = IsdOptions(num_drafts=K, adaptive=False, mask_token_id=MASK)
    sampler = Sampler(logprobs_mode=logprobs_mode)
    return IsdRejectionSampler(
        sampler, None, torch.device("cpu"), RunnerView(runner), options, IsdState()
    )


def bf16_logits(num_rows: int, seed: int = 0) -> torch.Tensor:
    """Logits on a coarse grid, as bf16 rounds them: many exact ties, also at thresholds."""
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(num_rows, VOCAB, generator=gen) * 2).round() / 2
    logits = logits.to(torch.bfloat16)
    logits[:, MASK] = float("-inf")  # the I-DLM model class forces it before sampling
    return logits


def vllm_filtered(rows: torch.Tensor, req_of_row: list[int]) -> torch.Tensor:
    """vLLM's own transform of the rows: temperature, then its top-k / top-p."""
    t = torch.tensor([TEMPERATURE[r] for r in req_of_row])[:, None]
    k = torch.tensor([TOP_K[r] for r in req_of_row])
    p = torch.tensor([TOP_P[r] for r in req_of_row])
    return apply_top_k_top_p(rows.float() / t, k, p)


def test_the_test_has_teeth_ties_at_the_threshold_split_the_two_filters():
    """On these logits a tie-keeping filter (the kernels' own) keeps a different set from
    vLLM's at some threshold: an ISD path using it would change the distribution."""
    logits = bf16_logits(64)
    req = [i % 4 for i in range(64)]
    ours = filter_logits(
        logits.float() / torch.tensor([TEMPERATURE[r] for r in req])[:, None],
        torch.tensor([TOP_K[r] for r in req]),
        torch.tensor([TOP_P[r] for r in req]),
    )
    theirs = vllm_filtered(logits, req)
    assert not torch.equal(ours.isfinite(), theirs.isfinite())


def test_draft_probs_of_mask_rows_are_vllms_filtered_distribution_on_bf16_ties():
    num_reqs = 4
    slots = [[MASK] * K] * num_reqs  # cold starts: row 0 emits, rows 1..K draft
    logits = bf16_logits(num_reqs * (K + 1), seed=1)
    sampler = isd_sampler(num_reqs)
    out = sampler(spec_metadata(slots), None, logits.clone(), sampling_metadata(num_reqs))
    rows_of = lambda i: list(range(i * (K + 1), (i + 1) * (K + 1)))  # noqa: E731
    for i in range(num_reqs):
        rows = rows_of(i)
        expected = vllm_filtered(logits[rows], [i] * (K + 1)).softmax(-1)
        _, stored = sampler.state.pending[f"r{i}"]
        assert torch.allclose(stored, expected[1:], atol=1e-6)
        assert torch.equal(stored > 0, expected[1:] > 0)  # the same kept set, ties included
        emitted = int(out.sampled_token_ids[i, 0])
        assert expected[0, emitted] > 0


def test_emitted_tokens_follow_vllms_first_token_distribution_on_bf16_ties(chi_square_p_value):
    """Row 0 of a cold start is sampled by ISD; the same logits sampled by vLLM's own
    sampler (how the first token of every request is drawn) must give the same
    distribution: seeded chi-square over 3000 draws per parameter set, p > 1e-4 each."""
    torch.manual_seed(0)
    copies, rounds = 500, 6  # 4 parameter sets x 500 copies per call, 6 calls
    num_reqs = 4 * copies
    slots = [[MASK] * K] * num_reqs
    rows = bf16_logits(4 * (K + 1), seed=2)
    logits = rows.view(4, K + 1, VOCAB).repeat(copies, 1, 1).view(-1, VOCAB)
    metadata, sm = spec_metadata(slots), sampling_metadata(num_reqs)
    sampler = isd_sampler(num_reqs)
    first_rows = logits[:: K + 1]
    isd, plain = [], []
    for _ in range(rounds):
        isd.append(sampler(metadata, None, logits.clone(), sm).sampled_token_ids[:, 0])
        plain.append(sampler.sampler(first_rows.float().clone(), sm).sampled_token_ids.view(-1))
    isd_t, plain_t = torch.cat(isd).view(-1, 4), torch.cat(plain).view(-1, 4)
    for i in range(4):
        kept = vllm_filtered(first_rows[i : i + 1], [i]).isfinite()[0]
        assert bool(kept[isd_t[:, i]].all()), "ISD emitted a token vLLM's filter drops"
        p = chi_square_p_value(isd_t[:, i].tolist(), plain_t[:, i].tolist())
        assert p > 1e-4, f"parameter set {i}: p={p:.2e}"


@pytest.mark.parametrize("mode", ["processed_logprobs", "raw_logprobs"])
def test_logprobs_come_from_the_distribution_sampled(mode):
    """processed mode: log of the filtered distribution the token was drawn from;
    raw mode: the model's unfiltered log-softmax (vLLM's meaning of both)."""
    num_reqs = 4
    slots = [[MASK] * K] * num_reqs
    logits = bf16_logits(num_reqs * (K + 1), seed=3)
    sampler = isd_sampler(num_reqs, logprobs_mode=mode)
    out = sampler(spec_metadata(slots), None, logits.clone(), sampling_metadata(num_reqs, 0))
    width = out.sampled_token_ids.shape[1]
    for i in range(num_reqs):
        row = logits[i * (K + 1)]
        token = int(out.sampled_token_ids[i, 0])
        if mode == "processed_logprobs":
            expected = vllm_filtered(row[None], [i]).log_softmax(-1)[0, token]
        else:
            expected = row.float().log_softmax(-1)[token]
        value = out.logprobs_tensors.logprobs[i * width, 0]
        assert torch.isclose(value, expected, atol=1e-5), (i, float(value), float(expected))
