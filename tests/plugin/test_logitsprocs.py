"""vLLM's logit-bias and min-p processors under ISD, without an engine: accepted for ISD
only, loaded for ISD engines only, applied once to every row of every request."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError
from vllm.v1.sample.logits_processor.builtin import (
    LogitBiasLogitsProcessor,
    MinPLogitsProcessor,
    MinTokensLogitsProcessor,
)
from vllm.v1.sample.logits_processor.interface import BatchUpdate

from vllm_idlm.engine import logitsprocs
from vllm_idlm.engine.args import PROPOSER_CLASS
from vllm_idlm.seam import patch
from vllm_idlm.seam.table import touch_of

ISD_SPEC = SimpleNamespace(method="custom_class", model=PROPOSER_CLASS)
NGRAM_SPEC = SimpleNamespace(method="ngram", model="ngram")


def engine_config(isd: bool):
    return SimpleNamespace(
        additional_config={"idlm": {"num_drafts": 3}} if isd else None,
        speculative_config=ISD_SPEC if isd else NGRAM_SPEC,
        scheduler_config=SimpleNamespace(max_num_seqs=4),
    )


def loaded(processor, params: list[SamplingParams]):
    processor.update_state(
        BatchUpdate(len(params), [], [(i, p, None, []) for i, p in enumerate(params)], [])
    )
    return processor


@pytest.mark.parametrize("params", [{"min_p": 0.1}, {"logit_bias": {5: 2.0}}])
def test_min_p_and_logit_bias_pass_validation_under_isd_and_are_refused_under_ngram(params):
    patch.apply(touch_of("vllm.sampling_params:SamplingParams._validate_spec_decode"))
    request = SamplingParams(**params)
    request._validate_spec_decode(ISD_SPEC)
    with pytest.raises(VLLMValidationError, match="not yet supported with speculative"):
        request._validate_spec_decode(NGRAM_SPEC)


def test_an_isd_runner_loads_the_bias_and_min_p_processors_and_another_does_not():
    patch.apply(touch_of("vllm.v1.worker.gpu_model_runner:build_logitsprocs"))
    from vllm.v1.worker import gpu_model_runner

    build = gpu_model_runner.build_logitsprocs
    kinds = {
        isd: {type(p) for p in build(engine_config(isd), torch.device("cpu"), False, False).all}
        for isd in (True, False)
    }
    assert kinds[True] == {MinTokensLogitsProcessor, LogitBiasLogitsProcessor, MinPLogitsProcessor}
    assert kinds[False] == {MinTokensLogitsProcessor}  # vLLM's choice under a speculative config
    with pytest.raises(ValueError, match="Custom logits processors are not supported"):
        build(engine_config(True), torch.device("cpu"), False, False, [MinPLogitsProcessor])


def test_bias_lands_once_on_every_row_of_its_own_request():
    """Rows [r0, r0, r0, r1]: request 0 biases token 1 by +5 on its three rows, request 1
    token 2 by -100 on its one row, once (its row is repeated as a filler for j = 1, 2)."""
    bias = loaded(
        LogitBiasLogitsProcessor(None, torch.device("cpu"), False),
        [SamplingParams(logit_bias={1: 5.0}), SamplingParams(logit_bias={2: -100.0})],
    )
    rows = logitsprocs.apply_to_every_row(bias, torch.zeros(4, 3), [3, 1])
    expected = torch.tensor([[0, 5, 0], [0, 5, 0], [0, 5, 0], [0, 0, -100]], dtype=torch.float32)
    assert torch.equal(rows, expected)


def test_min_p_cuts_each_row_by_its_own_requests_threshold():
    """Probs [0.5, 0.3, 0.2] on every row: min_p 0.5 drops what is below 0.25 (token 2) on
    request 1's two rows; request 0 (min_p 0) keeps all three tokens."""
    min_p = loaded(
        MinPLogitsProcessor(engine_config(True), torch.device("cpu"), False),
        [SamplingParams(), SamplingParams(min_p=0.5)],
    )
    logits = torch.tensor([math.log(0.5), math.log(0.3), math.log(0.2)]).repeat(3, 1)
    rows = logitsprocs.apply_to_every_row(min_p, logits.clone(), [1, 2])
    assert torch.isfinite(rows[0]).all()
    assert torch.isinf(rows[1:, 2]).all() and torch.isfinite(rows[1:, :2]).all()
    assert torch.equal(rows[1:, :2], logits[1:, :2])


def test_a_batch_without_either_option_finds_no_processor_to_apply():
    procs = SimpleNamespace(
        all=[
            loaded(LogitBiasLogitsProcessor(None, torch.device("cpu"), False), [SamplingParams()]),
            loaded(MinPLogitsProcessor(engine_config(True), "cpu", False), [SamplingParams()]),
        ]
    )
    assert logitsprocs.row_processors(SimpleNamespace(logitsprocs=procs)) == (None, None)
