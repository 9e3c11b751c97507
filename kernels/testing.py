"""Random ISD batches and the float tolerance rule, shared by the tests and the GPU benchmark."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from idlm_kernels.isd_sample import IsdStep, row_layout
from idlm_kernels.target_probs import SAMPLING_EPS, target_probs

Mode = Literal["greedy", "random", "mixed"]


@dataclass
class IsdBatch:
    """The arguments of ``isd_verify_and_draft`` for one batch, in signature order."""

    logits: Tensor
    draft_token_ids: Tensor
    draft_probs: Tensor
    num_draft_tokens: Tensor
    num_mask_tokens: Tensor
    temperature: Tensor
    top_k: Tensor
    top_p: Tensor
    uniforms: Tensor
    noise: Tensor
    mask_token_id: int
    draft_prob_index: Tensor | None = None  # [D]: row of draft_probs, -1 a point mass

    def args(self) -> tuple:
        return (
            self.logits,
            self.draft_token_ids,
            self.draft_probs,
            self.num_draft_tokens,
            self.num_mask_tokens,
            self.temperature,
            self.top_k,
            self.top_p,
            self.uniforms,
            self.noise,
            self.mask_token_id,
            None,
            self.draft_prob_index,
        )


def _sampling_params(
    num_reqs: int, vocab: int, mode: Mode, gen: torch.Generator
) -> tuple[Tensor, Tensor, Tensor]:
    temperature = 0.5 + torch.rand(num_reqs, generator=gen)
    if mode == "greedy":
        temperature.zero_()
    elif mode == "mixed":
        temperature[torch.rand(num_reqs, generator=gen) < 0.4] = 0.0
    k_choices = torch.tensor([0, 0, 1, 5, 50, vocab, vocab + 3])
    p_choices = torch.tensor([1.0, 1.0, 0.95, 0.8, 0.5, 0.0])
    top_k = k_choices[torch.randint(0, len(k_choices), (num_reqs,), generator=gen)]
    top_p = p_choices[torch.randint(0, len(p_choices), (num_reqs,), generator=gen)]
    return temperature, top_k, top_p


def make_isd_batch(
    num_reqs: int,
    vocab: int,
    num_drafts: int | list[int],
    num_masks: int | list[int],
    mode: Mode = "mixed",
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    logit_scale: float = 3.0,
    draft_noise: float = 0.3,
    point_masses: float = 0.0,
) -> IsdBatch:
    """A random batch whose drafts come from target rows perturbed by ``draft_noise`` (so many pass).

    ``point_masses``: the share of random drafts made point masses (as a lookup proposes them: the
    perturbed row's argmax, no probs row; ``draft_prob_index`` -1), the rest keeping their probs
    rows, compacted, behind the index."""
    gen = torch.Generator().manual_seed(seed)
    n = torch.tensor(num_drafts if isinstance(num_drafts, list) else [num_drafts] * num_reqs)
    m = torch.tensor(num_masks if isinstance(num_masks, list) else [num_masks] * num_reqs)
    num_rows, num_draft = int((1 + n + m).sum()), int(n.sum())
    mask_token_id = vocab - 2
    logits = torch.randn(num_rows, vocab, generator=gen) * logit_scale
    logits[:, mask_token_id] += 2 * logit_scale  # MASK would win everywhere if it were not removed
    temperature, top_k, top_p = _sampling_params(num_reqs, vocab, mode, gen)
    layout = row_layout(n, m, num_rows)
    req = layout.row_req[layout.draft_rows]
    draft_logits = logits[layout.draft_rows] + draft_noise * torch.randn(
        num_draft, vocab, generator=gen
    )
    draft_probs = target_probs(
        draft_logits, temperature[req], top_k[req], top_p[req], mask_token_id
    )
    greedy = temperature[req] < SAMPLING_EPS
    draft_token_ids = torch.where(
        greedy,
        draft_logits.masked_fill(torch.arange(vocab) == mask_token_id, float("-inf")).argmax(-1),
        torch.multinomial(draft_probs.clamp_min(0), 1, generator=gen).flatten()
        if num_draft
        else torch.zeros(0, dtype=torch.long),
    )
    draft_probs[greedy] = 0.0
    draft_prob_index = None
    if point_masses and mode != "greedy":
        point = (torch.rand(num_draft, generator=gen) < point_masses) & ~greedy
        argmax = draft_logits.masked_fill(torch.arange(vocab) == mask_token_id, float("-inf"))
        draft_token_ids = torch.where(point, argmax.argmax(-1), draft_token_ids)
        held = torch.nonzero(~point).flatten()
        draft_prob_index = torch.full((num_draft,), -1, dtype=torch.long)
        draft_prob_index[held] = torch.arange(held.numel())
        draft_probs = draft_probs[held]
    if mode == "greedy":
        draft_probs = draft_probs[:0]
    uniforms = torch.rand(num_draft, generator=gen, dtype=torch.float64)
    noise = torch.empty(num_rows, vocab).exponential_(generator=gen)
    return IsdBatch(
        logits.to(device=device, dtype=dtype),
        draft_token_ids.to(device),
        draft_probs.to(device),
        n.to(device),
        m.to(device),
        temperature.to(device),
        top_k.to(device),
        top_p.to(device),
        uniforms.to(device),
        noise.to(device),
        mask_token_id,
        None if draft_prob_index is None else draft_prob_index.to(device),
    )


def gold_next_draft_probs(batch: IsdBatch) -> Tensor:
    """float64 ``q~`` of every MASK row (zeros for greedy requests): the tolerance rule's gold."""
    n, m = batch.num_draft_tokens.cpu(), batch.num_mask_tokens.cpu()
    logits = batch.logits.cpu()
    layout = row_layout(n, m, logits.shape[0])
    req = layout.row_req[layout.mask_rows]
    temperature = batch.temperature.cpu()[req]
    probs = target_probs(
        logits[layout.mask_rows],
        temperature,
        batch.top_k.cpu()[req],
        batch.top_p.cpu()[req],
        batch.mask_token_id,
        dtype=torch.float64,
    )
    return probs.masked_fill((temperature < SAMPLING_EPS)[:, None], 0.0)


def assert_close_to_gold(
    actual: Tensor, reference: Tensor, gold: Tensor, atol: float = 1e-6, name: str = ""
) -> None:
    """The style guide's rule: ``|actual - gold| <= 2 |reference - gold| + atol`` (max over entries)."""
    gold = gold.double().cpu()
    if actual.shape != gold.shape or reference.shape != gold.shape:
        raise AssertionError(f"{name}: shapes {actual.shape}, {reference.shape}, {gold.shape}")
    if gold.numel() == 0:
        return
    actual_err = (actual.double().cpu() - gold).abs().max().item()
    reference_err = (reference.double().cpu() - gold).abs().max().item()
    if actual_err > 2 * reference_err + atol:
        raise AssertionError(
            f"{name}: error {actual_err:.3g} > 2 x reference error {reference_err:.3g} + {atol:g}"
        )


def assert_isd_steps_match(actual: IsdStep, reference: IsdStep, batch: IsdBatch) -> None:
    """Token outputs ``torch.equal``; next draft probs within the tolerance rule of the fp64 gold."""
    for name in ("output_token_ids", "num_accepted", "next_draft_ids"):
        got, want = getattr(actual, name).cpu(), getattr(reference, name).cpu()
        if not torch.equal(got, want):
            raise AssertionError(f"{name} differs:\n{got.tolist()}\nvs reference\n{want.tolist()}")
    assert_close_to_gold(
        actual.next_draft_probs, reference.next_draft_probs, gold_next_draft_probs(batch),
        name="next_draft_probs",
    )  # fmt: skip
