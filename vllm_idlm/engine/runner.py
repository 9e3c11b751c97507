"""Hooks on vLLM's model runner: install the ISD sampler next to the ISD proposer, and
free per-request ISD state as soon as vLLM drops a request's drafts."""

from __future__ import annotations

import functools
import logging
import time

from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from vllm_idlm.engine.calibration import calibrate_once, policy_of
from vllm_idlm.engine.proposer import IsdProposer
from vllm_idlm.engine.sampler import IsdRejectionSampler
from vllm_idlm.engine.scheduler import DRAFTS_ATTR
from vllm_idlm.step_cost import StepRecord, observe_step

logger = logging.getLogger("vllm_idlm")


def _use_one_filter(sampler) -> None:
    """Make vLLM's first-token sampler filter with `apply_top_k_top_p`, as ISD's rows do.

    On CUDA vLLM samples with FlashInfer when it can, whose top-k / top-p resolve ties
    their own way; the PyTorch-native path uses the same filter function as the ISD path.
    """
    topk = getattr(sampler, "topk_topp_sampler", None)
    if topk is not None and topk.forward == getattr(topk, "forward_cuda", None):
        topk.forward = topk.forward_native
        logger.info("idlm: vLLM's sampler uses its native top-k/top-p path (one filter)")


def install() -> None:
    install_worker_rpc()
    original_init = GPUModelRunner.__init__
    if getattr(original_init, "_idlm_wrapped", False):
        return

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        drafter = getattr(self, "drafter", None)
        if isinstance(drafter, IsdProposer):
            drafter.bind_runner(self)
            _use_one_filter(self.sampler)
            # vLLM skips the proposer for the whole batch, and schedules zeros as every
            # request's drafts, when one request is within 2K tokens of max_model_len (a
            # limit meant for separate draft models). ISD's MASK rows are part of the
            # target forward and the scheduler already trims slots at max_model_len.
            self._input_fits_in_drafter = lambda common_attn_metadata: (
                common_attn_metadata is not None
            )
            self.rejection_sampler = IsdRejectionSampler(
                self.sampler,
                self.speculative_config,
                self.device,
                self,
                drafter.options,
                drafter.state,
            )

    __init__._idlm_wrapped = True
    GPUModelRunner.__init__ = __init__

    original_update = GPUModelRunner._update_states

    @functools.wraps(original_update)
    def _update_states(self, scheduler_output):
        drafter = getattr(self, "drafter", None)
        if isinstance(drafter, IsdProposer):
            # Finished and aborted requests are gone; preempted ones lost their drafts
            # (vLLM clears them) and so did resumed ones.
            resumed = scheduler_output.scheduled_cached_reqs.resumed_req_ids
            drafter.state.finish(scheduler_output.finished_req_ids)
            drafter.state.forget(scheduler_output.preempted_req_ids or ())
            drafter.state.forget(resumed or ())
        return original_update(self, scheduler_output)

    GPUModelRunner._update_states = _update_states
    _install_slot_free_steps()
    _install_step_timing()


def _install_slot_free_steps() -> None:
    """A step in which no request carries a draft slot takes vLLM's plain branch of
    `_prepare_inputs` (one logits row per request, no speculative metadata), so `_sample`
    runs vLLM's own sampler: the same distribution of the next token either way (the MASK
    token's logit is -inf in both), and vLLM 0.32 otherwise builds speculative metadata on
    every step under a speculative config (index arrays, host-to-device copies, a gather).
    A seeded random request draws the same numbers from its generator on either path: on
    ISD steps where it has no draft to verify or make, the ISD sampler has vLLM's sampler
    draw its token (`IsdRejectionSampler._draw_as_vllm`)."""
    original_prepare = GPUModelRunner._prepare_inputs
    if getattr(original_prepare, "_idlm_wrapped", False):
        return

    @functools.wraps(original_prepare)
    def _prepare_inputs(self, scheduler_output, *args, **kwargs):
        if scheduler_output.scheduled_spec_decode_tokens or not _is_isd(self):
            return original_prepare(self, scheduler_output, *args, **kwargs)
        self.drafter.state.num_plain_steps += 1
        # `_prepare_inputs` reads the speculative config once, to pick its branch.
        spec_config, self.speculative_config = self.speculative_config, None
        try:
            return original_prepare(self, scheduler_output, *args, **kwargs)
        finally:
            self.speculative_config = spec_config

    _prepare_inputs._idlm_wrapped = True
    GPUModelRunner._prepare_inputs = _prepare_inputs


def _is_isd(runner) -> bool:
    return isinstance(getattr(runner, "drafter", None), IsdProposer)


