"""vLLM's scheduler with ISD-aware spec-decoding metrics.

MASK slots ride as draft tokens but are not drafts, and neither are the placeholder slots
(-1) vLLM pads new decodes with: both are reported to the metrics as invalid spec tokens
(the field vLLM uses for grammar-rejected drafts, read only by metrics), so
`num_draft_tokens` counts real drafts, a cold start counts as a draft round with zero
drafts, and mean acceptance length = 1 + accepted / rounds = tokens per forward.
Per-position counters cover the 2K - 1 positions a step's real drafts may take (a lookup's
continuation may run past K, `IsdOptions.max_drafts`).

The next step's drafts ride with the step's output (`DRAFTS_ATTR`, set by the runner hook)
and are applied as the output is received, so the engine does not ask the worker for them in
one more round trip after every step (`EngineCore.post_step`; with vLLM's multiprocess
executor, the CPU build's only one, that is an IPC round trip per step).
"""

from __future__ import annotations

from vllm_idlm.config import ADDITIONAL_CONFIG_KEY
from vllm_idlm.seam.vllm import Scheduler, SpecDecodingStats
from vllm_idlm.slots import num_real_drafts

# ModelRunnerOutput attribute carrying the step's DraftTokenIds (None: no drafts).
DRAFTS_ATTR = "idlm_draft_token_ids"
# ModelRunnerOutput attribute carrying the step's verified drafts per source
# (`vllm_idlm.engine.state.SourceCounts.as_list`); they travel on to the frontend's metrics at
# the tail of `SpecDecodingStats.num_draft_tokens_per_pos`, past its K per-position counts (the
# one list of that object nothing else reads; `vllm_idlm.engine.metrics`).
SOURCES_ATTR = "idlm_sources"


class IsdScheduler(Scheduler):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        options = (self.vllm_config.additional_config or {})[ADDITIONAL_CONFIG_KEY]
        self._mask_token_id = int(options["mask_token_id"])
        self._max_drafts = 2 * int(options["num_drafts"]) - 1  # `IsdOptions.max_drafts`
        # Whether the last output delivered its drafts (then post_step has nothing to fetch).
        self.drafts_from_output = False

    def schedule(self, *args, **kwargs):
        output = super().schedule(*args, **kwargs)
        invalid = dict(output.num_invalid_spec_tokens or {})
        for req_id, slots in output.scheduled_spec_decode_tokens.items():
            # Slots after the real drafts: MASKs, placeholders (and anything vLLM
            # already counted as invalid is among them).
            num_other = len(slots) - num_real_drafts(slots, self._mask_token_id, self._max_drafts)
            if num_other:
                invalid[req_id] = num_other
        output.num_invalid_spec_tokens = invalid
        return output

    def update_from_output(self, scheduler_output, model_runner_output):
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        # After the output, as post_step would: finished requests are gone by now.
        self.drafts_from_output = hasattr(model_runner_output, DRAFTS_ATTR)
        drafts = getattr(model_runner_output, DRAFTS_ATTR, None)
        if drafts is not None:
            self.update_draft_token_ids(drafts)
        sources = getattr(model_runner_output, SOURCES_ATTR, None)
        if sources and any(sources):
            for eco in outputs.values():
                stats = eco.scheduler_stats
                if stats is not None and stats.spec_decoding_stats is not None:
                    stats.spec_decoding_stats.num_draft_tokens_per_pos.extend(sources)
        return outputs

    def make_spec_decoding_stats(
        self,
        spec_decoding_stats,
        num_draft_tokens,
        num_accepted_tokens,
        num_invalid_spec_tokens,
        request_id,
    ):
        if spec_decoding_stats is None and self.log_stats and num_draft_tokens:
            # Per-position counters sized for the real drafts (2K - 1), not the 2K slots.
            spec_decoding_stats = SpecDecodingStats.new(self._max_drafts)
        return super().make_spec_decoding_stats(
            spec_decoding_stats,
            num_draft_tokens,
            num_accepted_tokens,
            num_invalid_spec_tokens,
            request_id,
        )


def post_step(original, self, model_executed: bool) -> None:
    """Skip the engine's draft fetch after a step whose output brought its drafts."""
    if getattr(self.scheduler, "drafts_from_output", False):
        return
    original(self, model_executed)
