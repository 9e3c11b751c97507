"""Patches on vLLM's model runner (listed in `vllm_idlm.seam.table`): the ISD sampler next to
the ISD proposer, per-request ISD state freed as soon as vLLM drops a request's drafts, plain
steps where no request drafts, and every step timed for the stride policy."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from vllm_idlm.engine.calibration import calibrate_once, policy_of
from vllm_idlm.engine.proposer import IsdProposer
from vllm_idlm.engine.sampler import IsdRejectionSampler
from vllm_idlm.engine.scheduler import DRAFTS_ATTR, SOURCES_ATTR
from vllm_idlm.seam.runner import RunnerView
from vllm_idlm.seam.vllm import ModelRunnerOutput

logger = logging.getLogger("vllm_idlm")


def isd_of(view: RunnerView) -> IsdProposer | None:
    drafter = view.drafter
    return drafter if isinstance(drafter, IsdProposer) else None


def runner_init(original, self, *args, **kwargs) -> None:
    original(self, *args, **kwargs)
    view = RunnerView.of(self)
    drafter = isd_of(view)
    if drafter is None:
        return
    drafter.bind_runner(view)
    # On CUDA vLLM samples with FlashInfer when it can, whose top-k / top-p resolve ties
    # their own way; the PyTorch-native path uses the same filter function as the ISD path.
    if view.use_native_top_k_top_p():
        logger.info("idlm: vLLM's sampler uses its native top-k/top-p path (one filter)")
    view.replace_rejection_sampler(
        IsdRejectionSampler(
            view.sampler, view.speculative_config, view.device, view, drafter.options, drafter.state
        )
    )


def input_fits_in_drafter(original, self, common_attn_metadata) -> bool:
    """vLLM skips the proposer for the whole batch, and schedules zeros as every request's
    drafts, when one request is within 2K tokens of max_model_len (a limit meant for separate
    draft models). ISD's MASK rows are part of the target forward and the scheduler already
    trims slots at max_model_len."""
    if isd_of(RunnerView.of(self)) is None:
        return original(self, common_attn_metadata)
    return common_attn_metadata is not None


def update_states(original, self, scheduler_output):
    view = RunnerView.of(self)
    drafter = isd_of(view)
    if drafter is not None:
        # Finished and aborted requests are gone (their outputs kept for later lookups);
        # preempted ones lost their drafts (vLLM clears them) and so did resumed ones.
        resumed = scheduler_output.scheduled_cached_reqs.resumed_req_ids
        for req_id in scheduler_output.finished_req_ids:
            drafter.remember(view.output_token_ids(req_id))
        drafter.state.finish(scheduler_output.finished_req_ids)
        drafter.state.forget(scheduler_output.preempted_req_ids or ())
        drafter.state.forget(resumed or ())
    return original(self, scheduler_output)


def prepare_inputs(original, self, scheduler_output, *args, **kwargs):
    """A step in which no request carries a draft slot takes vLLM's plain branch of
    `_prepare_inputs` (one logits row per request, no speculative metadata), so `_sample`
    runs vLLM's own sampler: the same distribution of the next token either way (the MASK
    token's logit is -inf in both), and vLLM 0.32 otherwise builds speculative metadata on
    every step under a speculative config (index arrays, host-to-device copies, a gather).
    A seeded random request draws the same numbers from its generator on either path: on
    ISD steps where it has no draft to verify or make, the ISD sampler has vLLM's sampler
    draw its token (`IsdRejectionSampler._draw_as_vllm`)."""
    view = RunnerView.of(self)
    drafter = isd_of(view)
    if scheduler_output.scheduled_spec_decode_tokens or drafter is None:
        return original(self, scheduler_output, *args, **kwargs)
    drafter.state.num_plain_steps += 1
    with view.without_speculation():
        return original(self, scheduler_output, *args, **kwargs)


# A gap longer than this between one step's end and the next step's start is idle time (no
# work queued), not the cost of the step before it.
IDLE_GAP_S = 0.05


@dataclass
class _Step:
    """One engine step as the policy's step times learn from it."""

    start: float
    batch: int  # requests in the step
    k: int  # the policy's K for it
    timed: bool  # a decode step (no prompt tokens) at the K held, not a probe
    sampled: float | None = None  # when its sampling ended


