"""Prometheus spec-decode counters sized for ISD's real drafts (2K - 1 positions: a lookup's
continuation may run past K), not its 2K slots, and ISD's own counters: verified drafts per
source (`vllm:idlm_{lookup,mask}_{draft,accepted}_tokens`) and drafts per position
(`vllm:idlm_draft_tokens_per_pos`, the denominator of vLLM's accepted-per-position counters)."""

from __future__ import annotations

import copy

from vllm_idlm.engine.args import PROPOSER_CLASS
from vllm_idlm.seam.vllm import create_metric_per_engine

# The counters of verified drafts per source, in `SourceCounts.as_list` order.
SOURCE_COUNTERS = (
    ("vllm:idlm_lookup_draft_tokens", "Lookup drafts verified (ISD)."),
    ("vllm:idlm_lookup_accepted_tokens", "Lookup drafts accepted (ISD)."),
    ("vllm:idlm_mask_draft_tokens", "MASK-row drafts verified (ISD)."),
    ("vllm:idlm_mask_accepted_tokens", "MASK-row drafts accepted (ISD)."),
)


def is_isd(speculative_config) -> bool:
    return (
        speculative_config is not None
        and speculative_config.method == "custom_class"
        and speculative_config.model == PROPOSER_CLASS
    )


def prom_init(
    original, self, speculative_config, labelnames, per_engine_labelvalues, *args, **kwargs
):
    """`SpecDecodingProm.__init__` with per-position counters for 2K - 1 drafts, and ISD's."""
    self.idlm_sources = None
    if is_isd(speculative_config):
        speculative_config = copy.copy(speculative_config)
        object.__setattr__(
            speculative_config,
            "num_speculative_tokens",
            speculative_config.num_speculative_tokens - 1,
        )
        positions = speculative_config.num_speculative_tokens
        self.idlm_num_drafts = positions
        self.idlm_sources = [
            create_metric_per_engine(
                self._counter_cls(name=name, documentation=doc, labelnames=labelnames),
                per_engine_labelvalues,
            )
            for name, doc in SOURCE_COUNTERS
        ]
        per_pos = self._counter_cls(
            name="vllm:idlm_draft_tokens_per_pos",
            documentation="Drafts verified per draft position (ISD).",
            labelnames=[*labelnames, "position"],
        )
        self.idlm_drafted = {
            idx: [per_pos.labels(*lv, str(pos)) for pos in range(positions)]
            for idx, lv in per_engine_labelvalues.items()
        }
    original(self, speculative_config, labelnames, per_engine_labelvalues, *args, **kwargs)


def prom_observe(original, self, spec_decoding_stats, engine_idx: int = 0):
    original(self, spec_decoding_stats, engine_idx)
    if self.idlm_sources is None:
        return
    drafted = spec_decoding_stats.num_draft_tokens_per_pos
    for counter, value in zip(self.idlm_drafted[engine_idx], drafted, strict=False):
        counter.inc(value)
    tail = drafted[self.idlm_num_drafts :]
    for counters, value in zip(self.idlm_sources, tail, strict=False):
        counters[engine_idx].inc(value)
