"""The adaptive policy checked against plain decoding, as measured on this engine.

vLLM-free. The policy's model prices a step from its rows and whether it drafts; what the
engine spends around a step beyond that (scheduling slots, the sampler's pass, a plain step
next to speculative ones) it may misprice, and then its strides can lose to plain decoding
and to every fixed K at once. `SelfCheck` compares the two where they run: the tokens per
second each delivered, per band of batch sizes, in windows of steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from vllm_idlm.adaptive_config import AdaptiveConfig

MODEL, PLAIN, HOLD = "model", "plain", "hold"


@dataclass
class _Band:
    """The self-check of one band of batch sizes: comparing (phase MODEL, then PLAIN: the
    arm whose window is being measured) or holding the last verdict (phase HOLD)."""

    left: int  # measured steps left in this phase
    hold: int  # steps of the next hold
    phase: str = MODEL
    held: str = MODEL  # the last verdict
    # arm -> [tokens, seconds] of its window; HOLD -> [tokens, seconds, steps] of the hold
    sums: dict[str, list[float]] = field(default_factory=dict)
    drafted: bool = False  # the model drafted in its window
    judged: bool = False  # a verdict was reached before


class SelfCheck:
    """The policy's strides against plain decoding, as measured on this engine.

    Batches are grouped in bands of sizes (half an octave: 1, 2, 3, 4, 5-6, 7-9, 10-13, ..),
    as closed loops of c clients and steady loads keep them. In each band it measures a window
    of `check_window` steps of the model's strides, then (unless the model decoded plainly
    all along) one of plain decoding, the first `SETTLE` steps of each window not counted
    (the switch itself: drafts made or in hand). Plain decoding is then held unless the
    model delivered at least 1 - `check_margin` of its tokens per second, for `check_hold`
    steps, doubled (up to `max_check_hold`) each time the verdict repeats; then it compares
    again, so a batch whose acceptance or load changed is not held to an old verdict. A hold
    of the model's strides is watched: every window it falls behind plain decoding's last
    window ends it (a window is short; the hold has more steps to judge by). Steps that
    carry prompt tokens are not counted: prefills cost the same either way."""

    SETTLE = 2

    def __init__(self, config: AdaptiveConfig) -> None:
        self.config = config
        self.bands: dict[int, _Band] = {}
        self.verdicts = {MODEL: 0, PLAIN: 0}
        self.steps = 0  # steps measured

    @staticmethod
    def band(requests: int) -> int:
        return round(2 * math.log2(max(requests, 1)))

    def _window(self) -> int:
        return self.config.check_window + self.SETTLE

    def arm(self, band: int) -> str:
        """What the band runs now: MODEL (the policy's strides) or PLAIN."""
        b = self.bands.get(band)
        if b is None:
            b = self.bands[band] = _Band(left=self._window(), hold=self.config.check_hold)
        return b.held if b.phase == HOLD else b.phase

    def observe(self, band: int, arm: str, drafted: bool, tokens: int, seconds: float) -> None:
        """One measured step of `band`, planned as `arm` (`drafted`: the model drafted)."""
        self.steps += 1
        b = self.bands.get(band)
        if b is None or arm != (b.held if b.phase == HOLD else b.phase):
            return  # planned before the band's phase changed
        b.left -= 1
        if b.phase == HOLD:
            if b.held == MODEL and PLAIN in b.sums:
                self._watch(b, tokens, seconds)
            if b.left <= 0:
                b.phase, b.left, b.sums, b.drafted = MODEL, self._window(), {}, False
            return
        if b.left < self.config.check_window:
            sums = b.sums.setdefault(arm, [0.0, 0.0])
            sums[0] += tokens
            sums[1] += seconds
            b.drafted |= drafted
        if b.left > 0:
            return
        if b.phase == MODEL and b.drafted:
            b.phase, b.left = PLAIN, self._window()
            return
        verdict = MODEL
        if b.phase == PLAIN:
            (mt, ms), (pt, ps) = b.sums[MODEL], b.sums[PLAIN]
            if pt * ms * (1.0 - self.config.check_margin) > mt * ps:
                verdict = PLAIN
        self._hold(b, verdict)

    def _watch(self, b: _Band, tokens: int, seconds: float) -> None:
        """A step of a hold of the model's strides: every `check_window` steps, the hold's
        tokens per second against plain decoding's last window; a hold that falls behind it
        ends at once (one window said the model was ahead; the hold says otherwise)."""
        sums = b.sums.setdefault(HOLD, [0.0, 0.0, 0])
        sums[0] += tokens
        sums[1] += seconds
        sums[2] += 1
        if sums[2] % self.config.check_window:
            return
        (ht, hs, _), (pt, ps) = sums, b.sums[PLAIN]
        if pt * hs * (1.0 - self.config.check_margin) > ht * ps:
            self._hold(b, PLAIN)

    def _hold(self, b: _Band, verdict: str) -> None:
        repeat = b.judged and verdict == b.held
        b.hold = min(2 * b.hold, self.config.max_check_hold) if repeat else self.config.check_hold
        b.phase, b.held, b.left, b.judged = HOLD, verdict, b.hold, True
        self.verdicts[verdict] += 1
