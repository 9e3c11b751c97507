"""`RunnerView`: vLLM's model runner as the plugin reads and writes it.

The proposer, the ISD sampler, the calibration and the runner patches read the runner
(`GPUModelRunner`; the CPU runner subclasses it) through this view only, so that every runner
attribute the plugin relies on is named here (and in the seam table's `GPUModelRunner`,
`InputBatch` and `CachedRequestState` fields). The plugin's own per-runner fields live on the
view, never on vLLM's object. A test may build a view over a stand-in with the same attributes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

_ATTRIBUTE = "_idlm_view"  # the one attribute the plugin sets on vLLM's runner


class RunnerView:
    def __init__(self, runner: Any) -> None:
        self._runner = runner
        # The plugin's own per-runner fields.
        self.calibrated = False  # the policy's step times measured (`engine.calibration`)
        self.calibration_s: float | None = None
        self.step: Any = None  # the step being timed (`engine.runner`)
        self.rows = [0, 0, 0, 0]  # steps, decode rows, speculative steps, drafting requests
        self.saved_generators: dict[int, tuple[torch.Generator, torch.Tensor]] | None = None

    @staticmethod
    def of(runner: Any) -> RunnerView:
        """The runner's view (made on first use, then kept with the runner)."""
        view = runner.__dict__.get(_ATTRIBUTE)
        if view is None:
            view = runner.__dict__[_ATTRIBUTE] = RunnerView(runner)
        return view

    # The batch of the step.
    @property
    def req_ids(self) -> list[str]:
        return list(self._runner.input_batch.req_ids)

    def sampling_params(self, req_id: str) -> Any:
        """The request's SamplingParams (None for a request the runner does not hold)."""
        request = self._runner.requests.get(req_id)
        return getattr(request, "sampling_params", None)

    def output_token_ids(self, req_id: str) -> list[int]:
        """The tokens the request has emitted ([] for a request the runner does not hold)."""
        request = self._runner.requests.get(req_id)
        return list(getattr(request, "output_token_ids", ()))

    def scheduled_slots(self, num_reqs: int) -> list[list[int]]:
        """The draft slots scheduled for each request of the batch (host copies)."""
        spec_token_ids = self._runner.input_batch.spec_token_ids
        return [list(spec_token_ids[i]) for i in range(num_reqs)]

    @property
    def greedy_req_ids(self) -> set[str]:
        return self._runner.input_batch.greedy_reqs

    @property
    def generators(self) -> dict[int, torch.Generator]:
        """Per-request generators by batch index (seeded requests)."""
        return self._runner.input_batch.generators

    def discarded_cpu_generators(self) -> dict[int, torch.Generator]:
        """CPU generators of the requests whose sampled token this step discards (a prompt
        chunk of chunked prefill)."""
        runner = self._runner
        discarded = runner.discard_request_mask.np[: runner.input_batch.num_reqs].nonzero()[0]
        gens = runner.input_batch.generators
        return {
            int(i): gens[int(i)]
            for i in discarded
            if int(i) in gens and gens[int(i)].device.type == "cpu"
        }

    # What vLLM built.
    @property
    def drafter(self) -> Any:
        return getattr(self._runner, "drafter", None)

    @property
    def sampler(self) -> Any:
        return self._runner.sampler

    @property
    def speculative_config(self) -> Any:
        return self._runner.speculative_config

    @property
    def device(self) -> torch.device:
        return self._runner.device

    @property
    def max_num_seqs(self) -> int:
        return self._runner.scheduler_config.max_num_seqs

    @property
    def max_num_batched_tokens(self) -> int:
        return self._runner.scheduler_config.max_num_batched_tokens

    @property
    def max_model_len(self) -> int:
        return self._runner.model_config.max_model_len

    @property
    def executed(self) -> bool:
        """Whether a forward waits for `sample_tokens` (vLLM's state between the two calls)."""
        return getattr(self._runner, "execute_model_state", None) is not None

    def take_draft_token_ids(self) -> Any:
        return self._runner.take_draft_token_ids()

    # What the plugin changes.
    def replace_rejection_sampler(self, sampler: Any) -> None:
        self._runner.rejection_sampler = sampler

    def use_native_top_k_top_p(self) -> bool:
        """Make vLLM's first-token sampler filter with its PyTorch-native top-k / top-p (the
        filter ISD's rows use) where it would use FlashInfer's (CUDA), whose top-k / top-p
        resolve ties their own way. True when it changed anything."""
        topk = getattr(self._runner.sampler, "topk_topp_sampler", None)
        if topk is not None and topk.forward == getattr(topk, "forward_cuda", None):
            topk.forward = topk.forward_native
            return True
        return False

    @contextlib.contextmanager
    def without_speculation(self) -> Iterator[None]:
        """vLLM's runner without its speculative config for the duration: `_prepare_inputs`
        reads it once, to choose between its plain and its speculative branch."""
        runner = self._runner
        spec_config, runner.speculative_config = runner.speculative_config, None
        try:
            yield
        finally:
            runner.speculative_config = spec_config

    # The calibration's dummy steps.
    @property
    def input_ids(self) -> torch.Tensor:
        """The device buffer of input ids a dummy run reads."""
        return self._runner.input_ids.gpu

    def dummy_run(self, rows: int, seq_len: int, query_len: int | None = None) -> torch.Tensor:
        """The hidden states of a dummy forward of `rows` query rows attending over `seq_len`
        tokens each: one row per request, or with `query_len`, requests of `query_len` rows
        each (eager: a graph captured for vLLM's own query length would not fit)."""
        runner = self._runner
        if query_len is None:
            hidden, _ = runner._dummy_run(rows, force_attention=True, profile_seq_lens=seq_len)
            return hidden
        from vllm_idlm.seam.vllm import CUDAGraphMode

        uniform = runner.uniform_decode_query_len
        runner.uniform_decode_query_len = query_len
        try:
            hidden, _ = runner._dummy_run(
                rows,
                cudagraph_runtime_mode=CUDAGraphMode.NONE,
                force_attention=True,
                uniform_decode=True,
                profile_seq_lens=seq_len,
            )
        finally:
            runner.uniform_decode_query_len = uniform
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._runner.model.compute_logits(hidden)
