"""What one ISD step hands to the next: drafts made by the MASK rows and their probs."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from vllm_idlm.adaptive import StridePolicy


@dataclass
class StoredDrafts:
    """The drafts a sampled request was given and the distributions they were drawn from."""

    token_ids: tuple[int, ...]
    probs: torch.Tensor  # [len(token_ids), V] fp32

    def matching(self, scheduled: tuple[int, ...]) -> torch.Tensor | None:
        """The probs of `scheduled` if it is a prefix of these drafts (vLLM may trim
        the tail), else None: drafts and probs out of step are never paired."""
        if scheduled != self.token_ids[: len(scheduled)]:
            return None
        return self.probs[: len(scheduled)]


@dataclass
class IsdState:
    """Shared by the rejection sampler (writer), the proposer (reader) and the runner
    hooks (which forget finished, preempted and resumed requests) of one worker."""

    # req_id -> next drafts made in the step just sampled; the proposer takes them.
    pending: dict[str, list[int]] = field(default_factory=dict)
    # req_id -> drafts now proposed or scheduled for a random request, with their probs.
    draft_probs: dict[str, StoredDrafts] = field(default_factory=dict)
    # req_id -> drafts dropped on a plain step and scored against the tokens the request
    # emits after them (greedy only), and how many matched so far (`IsdProposer._score`).
    scoring: dict[str, tuple[list[int], int]] = field(default_factory=dict)
    # Verdicts scored that way (closed, handed to the policy).
    num_scored: int = 0
    # Counters for the cold-start share (steps without real drafts / all ISD steps).
    num_steps: int = 0
    num_cold_starts: int = 0
    # Steps whose drafts could not be verified (no matching probs) and were ignored.
    num_unverifiable: int = 0
    # Steps without draft slots, all greedy, that took vLLM's plain path (runner hook).
    num_plain_steps: int = 0
    # The adaptive stride policy (None: fixed K).
    policy: StridePolicy | None = None

    def forget(self, req_ids: Iterable[str]) -> None:
        """Drop the drafts of requests that lost them (preempted, resumed) or finished."""
        for req_id in req_ids:
            self.pending.pop(req_id, None)
            self.draft_probs.pop(req_id, None)
            self.scoring.pop(req_id, None)

    def finish(self, req_ids: Iterable[str]) -> None:
        """Drop everything kept for finished or aborted requests."""
        req_ids = list(req_ids)
        self.forget(req_ids)
        if self.policy is not None:
            self.policy.forget(req_ids)

    @property
    def num_tracked(self) -> int:
        policy = len(self.policy.requests) if self.policy is not None else 0
        return len(self.pending) + len(self.draft_probs) + len(self.scoring) + policy