def _install_step_timing() -> None:
    """Time every step for the cost model: from one step's start (execute_model) to the next
    one's, so that what the engine does between forwards for the step (scheduling the draft
    slots, applying verdicts, shipping outputs) counts too; a step followed by an idle gap is
    timed to the end of its sampling only."""
    original_execute = GPUModelRunner.execute_model
    original_sample = GPUModelRunner.sample_tokens

    @functools.wraps(original_execute)
    def execute_model(self, scheduler_output, *args, **kwargs):
        total = scheduler_output.total_num_scheduled_tokens
        if total and _is_isd(self):
            policy = policy_of(self)
            slots = scheduler_output.scheduled_spec_decode_tokens
            requests = len(scheduler_output.num_scheduled_tokens)
            # A row that samples per request and per draft slot; the rest are prompt tokens.
            rows = min(requests + sum(map(len, slots.values())), total)
            drafting = sum(1 for s in slots.values() if s)  # requests with draft slots
            counts = self.__dict__.setdefault("_idlm_rows", [0, 0, 0, 0])  # idlm_state's
            counts[0] += 1
            counts[1] += rows
            counts[2] += drafting > 0
            counts[3] += drafting
            if policy is not None:
                now = time.perf_counter()
                step = getattr(self, "_idlm_step", None)
                seconds = observe_step(policy.cost, step, now)
                if seconds is not None:
                    policy.measured(step, seconds)
                if calibrate_once(self):  # its warm-up was skipped: before the first step
                    now = time.perf_counter()
                plan = policy.planned
                mask_id = self.drafter.options.mask_token_id
                masks = sum(s.count(mask_id) for s in slots.values())
                self._idlm_step = StepRecord(
                    now, rows, drafting, total - rows, masks=masks, plan=plan
                )
        return original_execute(self, scheduler_output, *args, **kwargs)

    @functools.wraps(original_sample)
    def sample_tokens(self, *args, **kwargs):
        executed = getattr(self, "execute_model_state", None) is not None
        output = original_sample(self, *args, **kwargs)
        step = getattr(self, "_idlm_step", None)
        if step is not None:
            step.sampled = time.perf_counter()
            if step.plan is not None and isinstance(output, ModelRunnerOutput):  # self_check
                step.tokens = sum(map(len, output.sampled_token_ids))
        if executed and isinstance(output, ModelRunnerOutput) and _is_isd(self):
            # The next step's drafts travel with this step's output (IsdScheduler applies
            # them), saving the engine a round trip to the worker to fetch them.
            setattr(output, DRAFTS_ATTR, self.take_draft_token_ids())
        return output

    GPUModelRunner.execute_model = execute_model
    GPUModelRunner.sample_tokens = sample_tokens


def idlm_state(worker) -> dict | None:
    """What one worker's ISD state holds (`LLM.collective_rpc("idlm_state")`): per-request
    entries still tracked and the step counters; None on an engine without ISD."""
    runner = getattr(worker, "model_runner", None)
    drafter = getattr(runner, "drafter", None)
    if not isinstance(drafter, IsdProposer):
        return None
    state = drafter.state
    out = {
        "pending_drafts": len(state.pending),
        "stored_draft_probs": len(state.draft_probs),
        "scoring_drafts": len(state.scoring),
        "num_scored": state.num_scored,
        "num_steps": state.num_steps,
        "num_cold_starts": state.num_cold_starts,
        "num_unverifiable": state.num_unverifiable,
        "num_plain_steps": state.num_plain_steps,
    }
    steps, rows, spec, drafting = getattr(runner, "_idlm_rows", (0, 0, 0, 0))
    # Decode rows (one per request plus its draft slots) over all steps, the steps that took
    # the speculative path and the requests that drafted in them: with a step cost
    # a + b rows (+ d + e drafting), what the steps cost.
    out["decode_rows"] = {
        "steps": steps,
        "rows": rows,
        "spec_steps": spec,
        "draft_requests": drafting,
    }
    policy = state.policy
    if policy is not None:
        # What the adaptive policy believes: its step cost model and the engine-wide
        # conditional acceptance per position.
        cost = policy.cost
        out["step_cost"] = {
            "a": cost.a,
            "b": cost.b,
            "d": cost.d,
            "d_floor": cost.d_min,
            "e": cost.e,
            "e_floor": cost.e_min,
            "m": cost.m,
        }
        # Where steps measured at start left the line, rows -> seconds (`StepCost.bend`).
        out["step_cost_bend"] = [list(point) for point in cost.shape]
        out["calibration_s"] = getattr(runner, "_idlm_calibration_s", None)
        out["engine_acceptance"] = list(policy.engine_conditional)
        out["observed_positions"] = list(policy.observed)
        out["strides_chosen"] = dict(sorted(policy.chosen.items()))
        out["probes"] = dict(policy.probed)
        if policy.check is not None:  # verdicts of the check against plain decoding
            out["self_check"] = {
                "steps": policy.check.steps,
                "verdicts": dict(policy.check.verdicts),
                "bands": {b: band.held for b, band in sorted(policy.check.bands.items())},
            }
    return out


def install_worker_rpc() -> None:
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    if getattr(WorkerWrapperBase, "idlm_state", None) is None:
        WorkerWrapperBase.idlm_state = lambda self: idlm_state(self.worker)
