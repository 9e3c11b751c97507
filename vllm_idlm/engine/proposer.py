"""The ISD proposer vLLM's runner calls after each step (through `custom_class`).

It runs no model: the drafts were already made by the MASK rows of the step just
verified (see `engine.sampler`). It submits, per request, `[d_0 .. d_{K-1}, MASK x K]`
after a fully accepted step and `[MASK x K]` (a cold start) otherwise.
"""

from __future__ import annotations

from typing import Any

from vllm_idlm.config import ADDITIONAL_CONFIG_KEY, IsdOptions
from vllm_idlm.engine.state import IsdState


class IsdProposer:
    def __init__(self, vllm_config: Any) -> None:
        options = (vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
        if options is None:
            raise RuntimeError(
                "idlm: the ISD proposer was started without its options; use "
                '"method": "idlm" in the speculative config instead of naming this class'
            )
        self.options = IsdOptions.from_dict(options)
        self.state = IsdState()
        self._runner: Any = None

    def bind_runner(self, runner: Any) -> None:
        self._runner = runner

    def load_model(self, target_model: Any) -> None:
        """Nothing to load: the target model drafts for itself."""

    def _drafting_enabled(self, req_id: str) -> bool:
        request = self._runner.requests.get(req_id) if self._runner is not None else None
        params = getattr(request, "sampling_params", None)
        # Grammar validation would strip MASK slots; structured outputs decode plainly.
        return params is None or params.structured_outputs is None

    def propose(self, sampled_token_ids: list[list[int]], *args: Any, **kwargs: Any):
        k = self.options.num_drafts
        mask = [self.options.mask_token_id] * k
        cold = mask * 2 if self.options.uniform_query_len else mask
        step = self.state.take_last_step()
        req_ids = list(self._runner.input_batch.req_ids)
        if step is not None and step.req_ids != req_ids:
            step = None  # batch changed between sampling and proposing: cold starts
        proposals: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            if not sampled or not self._drafting_enabled(req_ids[i]):
                proposals.append([])
                self.state.draft_probs.pop(req_ids[i], None)
                continue
            drafts = step.drafts[i] if step is not None else None
            if drafts is None or len(drafts) < k:
                self.state.draft_probs.pop(req_ids[i], None)
                proposals.append(list(cold))
            else:
                proposals.append(drafts[:k] + mask)
        return proposals
