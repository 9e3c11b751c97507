"""Engine-free reference ISD decoder: a plain PyTorch loop over an HF model with a KV cache.

Each forward runs [last, d_0..d_{n-1}, MASK_1..MASK_K] causally on top of the committed KV;
the plugin's verifier (`vllm_idlm.verifier.verify_and_draft`, vLLM-free) turns the logits into
accepted drafts, the emitted token and the next drafts; the cache is then cropped back to the
committed tokens. It measures what the paper measures: per-depth acceptance, introspective
acceptance (mean min(1, p/q) over drafts = 1 - TV) and tokens per forward (TPF).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vllm_idlm.verifier import verify_and_draft


@dataclass
class DecodeStats:
    """Counters over one or many generations (add them up with `merge`)."""

    num_forwards: int = 0
    num_tokens: int = 0
    depth_tried: list[int] = field(default_factory=list)  # [d] drafts verified at depth d+1
    depth_accepted: list[int] = field(default_factory=list)
    overlap_sum: float = 0.0  # sum of (1 - TV(p, q)) over verified drafts
    overlap_count: int = 0

    def count_depth(self, depth: int, accepted: bool) -> None:
        while len(self.depth_tried) <= depth:
            self.depth_tried.append(0)
            self.depth_accepted.append(0)
        self.depth_tried[depth] += 1
        self.depth_accepted[depth] += int(accepted)

    def merge(self, other: DecodeStats) -> None:
        self.num_forwards += other.num_forwards
        self.num_tokens += other.num_tokens
        self.overlap_sum += other.overlap_sum
        self.overlap_count += other.overlap_count
        for d, (t, a) in enumerate(zip(other.depth_tried, other.depth_accepted, strict=True)):
            for _ in range(t):
                self.count_depth(d, _ < a)

    @property
    def tokens_per_forward(self) -> float:
        return self.num_tokens / max(1, self.num_forwards)

    @property
    def acceptance_by_depth(self) -> list[float]:
        return [
            a / t if t else 0.0 for t, a in zip(self.depth_tried, self.depth_accepted, strict=True)
        ]

    @property
    def introspective_acceptance(self) -> float:
        return self.overlap_sum / max(1, self.overlap_count)


def _forward(model, ids: list[int], cache) -> torch.Tensor:
    out = model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
    return out.logits[0].float()


def _new_cache(model, prompt: list[int]):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    if len(prompt) > 1:
        _forward(model, prompt[:-1], cache)
    return cache


def _target_probs(logits: torch.Tensor, temperature: float, mask_token_id: int) -> torch.Tensor:
    logits = logits.clone()
    logits[:, mask_token_id] = float("-inf")
    return torch.softmax(logits / temperature, dim=-1)


@torch.no_grad()
def isd_generate(
    model,
    prompt: list[int],
    stride: int,
    max_new: int,
    mask_token_id: int,
    temperature: float = 0.0,
    seed: int = 0,
    eos_token_id: int | None = None,
) -> tuple[list[int], DecodeStats]:
    """Generate up to `max_new` tokens with ISD at stride N (K = N-1 MASKs per forward)."""
    if stride < 2:
        raise ValueError(f"stride={stride} must be >= 2")
    k = stride - 1
    cache = _new_cache(model, prompt)
    gen = torch.Generator().manual_seed(seed)
    temp = torch.tensor([temperature], dtype=torch.float32)
    stats, out = DecodeStats(), []
    last, drafts, draft_probs = prompt[-1], [], None
    while len(out) < max_new and (eos_token_id is None or eos_token_id not in out):
        logits = _forward(model, [last, *drafts, *([mask_token_id] * k)], cache)
        step = verify_and_draft(
            logits,
            torch.tensor(drafts, dtype=torch.int64),
            draft_probs,
            [len(drafts)],
            [k],
            temp,
            None,
            None,
            {0: gen},
            mask_token_id,
        )
        accepted = int(step.num_accepted[0])
        emitted = step.output_token_ids[0, : accepted + 1].tolist()
        _count(stats, logits, drafts, draft_probs, accepted, temperature, mask_token_id)
        stats.num_forwards += 1
        out += emitted
        cache.crop(-(len(drafts) + k - accepted))  # keep last + accepted drafts
        last = emitted[-1]
        if accepted == len(drafts):
            drafts, draft_probs = step.next_draft_ids.tolist(), step.next_draft_probs
        else:
            drafts, draft_probs = [], None
    out = out[:max_new]
    if eos_token_id is not None and eos_token_id in out:
        out = out[: out.index(eos_token_id) + 1]
    stats.num_tokens = len(out)
    return out, stats


def _count(
    stats: DecodeStats,
    logits,
    drafts,
    draft_probs,
    accepted: int,
    temperature: float,
    mask_token_id: int,
) -> None:
    """Depth r+1 is tried when drafts 0..r-1 were accepted; overlap 1-TV needs sampled drafts."""
    reached = min(len(drafts), accepted + 1)
    for r in range(reached):
        stats.count_depth(r, r < accepted)
    if temperature > 0 and reached:
        target = _target_probs(logits[:reached], temperature, mask_token_id)
        overlap = torch.minimum(target, draft_probs[:reached].float()).sum(-1)
        stats.overlap_sum += float(overlap.sum())
        stats.overlap_count += reached
    elif reached:
        stats.overlap_sum += min(accepted, reached)
        stats.overlap_count += reached


@torch.no_grad()
def greedy_generate(
    model, prompt: list[int], max_new: int, mask_token_id: int, eos_token_id: int | None = None
) -> list[int]:
    """Plain AR greedy decoding, one token per forward (MASK excluded, as the verifier does)."""
    cache = _new_cache(model, prompt)
    last, out = prompt[-1], []
    while len(out) < max_new:
        logits = _forward(model, [last], cache)[-1]
        logits[mask_token_id] = float("-inf")
        last = int(logits.argmax())
        out.append(last)
        if last == eos_token_id:
            break
    return out
