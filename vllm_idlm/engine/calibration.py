"""The stride policy's step times (`vllm_idlm.policy.StepTimes`), measured once as the engine
starts (after vLLM's warm-up), on dummy steps off the request path: B requests at K = k, for
B in `SIZES` (up to what the engine schedules at once) and every k the policy may choose. k = 0
is a plain step (one query row per request); k > 0 is 1 + 2k query rows per request, the last k
of them MASK slots (the gated adapter, if any, opens on them), then the ISD sampler's pass over
them. Every dummy request attends over `CONTEXT` tokens: without attention metadata a dummy
forward skips attention altogether, and priced a query row at a tenth of what real steps showed
on the demo models.
"""

from __future__ import annotations

import logging
import time

import torch

from idlm_kernels.argmax import argmax_without
from vllm_idlm.engine.proposer import IsdProposer
from vllm_idlm.policy import StepTimes
from vllm_idlm.seam.runner import RunnerView
from vllm_idlm.verifier import verify_and_draft, verify_greedy

logger = logging.getLogger("vllm_idlm")

# Tokens of context every dummy request attends over (at most max_model_len): about what the
# benchmarks' requests hold (prompts of 64-128 tokens, 64-256 generated).
CONTEXT = 256
# Batch sizes timed at start; beyond the largest the table is extended along its last segment.
SIZES = (1, 2, 4, 8, 16, 32, 64)


def _seq_len(runner: RunnerView, query_len: int) -> int:
    """Tokens of context a dummy request of `query_len` query rows attends over."""
    return min(max(CONTEXT, query_len), runner.max_model_len)


def _plain_rows(runner: RunnerView, rows: int) -> None:
    """A dummy forward of `rows` query rows, one per request (as many requests as the
    engine runs at once, the rows shared between them beyond that) over `CONTEXT` tokens
    each, with the logits and argmax of every row."""
    per_request = -(-rows // min(rows, runner.max_num_seqs))
    hidden = runner.dummy_run(rows, _seq_len(runner, per_request))
    runner.compute_logits(hidden).argmax(dim=-1).cpu()


def _speculative_rows(runner: RunnerView, k: int, mask_token_id: int, requests: int = 1) -> None:
    """A step of `requests` requests at K = k: 1 + 2k query rows each over `CONTEXT`
    tokens, whose last k are MASK slots (the gated adapter, if any, opens on them), then
    the ISD sampler's pass over them as an all-greedy batch takes it (`_sampler_pass`)."""
    rows = 1 + 2 * k
    ids = runner.input_ids
    for i in range(requests):
        ids[i * rows + rows - k : (i + 1) * rows] = mask_token_id
    try:
        hidden = runner.dummy_run(rows * requests, _seq_len(runner, rows), query_len=rows)
    finally:
        ids[: rows * requests] = 0
    _sampler_pass(runner.compute_logits(hidden), k, requests, mask_token_id)


def _sampler_pass(logits: torch.Tensor, k: int, requests: int, mask_token_id: int) -> None:
    """What the ISD sampler does with an all-greedy step of `requests` requests at K = k
    (k drafts and k MASK slots each): on CPU, one argmax and the host pass
    (`IsdRejectionSampler._verify_greedy`), elsewhere the verify-and-draft pass and its one
    sync: the cheapest path's cost, which the real steps' times correct (`StepTimes`)."""
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


def measure(
    runner: RunnerView, choices: tuple[int, ...], mask_token_id: int, repeats: int = 5
) -> StepTimes:
    """Time a step of B requests at K = k for every B in `SIZES` the engine can schedule and
    every k in `choices`, the least of `repeats` rounds (each round times every cell once, the
    largest batches first: a small forward timed right after a large one ran slow, its caches
    evicted), made monotone (`monotone`)."""
    limit = min(runner.max_num_batched_tokens, runner.max_num_seqs * runner.max_model_len)
    widest = 1 + 2 * max(choices)
    sizes = [b for b in SIZES if b <= runner.max_num_seqs and b * widest <= limit] or [1]
    best = {(b, k): float("inf") for b in sizes for k in choices}
    for _ in range(repeats):
        for b in reversed(sizes):
            for k in choices:
                start = time.perf_counter()
                if k:
                    _speculative_rows(runner, k, mask_token_id, b)
                else:
                    _plain_rows(runner, b)
                best[b, k] = min(best[b, k], time.perf_counter() - start)
    table = monotone([[best[b, k] for k in choices] for b in sizes])
    return StepTimes(tuple(choices), sizes, table)


def monotone(table: list[list[float]]) -> list[list[float]]:
    """No cell above one with more requests or a larger K (more rows): load on the machine
    only ever adds time, so a cell measured above a larger one is a slow measurement, and the
    larger one's time is the better bound on it (a least over the cells beyond, per column and
    then per row). Seen on a busy machine: one request plain 10.6 ms, two requests 1.9 ms."""
    out = [list(row) for row in table]
    for j in range(len(out[0]) if out else 0):
        for i in range(len(out) - 2, -1, -1):
            out[i][j] = min(out[i][j], out[i + 1][j])
    for row in out:
        for j in range(len(row) - 2, -1, -1):
            row[j] = min(row[j], row[j + 1])
    return out


def policy_of(runner: RunnerView):
    """The stride policy of an ISD runner (None without ISD)."""
    drafter = runner.drafter
    return drafter.state.policy if isinstance(drafter, IsdProposer) else None


def calibrate_once(runner: RunnerView) -> bool:
    """Measure the step times of an ISD runner whose policy is not pinned, once; True when it
    did. The random state is left as it was (vLLM seeds it after its warm-up)."""
    policy = policy_of(runner)
    if policy is None or policy.times.pinned or runner.calibrated:
        return False
    runner.calibrated = True
    began = time.perf_counter()
    with torch.inference_mode(), torch.random.fork_rng():
        policy.times = measure(runner, policy.choices, runner.drafter.options.mask_token_id)
    runner.calibration_s = time.perf_counter() - began
    logger.info(
        "idlm: step times (ms) at batch sizes %s, K %s: %s (measured in %.1f s)",
        policy.times.sizes,
        list(policy.choices),
        [[round(t * 1e3, 2) for t in row] for row in policy.times.table],
        runner.calibration_s,
    )
    return True


def after_warm_up(original, self, *args, **kwargs):
    """vLLM's worker warm-up (the KV cache is allocated and the model compiled), then the
    step times, so that no request pays for them. An engine whose warm-up never runs is
    calibrated before its first step instead (`engine.runner.execute_model`)."""
    out = original(self, *args, **kwargs)
    calibrate_once(RunnerView.of(self.model_runner))
    return out
