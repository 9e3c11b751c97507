"""The adaptive policy's step cost, measured once as the engine starts (after vLLM's warm-up).

Two measurements on dummy steps, off the request path:

- c(R) = a + b R: dummy forwards of R query rows, one request each, attending over
  `CONTEXT` tokens of context, each with the logits and the argmax a plain step computes for
  every row, fitted by least squares over R = 1 .. 512. The online
  fit starts from a and keeps b near this measurement (a ridge, `StepCost.anchor_b`). What
  each measured R leaves over the line is kept as it is (`StepCost.bend`): small batches
  bend away from any line.
- floors for d, the speculative path's fixed cost, and e, its cost per drafting request,
  and m, what each MASK slot adds: steps of one request at each trained stride k and of
  `MANY_REQUESTS` at the smallest (1 + 2k rows each: the last token, k drafts, k MASK
  slots, in one query over the same context) against plain steps of as many rows, d + e +
  m k and d + e n + m k n. The difference is what a dummy step can show of the speculative
  path: one request's rows in one query, the gated adapter's pass over the MASK rows
  (lossless mode) and the ISD sampler's pass against an argmax. Online timing of real steps can only raise d and e above them; m is
  held as measured. Without the floor, d is fitted from the few steps that draft, and at
  concurrency 1 every such step is also a step with more rows: d and b are nearly
  collinear there, and a fit that put d at 0 priced drafting below what it costs.
"""

from __future__ import annotations

import logging
import time

import torch
from vllm.config import CUDAGraphMode

from idlm_kernels.argmax import argmax_without
from vllm_idlm.engine.proposer import IsdProposer
from vllm_idlm.step_cost import least_squares, solve_floors
from vllm_idlm.verifier import verify_and_draft, verify_greedy

logger = logging.getLogger("vllm_idlm")


# The context every dummy step attends over (tokens per request, at most max_model_len).
# Without attention metadata a dummy forward skips attention altogether: the line through
# such steps priced a query row at 0.04 ms on the demo models, and the stride-3 step at one
# request 0.04 ms over the stride-2 step, where the engine's real steps differed by 0.3-0.6
# ms (RESULTS.md, thirtieth session). 256 is about what the benchmarks' requests hold
# (prompts of 64-128 tokens, 64-256 generated).
CONTEXT = 256


def _seq_len(runner, query_len: int) -> int:
    """Tokens of context a dummy request of `query_len` query rows attends over."""
    return min(max(CONTEXT, query_len), runner.model_config.max_model_len)


