"""Read ISD's figures from vLLM's spec-decode metrics (`LLM.get_metrics()` or /metrics).

vLLM-free. Under ISD a *round* is one forward of a request: a verify round (K drafts)
or a cold start (no drafts). vLLM's counters then mean:
`spec_decode_num_drafts` = rounds, `..._num_draft_tokens` = real drafts verified,
`..._num_accepted_tokens` = drafts accepted, `..._per_pos[i]` = rounds whose draft i was
accepted. Each round emits accepted + 1 tokens, so tokens per forward = mean acceptance
length = 1 + accepted / rounds. ISD's own counters split the verified drafts by source
(`vllm:idlm_lookup_*`: a lookup in the request's own text; `vllm:idlm_mask_*`: MASK rows).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

_PREFIX = "vllm:spec_decode_"
_SOURCES = "vllm:idlm_"


@dataclass(frozen=True)
class IsdMetrics:
    num_drafts: int  # K
    num_rounds: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_position: tuple[int, ...]
    lookup_draft_tokens: int = 0
    lookup_accepted_tokens: int = 0
    mask_draft_tokens: int = 0
    mask_accepted_tokens: int = 0

    @property
    def lookup_acceptance(self) -> float:
        """Accepted / verified lookup drafts."""
        return (
            self.lookup_accepted_tokens / self.lookup_draft_tokens
            if self.lookup_draft_tokens
            else 0.0
        )

    @property
    def mask_acceptance(self) -> float:
        """Accepted / verified MASK-row drafts."""
        return self.mask_accepted_tokens / self.mask_draft_tokens if self.mask_draft_tokens else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_rounds if self.num_rounds else 0.0

    @property
    def cold_start_share(self) -> float:
        """Rounds without drafts / all rounds, where every verify round carries K drafts (a
        fixed K, no lookup: lookup drafts and strides below K make it an estimate)."""
        if not self.num_rounds:
            return 0.0
        return 1.0 - self.num_draft_tokens / (self.num_drafts * self.num_rounds)

    @property
    def acceptance_per_position(self) -> tuple[float, ...]:
        """P(draft i accepted | a verify round reached position i)."""
        if not self.num_drafts:
            return ()
        verify_rounds = self.num_draft_tokens / self.num_drafts
        reached = [verify_rounds] + list(self.accepted_per_position[:-1])
        return tuple(
            a / r if r else 0.0 for a, r in zip(self.accepted_per_position, reached, strict=True)
        )

    def minus(self, earlier: IsdMetrics) -> IsdMetrics:
        """The figures of the work done since `earlier` was read."""
        before = earlier.accepted_per_position or (0,) * len(self.accepted_per_position)
        return IsdMetrics(
            self.num_drafts,
            self.num_rounds - earlier.num_rounds,
            self.num_draft_tokens - earlier.num_draft_tokens,
            self.num_accepted_tokens - earlier.num_accepted_tokens,
            tuple(a - b for a, b in zip(self.accepted_per_position, before, strict=True)),
            self.lookup_draft_tokens - earlier.lookup_draft_tokens,
            self.lookup_accepted_tokens - earlier.lookup_accepted_tokens,
            self.mask_draft_tokens - earlier.mask_draft_tokens,
            self.mask_accepted_tokens - earlier.mask_accepted_tokens,
        )


def read_isd_metrics(metrics: Iterable[Any]) -> IsdMetrics:
    """From vLLM's `Metric` objects (name plus `value` or `values`)."""
    found: dict[str, Any] = {}
    sources: dict[str, int] = {}
    for metric in metrics:
        name = metric.name
        if name.startswith(_PREFIX):
            found[name[len(_PREFIX) :]] = getattr(metric, "values", None) or getattr(
                metric, "value", 0
            )
        elif name.startswith(_SOURCES):
            sources[name[len(_SOURCES) :]] = int(getattr(metric, "value", 0) or 0)
    per_pos = tuple(int(v) for v in found.get("num_accepted_tokens_per_pos", ()) or ())
    return IsdMetrics(
        num_drafts=len(per_pos),
        num_rounds=int(found.get("num_drafts", 0) or 0),
        num_draft_tokens=int(found.get("num_draft_tokens", 0) or 0),
        num_accepted_tokens=int(found.get("num_accepted_tokens", 0) or 0),
        accepted_per_position=per_pos,
        lookup_draft_tokens=sources.get("lookup_draft_tokens", 0),
        lookup_accepted_tokens=sources.get("lookup_accepted_tokens", 0),
        mask_draft_tokens=sources.get("mask_draft_tokens", 0),
        mask_accepted_tokens=sources.get("mask_accepted_tokens", 0),
    )
