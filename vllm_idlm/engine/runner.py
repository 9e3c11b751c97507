"""Hooks on vLLM's model runner: install the ISD sampler next to the ISD proposer."""

from __future__ import annotations

import functools

from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from vllm_idlm.engine.proposer import IsdProposer
from vllm_idlm.engine.sampler import IsdRejectionSampler


def install() -> None:
    original_init = GPUModelRunner.__init__
    if getattr(original_init, "_idlm_wrapped", False):
        return

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        drafter = getattr(self, "drafter", None)
        if isinstance(drafter, IsdProposer):
            drafter.bind_runner(self)
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
