"""Hooks on vLLM's model runner: install the ISD sampler next to the ISD proposer, and
free per-request ISD state as soon as vLLM drops a request's drafts."""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass

from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from vllm_idlm.engine.calibration import calibrate_once, policy_of
from vllm_idlm.engine.proposer import IsdProposer
from vllm_idlm.engine.sampler import IsdRejectionSampler
from vllm_idlm.engine.scheduler import DRAFTS_ATTR, SOURCES_ATTR

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


# A gap longer than this between one step's end and the next step's start is idle time (no
# work queued), not the cost of the step before it.
IDLE_GAP_S = 0.05


@dataclass
class _Step:
    """One engine step as the policy's step times learn from it."""

    start: float
    batch: int  # requests in the step
    stride: int  # the policy's stride for it
    timed: bool  # a decode step (no prompt tokens) at the stride held, not a probe
    sampled: float | None = None  # when its sampling ended


def _install_step_timing() -> None:
    """Time every step for the policy's step times: from one step's start (execute_model) to
    the next one's, so that what the engine does between forwards for the step (scheduling the
    draft slots, applying verdicts, shipping outputs) counts too; a step followed by an idle
    gap is timed to the end of its sampling only. Counted are the decode steps whose slots are
    what the stride held gives, at most 2k per request: not a probe, not the step that verifies
    a probe's drafts or the drafts in hand after the stride fell (on the demo models at
    concurrency 16, such steps counted as plain ones priced a plain step at 4.9 ms where plain
    decoding took 3.6, and the policy drafted at 0.81x plain), and not a step that carries
    prompt tokens: each request is prefilled once whatever the stride, so that cost per token
    is the same for every stride and does not rank them."""
    original_execute = GPUModelRunner.execute_model
    original_sample = GPUModelRunner.sample_tokens

    @functools.wraps(original_execute)
    def execute_model(self, scheduler_output, *args, **kwargs):
        total = scheduler_output.total_num_scheduled_tokens
        if total and _is_isd(self):
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
            policy = policy_of(self)
            if policy.fixed is None:
                now = time.perf_counter()
                step = getattr(self, "_idlm_step", None)
                if step is not None and step.timed and step.sampled is not None:
                    end = now if now - step.sampled <= IDLE_GAP_S else step.sampled
                    policy.times.observe(step.batch, step.stride, end - step.start)
                if calibrate_once(self):  # its warm-up was skipped: before the first step
                    now = time.perf_counter()
                widest = max(map(len, slots.values()), default=0)
                timed = rows == total and not policy.probing and widest <= 2 * policy.stride
                self._idlm_step = _Step(now, requests, policy.stride, timed)
        return original_execute(self, scheduler_output, *args, **kwargs)

    @functools.wraps(original_sample)
    def sample_tokens(self, *args, **kwargs):
        executed = getattr(self, "execute_model_state", None) is not None
        output = original_sample(self, *args, **kwargs)
        step = getattr(self, "_idlm_step", None)
        if step is not None:
            step.sampled = time.perf_counter()
        if executed and isinstance(output, ModelRunnerOutput) and _is_isd(self):
            # The next step's drafts travel with this step's output (IsdScheduler applies
            # them), saving the engine a round trip to the worker to fetch them; so do the
            # step's verdicts per draft source, for the metrics.
            setattr(output, DRAFTS_ATTR, self.take_draft_token_ids())
            setattr(output, SOURCES_ATTR, self.drafter.state.step_sources.as_list())
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
        "proposed_drafts": len(state.proposed),
        "offered_drafts": len(state.offered),
        "num_steps": state.num_steps,
        "num_cold_starts": state.num_cold_starts,
        "num_unverifiable": state.num_unverifiable,
        "num_plain_steps": state.num_plain_steps,
        "sources": dict(
            zip(
                ("lookup_drafts", "lookup_accepted", "mask_drafts", "mask_accepted"),
                state.sources.as_list(),
                strict=True,
            )
        ),
    }
    steps, rows, spec, drafting = getattr(runner, "_idlm_rows", (0, 0, 0, 0))
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
            "strides": list(times.choices),
            "table_ms": [[t * 1e3 for t in row] for row in times.table],
            "pinned": times.pinned,
            "offsets_ms": {f"{b},{k}": v * 1e3 for (b, k), v in sorted(times.offsets.items())},
        }
        out["calibration_s"] = getattr(runner, "_idlm_calibration_s", None)
        out["engine_acceptance"] = list(policy.engine)
        out["observed_positions"] = list(policy.observed)
        out["strides_chosen"] = dict(sorted(policy.chosen.items()))
        out["probes"] = policy.probes
        out["switches"] = policy.switches
    return out


def install_worker_rpc() -> None:
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    if getattr(WorkerWrapperBase, "idlm_state", None) is None:
        WorkerWrapperBase.idlm_state = lambda self: idlm_state(self.worker)