def _plain_rows(runner, rows: int) -> None:
    """A dummy forward of `rows` query rows, one per request (as many requests as the
    engine runs at once, the rows shared between them beyond that) over `CONTEXT` tokens
    each, with the logits and argmax of every row."""
    per_request = -(-rows // min(rows, runner.scheduler_config.max_num_seqs))
    hidden, _ = runner._dummy_run(
        rows, force_attention=True, profile_seq_lens=_seq_len(runner, per_request)
    )
    runner.model.compute_logits(hidden).argmax(dim=-1).cpu()


def _speculative_rows(runner, k: int, mask_token_id: int, requests: int = 1) -> None:
    """A step of `requests` requests at stride k: 1 + 2k query rows each over `CONTEXT`
    tokens, whose last k are MASK slots (the gated adapter, if any, opens on them), then
    the ISD sampler's pass over them as an all-greedy batch takes it (`_sampler_pass`)."""
    rows = 1 + 2 * k
    ids = runner.input_ids.gpu
    for i in range(requests):
        ids[i * rows + rows - k : (i + 1) * rows] = mask_token_id
    uniform = runner.uniform_decode_query_len
    runner.uniform_decode_query_len = rows  # the dummy batch's query rows per request
    try:
        # Eager: a graph captured for vLLM's own uniform query length would not fit.
        hidden, _ = runner._dummy_run(
            rows * requests,
            cudagraph_runtime_mode=CUDAGraphMode.NONE,
            force_attention=True,
            uniform_decode=True,
            profile_seq_lens=_seq_len(runner, rows),
        )
    finally:
        runner.uniform_decode_query_len = uniform
        ids[: rows * requests] = 0
    _sampler_pass(runner.model.compute_logits(hidden), k, requests, mask_token_id)


def _sampler_pass(logits: torch.Tensor, k: int, requests: int, mask_token_id: int) -> None:
    """What the ISD sampler does with an all-greedy step of `requests` requests at stride k
    (k drafts and k MASK slots each): on CPU, one argmax and the host pass
    (`IsdRejectionSampler._verify_greedy`), elsewhere the verify-and-draft pass and its one
    sync. The floors are the cheapest path's: the online fit raises d where sampled
    batches cost more."""
    if logits.device.type == "cpu":
        row_ids = argmax_without(logits, mask_token_id).tolist()
        verify_greedy(row_ids, [[0] * k] * requests, [k] * requests)
        return
    logits = logits.float()
    device = logits.device
    step = verify_and_draft(
        logits,
        torch.zeros(k * requests, dtype=torch.int64, device=device),
        None,
        [k] * requests,
        [k] * requests,
        torch.zeros(requests, dtype=torch.float32, device=device),
        None,
        None,
        None,
        mask_token_id,
        all_greedy=True,
    )
    torch.cat([step.num_accepted, step.next_draft_ids]).tolist()


def speculative_floor(
    runner, k: int, mask_token_id: int, requests: int = 1, repeats: int = 9
) -> float:
    """Seconds a step of `requests` requests at stride k costs over a plain step of as many
    rows (>= 0): the least of `repeats` of each, taken in turns so that both see the same
    machine."""
    rows = (1 + 2 * k) * requests
    plain = speculative = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        _plain_rows(runner, rows)
        plain = min(plain, time.perf_counter() - start)
        start = time.perf_counter()
        _speculative_rows(runner, k, mask_token_id, requests)
        speculative = min(speculative, time.perf_counter() - start)
    return max(speculative - plain, 0.0)


def speculative_floors(
    runner, strides: list[int], mask_token_id: int, many: int
) -> tuple[float, float, float]:
    """Floors of d and e, and m: the speculative path's cost over plain steps of as many rows
    for one request at each stride k, d + e + m k (m, what a MASK slot adds, is the slope over
    k: the gated adapter's pass grows with its rows), and for `many` requests at the smallest
    stride, d + e many + m k many; solved for d, e and m (each >= 0)."""
    one = {k: speculative_floor(runner, k, mask_token_id) for k in strides}
    if many < 2:
        return solve_floors(one)
    return solve_floors(one, many, speculative_floor(runner, strides[0], mask_token_id, many))


# The batch on which the per-request cost of drafting is measured (against one request).
MANY_REQUESTS = 8


def calibrate(
    runner, policy, sizes=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 128, 512), repeats: int = 5
) -> float:
    """Measure a, b and the floors of d and e for `policy`'s cost model; returns the seconds
    it took. Each row count is timed once per round, the least of `repeats` rounds kept: a
    burst of load on the machine then reaches one timing of every size, not every timing of
    one (neighbouring sizes are compared in the bend). Largest first: a small forward timed
    right after the 512-row one ran 0.5 ms slow on the demo models (its caches evicted),
    which the bend took for the shape of one-row steps."""
    scheduler = runner.scheduler_config
    limit = min(
        scheduler.max_num_batched_tokens,
        scheduler.max_num_seqs * runner.model_config.max_model_len,
    )
    began = time.perf_counter()
    best = dict.fromkeys(sorted({min(s, limit) for s in sizes}, reverse=True), float("inf"))
    for _ in range(repeats):
        for rows in best:
            start = time.perf_counter()
            _plain_rows(runner, rows)
            best[rows] = min(best[rows], time.perf_counter() - start)
    points = sorted(best.items())
    cost = policy.cost
    fit = least_squares(points)
    if fit is not None and fit[0] > 0 and fit[1] > 0:
        cost.a = cost.a_start = fit[0]
        cost.anchor_b(fit[1], fit[2])
        if policy.config.bend:
            cost.shape = [(r, t - (cost.a + cost.b * r)) for r, t in points]
    strides = sorted(k for k in set(policy.config.strides) if 1 + 2 * k <= limit)
    if strides:
        k = strides[0]
        many = min(MANY_REQUESTS, limit // (1 + 2 * k), runner.scheduler_config.max_num_seqs)
        mask_id = runner.drafter.options.mask_token_id
        d, e, cost.m = speculative_floors(runner, strides, mask_id, many)
        cost.floor_d(d)
        cost.floor_e(e)
    seconds = time.perf_counter() - began
    logger.info(
        "idlm: step cost %.2f ms + %.4f ms per query row, + %.2f ms + %.3f ms per drafting "
        "request (at least) + %.3f ms per MASK slot when requests draft (measured on %s rows "
        "in %.1f s)",
        cost.a * 1e3,
        cost.b * 1e3,
        cost.d * 1e3,
        cost.e * 1e3,
        cost.m * 1e3,
        [r for r, _ in points],
        seconds,
    )
    return seconds


def policy_of(runner):
    """The adaptive policy of an ISD runner (None without ISD or with a fixed K)."""
    drafter = getattr(runner, "drafter", None)
    return drafter.state.policy if isinstance(drafter, IsdProposer) else None


def calibrate_once(runner) -> bool:
    """Measure the step cost of an ISD runner whose adaptive policy is not pinned, once;
    True when it did. The random state is left as it was (vLLM seeds it after its warm-up)."""
    policy = policy_of(runner)
    if policy is None or policy.cost.pinned or getattr(runner, "_idlm_calibrated", False):
        return False
    runner._idlm_calibrated = True
    with torch.inference_mode(), torch.random.fork_rng():
        runner._idlm_calibration_s = calibrate(runner, policy)
    return True
