"""Prometheus spec-decode counters sized for ISD's K real drafts, not its 2K slots."""

from __future__ import annotations

import copy
import functools

from vllm.v1.spec_decode.metrics import SpecDecodingProm

from vllm_idlm.engine.args import PROPOSER_CLASS


def is_isd(speculative_config) -> bool:
    return (
        speculative_config is not None
        and speculative_config.method == "custom_class"
        and speculative_config.model == PROPOSER_CLASS
    )


def install() -> None:
    original = SpecDecodingProm.__init__
    if getattr(original, "_idlm_wrapped", False):
        return

    @functools.wraps(original)
    def __init__(self, speculative_config, *args, **kwargs):
        if is_isd(speculative_config):
            speculative_config = copy.copy(speculative_config)
            object.__setattr__(
                speculative_config,
                "num_speculative_tokens",
                speculative_config.num_speculative_tokens // 2,
            )
        original(self, speculative_config, *args, **kwargs)

    __init__._idlm_wrapped = True
    SpecDecodingProm.__init__ = __init__
