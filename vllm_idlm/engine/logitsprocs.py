"""`min_p` and `logit_bias` under ISD: accepted, loaded, and applied to every row.

vLLM 0.32 refuses both parameters under any speculative config
(`SamplingParams._validate_spec_decode`) and does not load their processors there
(`build_logitsprocs` keeps only min-tokens): its rejection sampler would apply them to the
bonus row alone, so a request's target distribution would differ between draft positions
and the bonus. ISD forms every row of a step as a target row (`engine.sampler`), so it can
apply vLLM's own `LogitBiasLogitsProcessor` and `MinPLogitsProcessor` to every verified and
drafted row, where vLLM's sampler applies them to a plain step's one row. Other speculative
methods keep vLLM's refusal, and custom logits processors stay refused under ISD too (their
state is per request, their semantics unknown: nothing says one may be applied to several
positions of a request at once).

Exactly once per row: a step without draft slots takes vLLM's plain path
(`engine.runner.prepare_inputs`), whose sampler applies both; a step with slots goes
through the ISD sampler, whose `forward` replaces vLLM's rejection sampler (and with it
vLLM's bonus sampler, the only spec-path caller of the plain sampler's processors).
"""

from __future__ import annotations

from itertools import accumulate

import torch

from vllm_idlm.config import ADDITIONAL_CONFIG_KEY
from vllm_idlm.engine.args import PROPOSER_CLASS
from vllm_idlm.seam.vllm import (
    BUILTIN_LOGITS_PROCESSORS,
    LogitBiasLogitsProcessor,
    LogitsProcessors,
    MinPLogitsProcessor,
)


def is_isd_spec(speculative_config) -> bool:
    """Whether a (translated) speculative config is ISD's: `custom_class` with our proposer."""
    return (
        getattr(speculative_config, "method", None) == "custom_class"
        and getattr(speculative_config, "model", None) == PROPOSER_CLASS
    )


def is_isd_engine(vllm_config) -> bool:
    return bool((vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY))


def row_processors(sampling_metadata):
    """vLLM's logit-bias and min-p processors when some request of the batch uses them
    (each None otherwise). An unknown attribute counts as in use: slower, never wrong."""
    bias = min_p = None
    for processor in sampling_metadata.logitsprocs.all:
        if isinstance(processor, LogitBiasLogitsProcessor) and getattr(processor, "biases", 1):
            bias = processor
        elif isinstance(processor, MinPLogitsProcessor) and getattr(processor, "min_p_count", 1):
            min_p = processor
    return bias, min_p


def apply_to_every_row(processor, rows: torch.Tensor, num_rows: list[int]) -> torch.Tensor:
    """`processor.apply` on every row of a step in which request i owns `num_rows[i]`
    consecutive rows. vLLM's processors index the batch by request (row i is request i), so
    the j-th rows of all requests go through as one batch, j = 0, 1, ...; a request with
    fewer rows repeats its last one there, and that copy is not written back."""
    if all(n == 1 for n in num_rows):
        return processor.apply(rows)
    device = rows.device
    starts = list(accumulate(num_rows, initial=0))[:-1]
    for j in range(max(num_rows)):
        index = [s + min(j, n - 1) for s, n in zip(starts, num_rows, strict=True)]
        owners = [i for i, n in enumerate(num_rows) if j < n]
        batch = processor.apply(rows[torch.tensor(index, dtype=torch.int64, device=device)])
        if len(owners) < len(num_rows):
            batch = batch[torch.tensor(owners, dtype=torch.int64, device=device)]
            index = [index[i] for i in owners]
        rows[torch.tensor(index, dtype=torch.int64, device=device)] = batch
    return rows


def validate_spec_decode(original, self, speculative_config) -> None:
    """In every process that validates requests (the API / LLM process): accept both
    parameters under ISD."""
    if is_isd_spec(speculative_config):
        return  # 0.32 checks nothing else there: min_p and logit_bias only
    original(self, speculative_config)


def build_logitsprocs(
    original, vllm_config, device, is_pin_memory, is_pooling_model, custom_logitsprocs=()
):
    """An ISD engine's runner loads vLLM's built-in processors (min-tokens, logit-bias,
    min-p) as a plain engine does."""
    if is_pooling_model or custom_logitsprocs or not is_isd_engine(vllm_config):
        # vLLM's answer: custom processors are refused under a speculative config.
        return original(vllm_config, device, is_pin_memory, is_pooling_model, custom_logitsprocs)
    return LogitsProcessors(
        ctor(vllm_config, device, is_pin_memory) for ctor in BUILTIN_LOGITS_PROCESSORS
    )
