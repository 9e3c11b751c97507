"""The adaptive policy's settings (`vllm_idlm.adaptive`), checked as they are given.

vLLM-free: the user's `"adaptive": {...}` object sets them (`vllm_idlm.config`), the policy
and its self-check read them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class AdaptiveConfig:
    """strides: the K values a request may use (0, plain decoding, is always allowed)."""

    strides: tuple[int, ...]
    ema: float = 0.15
    prior: float = 0.6
    engine_ema: float = 0.01
    relax: float = 0.05
    hysteresis: float = 0.05
    min_dwell: int = 4
    probe_every: int = 16
    max_probe_every: int = 256
    # Steps between plain probes (`StridePolicy._plain_probe_due`).
    plain_probe_every: int = 32
    # How much more the batch's plan must be expected to deliver than plain decoding (a
    # fraction of plain decoding's tokens per second; `BatchPlanner.best`): `enter_margin`
    # for a batch whose last plan was plain to start drafting, `plain_margin` for one that
    # drafts to go on drafting. The higher bar to enter keeps a batch whose plan hovers a
    # few percent over plain decoding from flipping (RESULTS.md, twenty-fourth session).
    plain_margin: float = 0.05
    enter_margin: float = 0.15
    # The check against plain decoding (`SelfCheck`; opt-in: on this 2-core machine its
    # windows measured too noisily to gain, see RESULTS.md): measured steps per window, the
    # first steps held after a verdict (doubling while verdicts agree, up to max_check_hold),
    # and the margin plain decoding must win by.
    self_check: bool = False
    check_window: int = 24
    check_hold: int = 64
    max_check_hold: int = 2048
    check_margin: float = 0.02
    # Price small batches on the step times measured at start where they leave the straight
    # line in rows (`StepCost.bend`); false keeps the line.
    bend: bool = True
    # Where a plain batch stays plain after its joint probe, greedy requests score the
    # probe's drafts against the tokens they then emit instead of verifying them
    # (`IsdProposer._plain_step`); false verifies them.
    score_plain: bool = True
    # The batch's plan (`BatchPlanner`) is kept between steps until an input to it
    # moved by more than this: an acceptance estimate by this much, or the predicted time of
    # a step (any plan's, the batch's size) by this fraction. Verdicts, the estimates' drift
    # back (`relax`) and the step cost's refits move them a little on most steps: made anew
    # on every such step, the policy's choice took 0.20 ms of a 7-9 ms plain step at
    # concurrency 16, kept 0.08-0.09 (RESULTS.md, twenty-sixth session); 0 makes it anew on
    # any change.
    replan_tolerance: float = 0.02

    def __post_init__(self) -> None:
        if not self.strides or min(self.strides) < 1:
            raise ValueError(f"adaptive: strides must be K values >= 1, got {self.strides}")
        rates = (self.ema, self.engine_ema)
        if (
            not all(0 < w <= 1 for w in rates)
            or not 0 <= self.prior <= 1
            or not 0 <= self.relax < 1
            or not 0 <= self.plain_margin < 1
            or not 0 <= self.enter_margin < 1
            or not 0 <= self.replan_tolerance < 1
        ):
            raise ValueError(
                "adaptive: ema and engine_ema in (0, 1], prior in [0, 1], relax, plain_margin, "
                f"enter_margin and replan_tolerance in [0, 1), got {self}"
            )
        counts = (
            self.min_dwell,
            self.plain_probe_every,
            self.probe_every,
            self.max_probe_every,
            self.check_window,
            self.check_hold,
            self.max_check_hold,
        )
        if any(isinstance(n, bool) or int(n) != n for n in counts):
            raise ValueError(
                "adaptive: min_dwell, plain_probe_every, probe_every, max_probe_every, "
                f"check_window, check_hold and max_check_hold are step counts, got {self}"
            )
        if self.min_dwell < 0 or min(counts[1:]) < 1:
            raise ValueError(
                "adaptive: min_dwell >= 0, plain_probe_every >= 1, probe_every >= 1, "
                "max_probe_every >= 1, check_window >= 1, check_hold >= 1 and "
                f"max_check_hold >= 1, got {self}"
            )
        if not isinstance(self.self_check, bool) or not 0 <= self.check_margin < 1:
            raise ValueError(
                f"adaptive: self_check is true or false and check_margin in [0, 1), got {self}"
            )
        for name in ("bend", "score_plain"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"adaptive: {name} is true or false, got {getattr(self, name)!r}")

    @property
    def max_drafts(self) -> int:
        return max(self.strides)

    @property
    def probe_cap(self) -> int:
        """The longest interval between probes (never shorter than `probe_every`)."""
        return max(self.probe_every, self.max_probe_every)

    @functools.cached_property
    def choices(self) -> tuple[int, ...]:
        return (0, *sorted(set(self.strides)))
