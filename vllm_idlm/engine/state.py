"""What one ISD step hands to the next: the drafts the MASK rows made, what was proposed."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from vllm_idlm.policy import StridePolicy


@dataclass
class Proposal:
    """The drafts proposed for a request's next step: `num_lookup` lookup drafts (point masses)
    first, then MASK-row drafts, with the probs those were drawn from (random requests)."""

    token_ids: tuple[int, ...]
    num_lookup: int = 0
    probs: torch.Tensor | None = None  # [len(token_ids) - num_lookup, V] fp32

    def matching(self, scheduled: tuple[int, ...]) -> bool:
        """Whether `scheduled` is a prefix of these drafts (vLLM may trim the tail): drafts and
        probs out of step are never paired."""
        return scheduled == self.token_ids[: len(scheduled)]


@dataclass
class SourceCounts:
    """Drafts verified and accepted per source (lookup: point masses; mask: MASK rows)."""

    lookup_drafts: int = 0
    lookup_accepted: int = 0
    mask_drafts: int = 0
    mask_accepted: int = 0

    def add(self, num_drafts: int, num_accepted: int, num_lookup: int) -> None:
        lookup = min(num_lookup, num_drafts)
        lookup_accepted = min(num_accepted, lookup)
        self.lookup_drafts += lookup
        self.lookup_accepted += lookup_accepted
        self.mask_drafts += num_drafts - lookup
        self.mask_accepted += num_accepted - lookup_accepted

    def add_counts(self, other: SourceCounts) -> None:
        self.lookup_drafts += other.lookup_drafts
        self.lookup_accepted += other.lookup_accepted
        self.mask_drafts += other.mask_drafts
        self.mask_accepted += other.mask_accepted

    def as_list(self) -> list[int]:
        return [self.lookup_drafts, self.lookup_accepted, self.mask_drafts, self.mask_accepted]


@dataclass
class IsdState:
    """Shared by the rejection sampler (writer of `pending`), the proposer (writer of
    `proposed`) and the runner hooks (which forget finished, preempted and resumed requests)
    of one worker."""

    # req_id -> the drafts the MASK rows made in the step just sampled (and their probs, for
    # random requests); the proposer takes them.
    pending: dict[str, tuple[list[int], torch.Tensor | None]] = field(default_factory=dict)
    # req_id -> the drafts now proposed or scheduled; the sampler pairs them with the slots.
    proposed: dict[str, Proposal] = field(default_factory=dict)
    # req_id -> the first draft each source offered for the step now scheduled (None: none),
    # scored against the token the request emits there (`StridePolicy.score_sources`).
    offered: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)
    # Counters for the cold-start share (steps without real drafts / all ISD steps).
    num_steps: int = 0
    num_cold_starts: int = 0
    # Steps whose drafts could not be verified (no matching proposal) and were ignored.
    num_unverifiable: int = 0
    # Steps without draft slots that took vLLM's plain path (runner hook).
    num_plain_steps: int = 0
    # Verified drafts per source, since the engine started (this step's, for the metrics).
    sources: SourceCounts = field(default_factory=SourceCounts)
    step_sources: SourceCounts = field(default_factory=SourceCounts)
    # The stride policy (with a fixed K under `"adaptive": false`).
    policy: StridePolicy | None = None

    def forget(self, req_ids: Iterable[str]) -> None:
        """Drop the drafts of requests that lost them (preempted, resumed) or finished."""
        for req_id in req_ids:
            self.pending.pop(req_id, None)
            self.proposed.pop(req_id, None)
            self.offered.pop(req_id, None)

    def finish(self, req_ids: Iterable[str]) -> None:
        """Drop everything kept for finished or aborted requests."""
        req_ids = list(req_ids)
        self.forget(req_ids)
        if self.policy is not None:
            self.policy.forget(req_ids)

    @property
    def num_tracked(self) -> int:
        policy = len(self.policy.requests) if self.policy is not None else 0
        return len(self.pending) + len(self.proposed) + len(self.offered) + policy
