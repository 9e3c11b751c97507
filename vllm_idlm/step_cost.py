"""The adaptive policy's model of what a step costs, and how engine steps feed it.

vLLM-free. A step of R decode rows, n of its requests carrying draft slots, costs
a + b R (+ d + e n when n > 0, + m per MASK slot, + p per prompt token of prefill chunks; +
the bend of small batches away from the line, `StepCost.bend`), measured as the engine starts
(`vllm_idlm.engine.calibration`) and refined online from every step's time; b is held near
its measurement at start unless the steps' rows vary enough to say otherwise (`anchor_b`),
d and e never fall below what was measured at start (`floor_d`, `floor_e`); m is kept as
measured at start.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from operator import itemgetter


@dataclass
class StepCost:
    """c(R, n, M) = a + b R + [n > 0] d + e n + m M for a step of R decode rows (query rows
    that sample) of which n requests carry draft slots, M of the rows MASK slots, refined
    online by exponentially weighted least squares (pinned: kept as given, neither measured
    nor refitted). e is what each drafting request adds beyond its rows: the ISD sampler's
    verify-and-draft work and the engine's bookkeeping per speculative request (0-0.3 ms
    fitted on the demo models at concurrency 8, RESULTS.md); it is solved only where the
    number of drafting requests varies from one speculative step to another. Steps that also carry prompt tokens
    (prefill chunks) are fitted with a term of their own, p per prompt token: prompt rows
    cost a forward but no sampling and no per-request work, and in a busy engine most steps
    carry some; counting them as rows would price the policy's rows at the prompt rows'
    rate."""

    a: float
    b: float
    d: float = 0.0
    p: float = 0.0
    e: float = 0.0
    # What a MASK slot costs over a plain row (the gated adapter opens on it in lossless
    # mode), measured at start over the trained strides and held: the online steps' MASK
    # slots move with their rows and cannot tell the two apart.
    m: float = 0.0
    a_start: float = 0.0  # a as measured at start (0: not measured), for plain probes
    d_min: float = 0.0  # the floor of d (`floor_d`)
    e_min: float = 0.0  # the floor of e (`floor_e`)
    b_anchor: float = 0.0  # the per-row cost measured at start (`anchor_b`)
    anchor_weight: float = 0.0  # what that measurement counts for in the fit
    forget: float = 0.98
    pinned: bool = False
    refit_every: int = 8  # steps between least-squares solves (statistics every step)
    # Where plain steps measured at start leave the line a + b R: (R, seconds over the line)
    # at each measured R, interpolated between them, none beyond them (`bend`).
    shape: list[tuple[int, float]] = field(default_factory=list)
    # Weighted sufficient statistics of (x = [1, R, spec, prompt tokens, n], t).
    _xx: list[list[float]] = field(default_factory=lambda: [[0.0] * 5 for _ in range(5)])
    _xt: list[float] = field(default_factory=lambda: [0.0] * 5)
    _seen: int = 0

    def __call__(self, rows: float, drafting: int, masks: float = 0.0) -> float:
        """The cost of a step of `rows` decode rows of which `drafting` requests draft and
        `masks` are MASK slots."""
        spec = self.d + self.e * drafting + self.m * masks if drafting else 0.0
        return self.a + self.b * rows + self.bend(rows) + spec

    def bend(self, rows: float) -> float:
        """What a step of `rows` decode rows costs over the line a + b R, as measured at start.
        Small batches on a CPU do not follow the line: SmolLM2's plain step took 49-57 ms at 1
        and 2 rows and 39-40 ms at 4 and 6 (its matmuls take another path under 4 rows), so a
        line through 1-512 rows priced one or two requests' extra rows at ~3 ms each where
        they cost nothing, and kept them from drafting where drafting paid 1.28x. On a GPU the
        first few dozen rows are flat against a line fitted up to 512, the same way round.
        Interpolated between the measured row counts; none outside them."""
        shape = self.shape
        if not shape or rows < shape[0][0] or rows > shape[-1][0]:
            return 0.0
        i = bisect.bisect_left(shape, rows, key=_rows_of)  # the first measured R >= rows
        r1, s1 = shape[i]
        if not i or rows == r1:
            return s1
        r0, s0 = shape[i - 1]
        return s0 + (s1 - s0) * (rows - r0) / (r1 - r0)

    def observe(
        self, rows: int, drafting: int, seconds: float, prompt_tokens: int = 0, masks: int = 0
    ) -> None:
        if self.pinned:
            return
        # The online fit refines the line; the bend and the MASK slots' cost stay as measured.
        seconds -= self.bend(rows) + self.m * masks
        x = (1.0, float(rows), 1.0 if drafting else 0.0, float(prompt_tokens), float(drafting))
        f, xx = self.forget, self._xx
        self._xt = [f * t + xi * seconds for t, xi in zip(self._xt, x, strict=True)]
        for i, xi in enumerate(x):
            xx[i] = [f * v + xi * xj for v, xj in zip(xx[i], x, strict=True)]
        self._seen += 1
        if self._seen % self.refit_every == 0:
            self._refit()

    def floor_d(self, seconds: float) -> None:
        """Keep d at least `seconds` (what the engine measured of the speculative path at
        start): the online fit may raise d, never put it below what was measured."""
        self.d_min = max(seconds, 0.0)
        self.d = max(self.d, self.d_min) if self._seen else self.d_min

    def floor_e(self, seconds: float) -> None:
        """Keep e at least `seconds` per drafting request (measured at start), as `floor_d`."""
        self.e_min = max(seconds, 0.0)
        self.e = max(self.e, self.e_min) if self._seen else self.e_min

    def anchor_b(self, b: float, weight: float) -> None:
        """Fit b as a ridge toward `b` (measured at start on rows chosen over a wide range):
        `weight` is that measurement's information about the slope, sum (R - mean R)^2 over
        its points, the units in which the online steps' own spread of rows counts. Steps at
        one concurrency vary their rows little, and only with the policy's strides: at
        concurrency 1 a step of more rows is also a step that drafts and emits more tokens,
        and a free fit laid on b what the engine spends per emitted token and the slow
        outliers of a few steps (0.51 ms per row against 0.12 measured), which priced the
        longer strides out. A batch whose rows vary widely outweighs the anchor."""
        self.b_anchor, self.anchor_weight = max(b, 0.0), max(weight, 0.0)
        self.b = self.b_anchor

    def _refit(self) -> None:
        """Weighted least squares over what varied: a coefficient whose regressor stayed
        constant (every step drafted, or none; no prompt tokens; as many drafting requests
        in every step that drafted) keeps its value, and a d or e solved below its floor is
        held at the floor while the others are solved again."""
        xx = self._xx
        w = xx[0][0]
        mean = [xx[0][i] / w for i in range(5)]
        var = [xx[i][i] / w - mean[i] ** 2 for i in range(5)]
        free = [0]
        if var[1] > 1e-6 * max(mean[1] ** 2, 1.0):
            free.append(1)
        if 0.01 < mean[2] < 0.99 and var[2] > 1e-4:
            free.append(2)
        if var[3] > 1e-6 * max(mean[3] ** 2, 1.0):
            free.append(3)
        # n is 0 on every plain step: what tells e from d is n's spread over drafting steps.
        drafted = xx[2][2]
        if drafted > 0 and xx[4][4] / drafted - (xx[2][4] / drafted) ** 2 > 0.05:
            free.append(4)
        current = {1: self.b, 2: max(self.d, self.d_min), 3: self.p, 4: max(self.e, self.e_min)}
        floors = {2: self.d_min, 4: self.e_min}
        values = self._solve_for(free, current)
        for _ in floors:
            low = [j for j in floors if j in free and values is not None and values[j] < floors[j]]
            if not low:
                break
            for j in low:
                current[j] = floors[j]
            free = [j for j in free if j not in low]
            values = self._solve_for(free, current)
        if values is not None and values[0] > 0 and values[1] > 0:
            self.a, self.b = values[0], values[1]
            self.d, self.p = max(values[2], self.d_min), max(values[3], 0.0)
            self.e = max(values[4], self.e_min)

    def _solve_for(self, free: list[int], current: dict[int, float]) -> dict[int, float] | None:
        """The coefficients `free` by least squares, the others held at `current`."""
        xx, xt = self._xx, self._xt
        fixed = {j: v for j, v in current.items() if j not in free}
        m = [[xx[i][j] for j in free] for i in free]
        v = [xt[i] - sum(xx[i][j] * c for j, c in fixed.items()) for i in free]
        if 1 in free and self.anchor_weight > 0:  # the ridge toward b measured at start
            i = free.index(1)
            m[i][i] += self.anchor_weight
            v[i] += self.anchor_weight * self.b_anchor
        solved = _solve(m, v)
        if solved is None:
            return None
        return {**current, **dict(zip(free, solved, strict=True))}


_rows_of = itemgetter(0)

# A gap longer than this between one step's end and the next step's start is idle time
# (no work queued), not the cost of the step before it.
IDLE_GAP_S = 0.05


@dataclass
class StepRecord:
    """One engine step as the cost model learns from it."""

    start: float
    rows: int  # decode rows: one per request plus its draft slots
    drafting: int  # requests that carried draft slots
    prompt_tokens: int = 0  # rows of prefill chunks
    masks: int = 0  # MASK slots among the rows
    sampled: float | None = None  # when its sampling ended
    plan: tuple | None = None  # the policy's `planned` for this step (for its self-check)
    tokens: int | None = None  # tokens it emitted


def observe_step(cost: StepCost, step: StepRecord | None, now: float) -> float | None:
    """Feed `cost` one finished step, timed to `now` (the next step's start) unless the engine
    idled in between; a step that never sampled teaches nothing. Returns the step's time."""
    if step is None or step.sampled is None:
        return None
    end = now if now - step.sampled <= IDLE_GAP_S else step.sampled
    cost.observe(step.rows, step.drafting, end - step.start, step.prompt_tokens, step.masks)
    return end - step.start


def least_squares(points: list[tuple[int, float]]) -> tuple[float, float, float] | None:
    """(a, b) of t = a + b R, and the points' spread of rows sum (R - mean R)^2."""
    n = len(points)
    mean_r = sum(r for r, _ in points) / n
    mean_t = sum(t for _, t in points) / n
    var_r = sum((r - mean_r) ** 2 for r, _ in points)
    if var_r <= 0:
        return None
    b = sum((r - mean_r) * (t - mean_t) for r, t in points) / var_r
    return mean_t - b * mean_r, b, var_r


def solve_floors(
    one: dict[int, float], many: int = 1, at_many: float = 0.0
) -> tuple[float, float, float]:
    """(d, e, m), each >= 0, from the floors of one request at each stride (k -> seconds,
    d + e + m k) and of `many` requests at the smallest stride (d + e many + m k many)."""
    fit = least_squares(list(one.items()))
    m = max(fit[1], 0.0) if fit is not None else 0.0
    k = min(one)
    fixed = max(one[k] - m * k, 0.0)  # d + e
    if many < 2:
        return fixed, 0.0, m
    per_request = max((at_many - m * k * many - fixed) / (many - 1), 0.0)
    return max(fixed - per_request, 0.0), per_request, m


def _solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting (None when singular)."""
    n = len(v)
    a = [row[:] + [v[i]] for i, row in enumerate(m)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12 * max(abs(a[col][col]), 1e-300):
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col], strict=True)]
    return [a[i][n] / a[i][i] for i in range(n)]
