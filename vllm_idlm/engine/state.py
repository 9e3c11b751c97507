"""What one ISD step hands to the next: drafts proposed by the MASK rows and their probs."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class StepDrafts:
    """Next drafts of the step just sampled, in the runner's batch order.

    `drafts[i]` is None when request i needs a cold start (a draft was rejected, or the
    request had no MASK slots this step).
    """

    req_ids: list[str]
    drafts: list[list[int] | None]


@dataclass
class IsdState:
    """Shared by the rejection sampler (writer) and the proposer (reader) of one runner."""

    # req_id -> [num drafts, V] fp32 draft probs of the drafts now scheduled (random
    # requests only; greedy drafts are argmaxes and need none).
    draft_probs: dict[str, torch.Tensor] = field(default_factory=dict)
    last_step: StepDrafts | None = None
    # Counters for the cold-start share (steps without real drafts / all ISD steps).
    num_steps: int = 0
    num_cold_starts: int = 0

    def take_last_step(self) -> StepDrafts | None:
        step, self.last_step = self.last_step, None
        return step

    def forget_except(self, live_req_ids: set[str]) -> None:
        for req_id in [r for r in self.draft_probs if r not in live_req_ids]:
            del self.draft_probs[req_id]
