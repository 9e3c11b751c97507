"""The batch's plan: the stride of every request for the most expected tokens per second.

vLLM-free. A request at stride k (k drafts verified and k MASK slots appended per warm step)
alternates warm steps (drafts available: 1 + 2k query rows) and cold ones (after a
rejection: 1 + k rows). With r_j = P(the first j drafts are accepted), S_k = r_1 + .. + r_k,
it stays warm with probability r_k, so per forward (ADAPTIVE.md):

    tokens(k) = (2 + S_k - r_k) / (2 - r_k)
    rows(k)   = (2k + 1 + (1 - r_k)(k + 1)) / (2 - r_k)

and k = 0 is plain decoding: one row, one token. A step costs c(R, n, M) (`StepCost`: a + b R,
+ d + e n + m M when n > 0 requests carry draft slots), R the decode rows of the batch and M
its MASK slots, k per request at stride k. The planner maximises G = sum_i tokens_i(k_i) /
c(sum_i rows_i(k_i), n, sum_i k_i) with Dinkelbach's iteration: given G, each request
independently takes the k maximising tokens_i(k) - G (b rows_i(k) + [k > 0] e + m k); G is
recomputed until it stops moving. The all-plain batch (no speculative path, no d) is the
alternative it must beat, by a margin: `enter_margin` for a batch whose last plan was plain
to start drafting, `plain_margin` for one that drafts to go on.

A plan is kept between steps while the batch is the same and its inputs moved by no more
than `replan_tolerance` (`BatchPlanner.holds`): verdicts, the estimates' drift back toward
the engine-wide one and the step cost's refits move them a little on most steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from vllm_idlm.adaptive_config import AdaptiveConfig
from vllm_idlm.step_cost import StepCost


def cumulative(conditional: Sequence[float]) -> list[float]:
    """r_j = a_1 * .. * a_j."""
    out, r = [], 1.0
    for a in conditional:
        r *= a
        out.append(r)
    return out


def _per_forward(k: int, r_k: float, s_k: float) -> tuple[float, float]:
    """(tokens, rows) per forward at stride k > 0, from r_k and S_k (the module's formulas)."""
    return (2.0 + s_k - r_k) / (2.0 - r_k), (2 * k + 1 + (1.0 - r_k) * (k + 1)) / (2.0 - r_k)


def tokens_per_forward(rates: Sequence[float], k: int) -> float:
    return _per_forward(k, rates[k - 1], sum(rates[:k]))[0] if k else 1.0


def rows_per_forward(rates: Sequence[float], k: int) -> float:
    return _per_forward(k, rates[k - 1], sum(rates[:k]))[1] if k else 1.0


def forward_tables(rates: np.ndarray, choices: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """`tokens_per_forward` and `rows_per_forward` of every request (rows of `rates`, r_j per
    position) at every choice of k, as [requests, choices] arrays: the whole batch at once."""
    n = len(rates)
    tokens, rows = np.ones((n, len(choices))), np.ones((n, len(choices)))
    if n:
        prefix = np.cumsum(rates, axis=1)  # S_k
        for i, k in enumerate(choices):
            if k:
                r = rates[:, k - 1]
                tokens[:, i] = (2.0 + prefix[:, k - 1] - r) / (2.0 - r)
                rows[:, i] = (2 * k + 1 + (1.0 - r) * (k + 1)) / (2.0 - r)
    return tokens, rows


def forward_lists(
    rates: Sequence[Sequence[float]], choices: Sequence[int]
) -> tuple[list[list[float]], list[list[float]]]:
    """`forward_tables` on lists, for small batches (`SMALL_BATCH`): `tokens_per_forward` and
    `rows_per_forward` of each choice, the prefix sums S_k made once per request."""
    tokens, rows = [], []
    for r in rates:
        prefix, total = [], 0.0
        for x in r:
            total += x
            prefix.append(total)  # S_k, summed as `tokens_per_forward` sums it
        pairs = [_per_forward(k, r[k - 1], prefix[k - 1]) if k else (1.0, 1.0) for k in choices]
        tokens.append([t for t, _ in pairs])
        rows.append([q for _, q in pairs])
    return tokens, rows


# Batches of up to this many requests are planned on Python lists, larger ones with numpy:
# on a handful of numbers numpy's cost per call is most of the work. A plan is made anew on
# most steps of a small batch (each verdict moves an estimate by more than
# `replan_tolerance`), and with numpy the policy took 73-80 us a step at 1-4 drafting
# requests, on lists 30-48 (`benchmarks/policy_time.py`, RESULTS.md, thirtieth session).
SMALL_BATCH = 8


class Plan(NamedTuple):
    """The batch's best strides (`BatchPlanner.best`) and what they were made from."""

    req_ids: tuple[str, ...]
    strides: list[int]
    goodput: float
    tables: tuple  # tokens and rows per request and choice (lists or arrays, `best`)
    cost: tuple[float, ...]  # (a, b, d, e, m) of the step cost
    conditional: object  # the requests' acceptance estimates: lists, or an array (`plan`)


class BatchPlanner:
    """The batch's plan, made anew only where an input to it moved (`plan`)."""

    def __init__(self, config: AdaptiveConfig, cost: StepCost) -> None:
        self.config = config
        self.cost = cost
        self.decision: Plan | None = None  # the last plan
        self.estimates_moved = False  # some estimate changed since the plan was made
        self.drafts = False  # the last plan (`best`) drafted
        self.row_cost = cost.b  # b, or the bent cost of a row at the last plan (`best`)

    def plan(self, req_ids: tuple[str, ...], estimates) -> Plan:
        """The plan for `req_ids`: the last one while it still holds (`holds`), else made
        anew. `estimates()` gives the requests' conditional acceptance, a list per request:
        it is read only where the plan may have to be checked against it. Batches of up to
        `SMALL_BATCH` requests are planned on the lists, larger ones on arrays."""
        cost = self.cost
        coefficients = (cost.a, cost.b, cost.d, cost.e, cost.m)
        small = len(req_ids) <= SMALL_BATCH

        def read():  # a copy: the plan keeps what it was made from
            conditional = estimates()
            if small:
                return [list(c) for c in conditional]
            return np.array(conditional, dtype=float).reshape(len(req_ids), -1)

        plan, conditional = self.decision, None
        if plan is not None and plan.req_ids == req_ids:
            if self.estimates_moved:
                conditional = read()
            if self.holds(plan, coefficients, conditional):
                return plan
        if conditional is None:
            conditional = read()
        if small:
            tokens, rows = forward_lists([cumulative(c) for c in conditional], self.config.choices)
        else:
            tokens, rows = forward_tables(np.cumprod(conditional, axis=1), self.config.choices)
        strides, goodput = self.best(tokens, rows)
        self.estimates_moved = False
        self.decision = Plan(req_ids, strides, goodput, (tokens, rows), coefficients, conditional)
        return self.decision

    def holds(self, plan: Plan, coefficients: tuple[float, ...], conditional) -> bool:
        """Whether `plan` still stands: no acceptance estimate moved by more than
        `replan_tolerance` since it was made (`conditional`: the estimates now, lists or an
        array as `plan` read them, None where none changed), nor the predicted time of any
        step of the batch by more than that fraction. A step of n requests has at most
        n (2K + 1) rows, n drafting requests and n K MASK slots, so the coefficients' changes
        bound how far any plan's time moved."""
        tolerance = self.config.replan_tolerance
        if isinstance(conditional, np.ndarray):
            if float(np.max(np.abs(conditional - plan.conditional))) > tolerance:
                return False
        elif conditional is not None:
            for now, then in zip(conditional, plan.conditional, strict=True):
                for x, y in zip(now, then, strict=True):
                    if abs(x - y) > tolerance:
                        return False
        if coefficients == plan.cost:
            return True
        n, k = len(plan.req_ids), self.config.max_drafts
        da, db, dd, de, dm = (abs(x - y) for x, y in zip(coefficients, plan.cost, strict=True))
        shift = da + db * n * (2 * k + 1) + dd + de * n + dm * n * k
        return shift <= tolerance * self.cost(n, 0)

    def best_strides(self, rates: Sequence[Sequence[float]]) -> tuple[list[int], float]:
        """Dinkelbach's iteration for the strides of most expected tokens per second of the
        batch (r_j per request); the all-plain batch as the alternative."""
        if not len(rates):
            return [], 0.0
        table = np.asarray(rates, dtype=float).reshape(len(rates), -1)
        return self.best(*forward_tables(table, self.config.choices))

    def net(self, tokens, rows, goodput: float, i: int, k: int, row_cost: float) -> float:
        """What stride k nets request i at the batch's goodput G (`tokens` and `rows` per
        request and choice, lists or arrays as the plan holds them): tokens(k) - G (b rows(k)
        + [k > 0] e + m k), e being what each drafting request adds to the step beyond its
        rows and m what each of its k MASK slots adds; `row_cost` in place of b. One request
        and one choice: a request weighing a switch needs two of them, not the whole table."""
        j = self.config.choices.index(k)
        extra = self.cost.e + self.cost.m * float(k) if k else 0.0
        return float(tokens[i][j]) - goodput * (row_cost * float(rows[i][j]) + extra)

    def per_request(self) -> np.ndarray:
        """[k > 0] e + m k for each choice of k."""
        per_request = self.cost.e + self.cost.m * np.asarray(self.config.choices, dtype=float)
        per_request[0] = 0.0
        return per_request

    def best(self, tokens, rows) -> tuple[list[int], float]:
        """`best_strides` over per-request tokens and rows per choice ([requests, choices]:
        lists of up to `SMALL_BATCH` requests, arrays beyond)."""
        if not len(tokens):
            return [], 0.0
        if len(tokens) <= SMALL_BATCH:
            tokens = tokens.tolist() if isinstance(tokens, np.ndarray) else tokens
            rows = rows.tolist() if isinstance(rows, np.ndarray) else rows
            picks, goodput, token_sums, row_sums = self._iterate_lists(tokens, rows)
        else:
            picks, goodput, token_sums, row_sums = self._iterate_arrays(
                np.asarray(tokens, dtype=float), np.asarray(rows, dtype=float)
            )
        return self._settle(len(tokens), picks, goodput, token_sums, row_sums, rows)

    def _iterate_arrays(self, tokens: np.ndarray, rows: np.ndarray):
        """Dinkelbach's iteration on arrays: the picks (indices into the choices), their
        goodput, and the tables' column sums."""
        choices, cost = self.config.choices, self.cost
        at = np.arange(len(tokens))
        strides = np.asarray(choices)

        def value(picks: np.ndarray) -> float:
            drafting = int(np.count_nonzero(picks))
            return float(tokens[at, picks].sum()) / cost(
                float(rows[at, picks].sum()), drafting, float(strides[picks].sum())
            )

        picks = np.full(len(tokens), len(choices) - 1)
        goodput = value(picks)
        priced = cost.b * rows + self.per_request()  # what the net weighs at G
        for _ in range(16):
            picks = np.argmax(tokens - goodput * priced, axis=1)
            new = value(picks)
            if abs(new - goodput) <= 1e-9 * goodput:
                break
            goodput = new
        return picks.tolist(), goodput, tokens.sum(axis=0).tolist(), rows.sum(axis=0).tolist()

    def _iterate_lists(self, tokens: list[list[float]], rows: list[list[float]]):
        """`_iterate_arrays` on lists (the same steps, ties to the first choice as argmax)."""
        choices, cost = self.config.choices, self.cost
        per_request = self.per_request().tolist()
        width = range(len(choices))

        def value(picks: list[int]) -> float:
            drafting, picked_tokens, picked_rows, masks = 0, 0, 0, 0
            for t, r, p in zip(tokens, rows, picks, strict=True):
                if p:
                    drafting += 1
                    masks += choices[p]
                picked_tokens += t[p]
                picked_rows += r[p]
            return picked_tokens / cost(picked_rows, drafting, float(masks))

        picks = [len(choices) - 1] * len(tokens)
        goodput = value(picks)
        priced = [[cost.b * x + per_request[j] for j, x in enumerate(r)] for r in rows]
        for _ in range(16):
            picks = []
            for t, q in zip(tokens, priced, strict=True):
                nets = [t[j] - goodput * q[j] for j in width]
                picks.append(nets.index(max(nets)))
            new = value(picks)
            if abs(new - goodput) <= 1e-9 * goodput:
                break
            goodput = new
        token_sums = [sum(col) for col in zip(*tokens, strict=True)]
        return picks, goodput, token_sums, [sum(col) for col in zip(*rows, strict=True)]

    def _settle(self, n: int, picks: list[int], goodput: float, token_sums, row_sums, rows):
        """The iteration's plan against one stride for all and against plain decoding."""
        choices, cost = self.config.choices, self.cost
        # The iteration prices rows on the line (b per row); the step cost also bends away
        # from it at small batches (`StepCost.bend`), which only whole plans show: one stride
        # for every request is weighed too.
        for j in range(1, len(choices)):
            uniform = token_sums[j] / cost(row_sums[j], n, float(choices[j] * n))
            if uniform > goodput:
                picks, goodput = [j] * n, uniform
        # What a row costs between the all-plain batch and this plan, bend included (>= 0):
        # the price a request's switch of stride is weighed at (`StridePolicy.choose`).
        plain_rows = float(n)
        plan_rows = float(sum(r[p] for r, p in zip(rows, picks, strict=True)))
        self.row_cost = cost.b
        if plan_rows > plain_rows:
            extra = cost(plan_rows, 0) - cost(plain_rows, 0)
            self.row_cost = max(extra / (plan_rows - plain_rows), 0.0)
        # Drafting must win by a margin: where the model sees a few percent in it, what it
        # does not price (a batch whose requests finish apart and prefill their successors
        # one step at a time, cold first steps, the verify path's own jitter) has turned the
        # few percent into a loss (the demo models at concurrency 8: 3% expected, 8% lost).
        # A batch that decodes plainly needs more to start (`enter_margin`): at concurrency
        # 16 joint probes nudged plans 5-6% over plain, the whole batch drafted, the cost fit
        # raised d, and it went back within 15 steps, paying the switches both ways.
        plain = n / cost(n, 0)
        margin = self.config.plain_margin if self.drafts else self.config.enter_margin
        self.drafts = plain * (1.0 + margin) < goodput
        if not self.drafts:
            return [0] * n, plain
        return [choices[i] for i in picks], goodput
