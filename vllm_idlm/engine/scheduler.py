"""vLLM's scheduler with ISD-aware spec-decoding metrics.

MASK slots ride as draft tokens but are not drafts, and neither are the placeholder slots
(-1) vLLM pads new decodes with: both are reported to the metrics as invalid spec tokens
(the field vLLM uses for grammar-rejected drafts, read only by metrics), so
`num_draft_tokens` counts real drafts, a cold start counts as a draft round with zero
drafts, and mean acceptance length = 1 + accepted / rounds = tokens per forward.
Per-position counters cover the K real drafts.
"""

from __future__ import annotations

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.spec_decode.metrics import SpecDecodingStats

from vllm_idlm.config import ADDITIONAL_CONFIG_KEY
from vllm_idlm.slots import num_real_drafts


class IsdScheduler(Scheduler):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        options = (self.vllm_config.additional_config or {})[ADDITIONAL_CONFIG_KEY]
        self._mask_token_id = int(options["mask_token_id"])
        self._num_drafts = int(options["num_drafts"])

    def schedule(self, *args, **kwargs):
        output = super().schedule(*args, **kwargs)
        invalid = dict(output.num_invalid_spec_tokens or {})
        for req_id, slots in output.scheduled_spec_decode_tokens.items():
            # Slots after the real drafts: MASKs, placeholders (and anything vLLM
            # already counted as invalid is among them).
            num_other = len(slots) - num_real_drafts(slots, self._mask_token_id, self._num_drafts)
            if num_other:
                invalid[req_id] = num_other
        output.num_invalid_spec_tokens = invalid
        return output

    def make_spec_decoding_stats(
        self,
        spec_decoding_stats,
        num_draft_tokens,
        num_accepted_tokens,
        num_invalid_spec_tokens,
        request_id,
    ):
        if spec_decoding_stats is None and self.log_stats and num_draft_tokens:
            # Per-position counters sized for the real drafts (K), not the 2K slots.
            spec_decoding_stats = SpecDecodingStats.new(self._num_drafts)
        return super().make_spec_decoding_stats(
            spec_decoding_stats,
            num_draft_tokens,
            num_accepted_tokens,
            num_invalid_spec_tokens,
            request_id,
        )