def execute_model(original, self, scheduler_output, *args, **kwargs):
    """Time every step for the policy's step times: from one step's start (execute_model) to
    the next one's, so that what the engine does between forwards for the step (scheduling the
    draft slots, applying verdicts, shipping outputs) counts too; a step followed by an idle
    gap is timed to the end of its sampling only (`sample_tokens`). Counted are the decode
    steps whose slots are what the K held gives, at most 2k per request: not a probe, not the
    step that verifies a probe's drafts or the drafts in hand after K fell (on the demo models
    at concurrency 16, such steps counted as plain ones priced a plain step at 4.9 ms where
    plain decoding took 3.6, and the policy drafted at 0.81x plain), and not a step that
    carries prompt tokens: each request is prefilled once whatever K, so that cost per token
    is the same for every K and does not rank them."""
    total = scheduler_output.total_num_scheduled_tokens
    view = RunnerView.of(self)
    if total and isd_of(view) is not None:
        slots = scheduler_output.scheduled_spec_decode_tokens
        requests = len(scheduler_output.num_scheduled_tokens)
        # A row that samples per request and per draft slot; the rest are prompt tokens.
        rows = min(requests + sum(map(len, slots.values())), total)
        drafting = sum(1 for s in slots.values() if s)  # requests with draft slots
        counts = view.rows  # idlm_state's
        counts[0] += 1
        counts[1] += rows
        counts[2] += drafting > 0
        counts[3] += drafting
        policy = policy_of(view)
        if policy.fixed is None:
            now = time.perf_counter()
            step = view.step
            if step is not None and step.timed and step.sampled is not None:
                end = now if now - step.sampled <= IDLE_GAP_S else step.sampled
                policy.times.observe(step.batch, step.k, end - step.start)
            if calibrate_once(view):  # its warm-up was skipped: before the first step
                now = time.perf_counter()
            widest = max(map(len, slots.values()), default=0)
            timed = rows == total and not policy.probing and widest <= 2 * policy.step_k
            view.step = _Step(now, requests, policy.step_k, timed)
    return original(self, scheduler_output, *args, **kwargs)


def sample_tokens(original, self, *args, **kwargs):
    view = RunnerView.of(self)
    executed = view.executed
    output = original(self, *args, **kwargs)
    if view.step is not None:
        view.step.sampled = time.perf_counter()
    drafter = isd_of(view)
    if executed and drafter is not None and isinstance(output, ModelRunnerOutput):
        # The next step's drafts travel with this step's output (IsdScheduler applies
        # them), saving the engine a round trip to the worker to fetch them; so do the
        # step's verdicts per draft source, for the metrics.
        setattr(output, DRAFTS_ATTR, view.take_draft_token_ids())
        setattr(output, SOURCES_ATTR, drafter.state.step_sources.as_list())
    return output


def idlm_state(wrapper) -> dict | None:
    """What one worker's ISD state holds (`LLM.collective_rpc("idlm_state")`, a method added to
    vLLM's worker wrapper): per-request entries still tracked and the step counters; None on
    an engine without ISD."""
    runner = getattr(wrapper.worker, "model_runner", None)
    view = RunnerView.of(runner) if runner is not None else None
    drafter = isd_of(view) if view is not None else None
    if drafter is None:
        return None
    state = drafter.state
    out = {
        "pending_drafts": len(state.pending),
        "proposed_drafts": len(state.proposed),
        "offered_drafts": len(state.offered),
        "num_steps": state.num_steps,
        "num_cold_starts": state.num_cold_starts,
        "num_unverifiable": state.num_unverifiable,
        "num_plain_steps": state.num_plain_steps,
        # finished requests' outputs the lookups search (`engine.lookup`)
        "lookup_outputs": len(drafter.lookup.recent) if drafter.lookup is not None else 0,
        "sources": dict(
            zip(
                ("lookup_drafts", "lookup_accepted", "mask_drafts", "mask_accepted"),
                state.sources.as_list(),
                strict=True,
            )
        ),
    }
    steps, rows, spec, drafting = view.rows
    # Decode rows (one per request plus its draft slots) over all steps, the steps that took
    # the speculative path and the requests that drafted in them.
    out["decode_rows"] = {
        "steps": steps,
        "rows": rows,
        "spec_steps": spec,
        "draft_requests": drafting,
    }
    policy = state.policy
    out["tracked_requests"] = len(policy.requests)
    if policy.fixed is None:
        # What the policy believes: its step times, the engine-wide conditional acceptance
        # per position, and what it chose.
        times = policy.times
        out["step_times"] = {
            "sizes": list(times.sizes),
            "ks": list(times.choices),
            "table_ms": [[t * 1e3 for t in row] for row in times.table],
            "pinned": times.pinned,
            "offsets_ms": {f"{b},{k}": v * 1e3 for (b, k), v in sorted(times.offsets.items())},
        }
        out["calibration_s"] = view.calibration_s
        out["engine_acceptance"] = list(policy.engine)
        out["observed_positions"] = list(policy.observed)
        out["ks_chosen"] = dict(sorted(policy.chosen.items()))
        out["probes"] = policy.probes
        out["switches"] = policy.switches
    return out
