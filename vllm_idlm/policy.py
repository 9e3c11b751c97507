"""The stride policy: one K per step for the batch (K drafts, stride N = K + 1, as in ISD.md),
and each request's draft source.

vLLM-free. In one paragraph: each step the batch takes the K (0 is plain decoding, or K = N - 1
for one of the strides N the checkpoint was trained for) that maximises the expected tokens per
second, sum_i tokens_i(K) / t(B, K), where t(B, K) is what a step of B requests at K costs
(`StepTimes`: timed on dummy steps at engine start, or pinned by the user, plus what the engine
spends around a step, learnt from the real steps of each band of batch sizes) and tokens_i(K)
follows request i's acceptance per position (`tokens_per_forward`; moving averages of the
verdicts on its MASK-row drafts, started from the engine-wide ones). A new K is taken only when
it is expected to beat the current one by `margin`, and not before the current one was held
`min_dwell` steps (unless its cost at this batch size was a guess: then as soon as a step of it
was timed); an engine starts plain. Positions beyond K get no verdicts, so every `probe_every`
steps the batch drafts one position more for one step (the interval doubles, up to 16 times,
while probes change nothing). Per request, drafts come from the MASK rows of the last step, or
from a lookup (`engine.lookup`) where that matched and its first token has agreed with the
emitted text more often than the MASK rows' first draft has (both are scored on every step both
exist), and always after a rejection, where the MASK rows have nothing to offer; at K = 0, as
many of its tokens as its record says pay for their query rows (`lookup_length`). Exactness does
not depend on any of this: whatever is drafted is verified exactly.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

REQUEST_EMA = 0.2  # weight of one verdict in a request's estimates
ENGINE_EMA = 0.02  # ... in the engine-wide estimates new requests start from
PRIOR = 0.6  # the engine-wide acceptance per position before any verdict
CELL_EMA = 0.1  # weight of one step's time in its cell of `StepTimes`
MAX_PROBE_BACKOFF = 16  # probes that change nothing stretch the interval up to this factor


@dataclass(frozen=True)
class PolicyConfig:
    """ks: the K values the checkpoint was trained for (K = N - 1 of its strides N; 0, plain
    decoding, is always a choice). The rest are the user's keys (`"adaptive": {...}`)."""

    ks: tuple[int, ...]
    margin: float = 0.15
    min_dwell: int = 8
    probe_every: int = 32  # 0: never probe
    step_ms: float | None = None  # pinned cost: step_ms + row_ms per query row
    row_ms: float | None = None

    def __post_init__(self) -> None:
        if not self.ks or min(self.ks) < 1:
            raise ValueError(f"adaptive: ks must be K values >= 1, got {self.ks}")
        if not 0 <= self.margin < 1:
            raise ValueError(f"adaptive: margin must be in [0, 1), got {self.margin!r}")
        for name in ("min_dwell", "probe_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value or value < 0:
                raise ValueError(f"adaptive: {name} must be a step count >= 0, got {value!r}")
        pinned = (self.step_ms, self.row_ms)
        if (pinned[0] is None) != (pinned[1] is None):
            raise ValueError("adaptive: a pinned step cost needs both step_ms and row_ms")
        if self.step_ms is not None and (self.step_ms <= 0 or self.row_ms <= 0):
            raise ValueError("adaptive: step_ms and row_ms must be > 0")

    @property
    def choices(self) -> tuple[int, ...]:
        return (0, *sorted(set(self.ks)))


def tokens_per_forward(conditional: Sequence[float], k: int, fill: float = 0.0) -> float:
    """Expected tokens per forward at K = k from the conditional acceptance per position
    (a_j = P(draft j accepted | drafts 1..j-1 were)). A step with drafts emits 1 + accepted;
    one without (a cold start after a rejection) emits 1, unless a lookup fills it with drafts
    (share `fill`). With r_j = a_1..a_j and S_k = r_1 + .. + r_k, a step has drafts with
    probability w = 1 / (1 + (1 - r_k)(1 - fill)), so tokens = 1 + w S_k (ADAPTIVE.md's
    (2 + S_k - r_k) / (2 - r_k) at fill 0)."""
    if k == 0:
        return 1.0
    r, s = 1.0, 0.0
    for a in conditional[:k]:
        r *= a
        s += r
    return 1.0 + s / (1.0 + (1.0 - r) * (1.0 - fill))


def band_of(batch: int) -> int:
    """Half-octave bands of batch sizes: 1, 2, 3, 4, 5-6, 7-9, 10-13, .."""
    return round(2 * math.log2(max(batch, 1)))


@dataclass
class StepTimes:
    """Seconds a decode step of `batch` requests at K = k costs.

    `table` holds the times measured at start (dummy steps: one row per request at k = 0,
    1 + 2k rows at K = k; `vllm_idlm.engine.calibration`) at each of `sizes`, interpolated
    linearly between them and extended along the last two beyond. A real step costs what its
    forward costs plus what the engine spends around it (scheduling, the speculative
    metadata, applying verdicts, shipping outputs: milliseconds per step for every K
    alike, and more on the speculative path), which no dummy step shows: each cell (band of
    batch sizes, k) the engine runs keeps the mean of its real steps' time over the table's.
    A cell it has not run takes the least such offset of its band (none: 0), so an unknown
    cell is priced no dearer than the cells run beside it: a k priced too low that way is
    tried, timed and corrected, one priced too high would never be tried and stay wrong.
    Pinned: a line, never corrected."""

    choices: tuple[int, ...]
    sizes: list[int]
    table: list[list[float]]  # [size][choice] seconds
    pinned: bool = False
    offsets: dict[tuple[int, int], float] = field(default_factory=dict)

    @classmethod
    def linear(cls, choices: Sequence[int], step_s: float, row_s: float) -> StepTimes:
        """The pinned cost: step_s + row_s per query row (b (1 + 2k) rows at K = k)."""
        sizes = [1, 2]
        table = [[step_s + row_s * b * (1 + 2 * k) for k in choices] for b in sizes]
        return cls(tuple(choices), sizes, table, pinned=True)

    def start(self, batch: int, k: int) -> float:
        """The table's time, interpolated."""
        j = self.choices.index(k)
        sizes, table = self.sizes, self.table
        if len(sizes) == 1:
            return table[0][j] * max(batch, 1) / sizes[0]
        i = min(max(bisect.bisect_left(sizes, batch), 1), len(sizes) - 1)
        b0, b1 = sizes[i - 1], sizes[i]
        t0, t1 = table[i - 1][j], table[i][j]
        return max(t0 + (t1 - t0) * (batch - b0) / (b1 - b0), 1e-9)

    def offset(self, batch: int, k: int) -> float:
        band = band_of(batch)
        own = self.offsets.get((band, k))
        if own is not None:
            return own
        beside = [v for (b, _), v in self.offsets.items() if b == band]
        return min(beside, default=0.0)

    def __call__(self, batch: int, k: int) -> float:
        return max(self.start(batch, k) + self.offset(batch, k), 1e-9)

    def known(self, batch: int, k: int) -> bool:
        """Whether a real step of this band and stride was timed (a pinned cost: always)."""
        return self.pinned or (band_of(batch), k) in self.offsets

    def observe(self, batch: int, k: int, seconds: float) -> None:
        """One real decode step of `batch` requests at K = k took `seconds`."""
        if self.pinned or k not in self.choices:
            return
        key = (band_of(batch), k)
        extra = seconds - self.start(batch, k)
        old = self.offsets.get(key)
        self.offsets[key] = extra if old is None else old + CELL_EMA * (extra - old)


@dataclass
class _Request:
    conditional: list[float]  # acceptance per position, given the positions before passed
    fill: float = 0.0  # share of its cold steps a lookup filled with drafts
    lookup_first: float = 0.5  # how often the lookup's first token was the emitted one
    mask_first: float = 0.5  # how often the MASK rows' first draft was


class StridePolicy:
    """Per-request estimates, the batch's K and each request's draft source. `fixed`: K is
    always that (`"adaptive": false`); the draft sources are still chosen."""

    def __init__(self, config: PolicyConfig, times: StepTimes, fixed: int | None = None) -> None:
        self.config = config
        self.fixed = fixed
        self.times = times
        self.choices = config.choices
        self.max_k = self.choices[-1]
        self.engine = [PRIOR] * self.max_k  # engine-wide conditional acceptance
        self.observed = [0] * self.max_k  # verdicts per position, engine-wide
        self.requests: dict[str, _Request] = {}
        self.k = 0  # the K held: plain decoding until drafting beats it by the margin
        self.since = -config.min_dwell  # the step it was taken on (the first may move at once)
        self.guessed = False  # it was taken on a guess of its step time (`StepTimes.known`)
        self.step = 0
        self.step_k = 0  # the K chosen for the step now scheduled
        self.probing = False  # ... a probe
        self._probe_at = config.probe_every
        self._backoff = 1
        self._k_at_probe: int | None = None
        self.chosen: Counter[int] = Counter()  # k -> request-steps given it
        self.probes = 0
        self.switches = 0

    def _request(self, req_id: str) -> _Request:
        state = self.requests.get(req_id)
        if state is None:
            state = self.requests[req_id] = _Request(list(self.engine))
        return state

    def forget(self, req_ids) -> None:
        for req_id in req_ids:
            self.requests.pop(req_id, None)

    def observe(self, req_id: str, num_drafts: int, num_accepted: int) -> None:
        """One verify step: drafts 1..num_drafts were offered, the first num_accepted passed."""
        if num_drafts <= 0:
            return
        conditional = self._request(req_id).conditional
        for j in range(min(num_accepted + 1, num_drafts, self.max_k)):
            hit = 1.0 if j < num_accepted else 0.0
            conditional[j] += REQUEST_EMA * (hit - conditional[j])
            self.engine[j] += ENGINE_EMA * (hit - self.engine[j])
            self.observed[j] += 1

    def observe_cold(self, req_id: str, filled: bool) -> None:
        """A step without MASK drafts in hand: whether a lookup filled it."""
        state = self._request(req_id)
        state.fill += REQUEST_EMA * (float(filled) - state.fill)

    def score_sources(
        self, req_id: str, lookup_first: int | None, mask_first: int | None, emitted: int
    ) -> None:
        """The first token each source proposed for a position (None: it proposed none), and
        the token the request emitted there, whichever source was verified."""
        state = self._request(req_id)
        if lookup_first is not None:
            state.lookup_first += REQUEST_EMA * (
                float(lookup_first == emitted) - state.lookup_first
            )
        if mask_first is not None:
            state.mask_first += REQUEST_EMA * (float(mask_first == emitted) - state.mask_first)

    def prefers_lookup(self, req_id: str) -> bool:
        """Where both sources have drafts: the lookup's, if it has been right more often."""
        state = self._request(req_id)
        return state.lookup_first > state.mask_first

    def lookup_bar(self, batch: int) -> float:
        """At K = 0, how often a request's lookup must have been right for its drafts to pay
        for their rows: the cost of a query row relative to a plain step of `batch` requests
        (per request), from the step times at the largest K (a few hundredths at one request
        on this CPU, about a half once the forward is compute-bound)."""
        extra = self.times(batch, self.max_k) / self.times(batch, 0) - 1.0
        return max(extra, 0.0) / (2 * self.max_k)

    def lookup_length(self, req_id: str, bar: float, room: int) -> int:
        """At K = 0, how many of a lookup's tokens (at most `room`) to draft: the j-th pays for
        its row while the chance that the first j are all right, taken as lookup_first ** j,
        is above `bar` (0: the request decodes plainly this step; D38)."""
        right = self._request(req_id).lookup_first
        length, chance = 0, right
        while length < room and chance > bar:
            length += 1
            chance *= right
        return length

    def expected_tokens(self, req_ids: Sequence[str]) -> list[float]:
        """Expected tokens per forward of the requests together, at each choice of k (one pass
        over each request's positions: `tokens_per_forward` for every k at once)."""
        totals = [0.0] * len(self.choices)
        wanted = set(self.choices)
        for req_id in req_ids:
            state = self.requests.get(req_id) or self._request(req_id)
            totals[0] += 1.0
            r, s, i, miss = 1.0, 0.0, 1, 1.0 - state.fill
            for k, a in enumerate(state.conditional, start=1):
                r *= a
                s += r
                if k in wanted:
                    totals[i] += 1.0 + s / (1.0 + (1.0 - r) * miss)
                    i += 1
        return totals

    def choose(self, req_ids: Sequence[str], batch: int) -> int:
        """The K of the drafting requests `req_ids` for the next step of a batch of
        `batch` requests (the others decode plainly and count one token each)."""
        self.step += 1
        self.probing = False
        self.step_k = self._choose(req_ids, batch)
        return self.step_k

    def _choose(self, req_ids: Sequence[str], batch: int) -> int:
        if self.fixed is not None:
            return self.fixed
        if not req_ids:
            return 0
        others = batch - len(req_ids)
        tokens = self.expected_tokens(req_ids)
        goodput = {
            k: (t + others) / self.times(batch, k)
            for k, t in zip(self.choices, tokens, strict=True)
        }
        best = max(self.choices, key=goodput.__getitem__)
        # The dwell holds a stride whose cost was measured; one taken on the least offset of
        # its band (never run at this batch size) is judged again as soon as its first step
        # is timed: at demo c = 64, dwells in untried strides cost 4-6 points against plain.
        settled = self.step - self.since >= self.config.min_dwell
        judged = self.guessed and self.times.known(batch, self.k)
        if (
            best != self.k
            and (settled or judged)
            and goodput[best] > goodput[self.k] * (1.0 + self.config.margin)
        ):
            self.guessed = not self.times.known(batch, best)
            self.k, self.since = best, self.step
            self.switches += 1
        elif judged:  # the guess held up: its dwell goes on
            self.guessed = False
        k = self.k
        if k < self.max_k and self._probe_due():
            k = self.choices[self.choices.index(k) + 1]
            self.probing = True
            self.probes += 1
        self.chosen[k] += len(req_ids)
        return k

    def _probe_due(self) -> bool:
        every = self.config.probe_every
        if not every or self.step < self._probe_at:
            return False
        # A probe that changed nothing since the last one stretches the interval.
        quiet = self._k_at_probe == self.k
        self._backoff = min(2 * self._backoff, MAX_PROBE_BACKOFF) if quiet else 1
        self._k_at_probe = self.k
        self._probe_at = self.step + every * self._backoff
        return True
