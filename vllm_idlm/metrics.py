"""Read ISD's figures from vLLM's spec-decode metrics (`LLM.get_metrics()` or /metrics).

vLLM-free. Under ISD a *round* is one forward of a request with draft slots: a verify round
(up to 2K - 1 drafts) or a cold start (no drafts). vLLM's counters then mean:
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
    num_positions: int  # draft positions counted: 2K - 1 (`IsdOptions.max_drafts`)
    num_rounds: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_position: tuple[int, ...]
    drafted_per_position: tuple[int, ...] = ()
    lookup_draft_tokens: int = 0
    lookup_accepted_tokens: int = 0
    mask_draft_tokens: int = 0
    mask_accepted_tokens: int = 0

    @property
    def tokens_per_forward(self) -> float:
        """Over the rounds (forwards with draft slots, cold starts included); steps the stride
        policy decoded plainly are not rounds (`benchmarks/common.py` counts every forward)."""
        return 1.0 + self.num_accepted_tokens / self.num_rounds if self.num_rounds else 0.0

    @property
    def verify_rounds(self) -> int:
        """Rounds that verified at least one draft (each drafts position 1)."""
        return self.drafted_per_position[0] if self.drafted_per_position else 0

    @property
    def cold_start_share(self) -> float:
        """Rounds without drafts / all rounds."""
        return 1.0 - self.verify_rounds / self.num_rounds if self.num_rounds else 0.0

    @property
    def acceptance_rate_per_position(self) -> tuple[float, ...]:
        """Drafts accepted at position i / drafts verified there (r_i, the share of rounds
        that reached and passed position i among those that drafted it)."""
        return tuple(
            a / d if d else 0.0
            for a, d in zip(self.accepted_per_position, self.drafted_per_position, strict=False)
        )

    @property
    def acceptance_per_position(self) -> tuple[float, ...]:
        """P(draft i accepted | drafts before it were): r_i / r_{i-1}, exact where every round
        drafts as many positions (a fixed K without lookup), positions never drafted left out."""
        out, before = [], 1.0
        for r, d in zip(self.acceptance_rate_per_position, self.drafted_per_position, strict=False):
            if not d:
                break
            out.append(r / before if before else 0.0)
            before = r
        return tuple(out)

    @property
    def lookup_acceptance(self) -> float:
        """Accepted / verified lookup drafts."""
        if not self.lookup_draft_tokens:
            return 0.0
        return self.lookup_accepted_tokens / self.lookup_draft_tokens

    @property
    def mask_acceptance(self) -> float:
        """Accepted / verified MASK-row drafts."""
        return self.mask_accepted_tokens / self.mask_draft_tokens if self.mask_draft_tokens else 0.0

    def minus(self, earlier: IsdMetrics) -> IsdMetrics:
        """The figures of the work done since `earlier` was read."""

        def less(now: tuple[int, ...], then: tuple[int, ...]) -> tuple[int, ...]:
            then = then or (0,) * len(now)
            return tuple(a - b for a, b in zip(now, then, strict=True))

        return IsdMetrics(
            self.num_positions,
            self.num_rounds - earlier.num_rounds,
            self.num_draft_tokens - earlier.num_draft_tokens,
            self.num_accepted_tokens - earlier.num_accepted_tokens,
            less(self.accepted_per_position, earlier.accepted_per_position),
            less(self.drafted_per_position, earlier.drafted_per_position),
            self.lookup_draft_tokens - earlier.lookup_draft_tokens,
            self.lookup_accepted_tokens - earlier.lookup_accepted_tokens,
            self.mask_draft_tokens - earlier.mask_draft_tokens,
            self.mask_accepted_tokens - earlier.mask_accepted_tokens,
        )


def read_isd_metrics(metrics: Iterable[Any]) -> IsdMetrics:
    """From vLLM's `Metric` objects (name plus `value` or `values`)."""
    found: dict[str, Any] = {}
    sources: dict[str, int] = {}
    drafted_at: dict[int, int] = {}
    for metric in metrics:
        name = metric.name
        if name.startswith(_PREFIX):
            found[name[len(_PREFIX) :]] = getattr(metric, "values", None) or getattr(
                metric, "value", 0
            )
        elif name == _SOURCES + "draft_tokens_per_pos":  # one counter per position label
            position = int((getattr(metric, "labels", None) or {}).get("position", 0))
            drafted_at[position] = int(getattr(metric, "value", 0) or 0)
        elif name.startswith(_SOURCES):
            sources[name[len(_SOURCES) :]] = getattr(metric, "value", 0)
    per_pos = tuple(int(v) for v in found.get("num_accepted_tokens_per_pos", ()) or ())
    drafted = tuple(drafted_at.get(i, 0) for i in range(len(per_pos))) if drafted_at else ()
    return IsdMetrics(
        num_positions=len(per_pos),
        num_rounds=int(found.get("num_drafts", 0) or 0),
        num_draft_tokens=int(found.get("num_draft_tokens", 0) or 0),
        num_accepted_tokens=int(found.get("num_accepted_tokens", 0) or 0),
        accepted_per_position=per_pos,
        drafted_per_position=drafted,
        lookup_draft_tokens=int(sources.get("lookup_draft_tokens", 0) or 0),
        lookup_accepted_tokens=int(sources.get("lookup_accepted_tokens", 0) or 0),
        mask_draft_tokens=int(sources.get("mask_draft_tokens", 0) or 0),
        mask_accepted_tokens=int(sources.get("mask_accepted_tokens", 0) or 0),
    )
