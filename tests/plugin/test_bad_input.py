"""Bad configs fail at startup with a message naming the problem; a prompt containing
the MASK token is refused without disturbing other requests."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError

from vllm_idlm.config import IsdOptions


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"method": "idlm"}, "num_speculative_tokens .* is required"),
        ({"method": "idlm", "num_speculative_tokens": 0}, "must be >= 1"),
        ({"method": "idlm", "num_speculative_tokens": "3"}, "must be an integer"),
        ({"method": "idlm", "num_speculative_tokens": 2, "stride": 3}, r"unknown .*\['stride'\]"),
        (
            {"method": "idlm", "num_speculative_tokens": 2, "draft_lora": "/nonexistent"},
            "draft_lora .* is not a directory",
        ),
        ({"method": "idlm", "num_speculative_tokens": 2, "adaptive": "yes"}, "adaptive must be"),
        (
            {"method": "idlm", "num_speculative_tokens": 2, "adaptive": {"step": 1}},
            r"unknown adaptive setting.*\['step'\]",
        ),
        (
            {"method": "idlm", "num_speculative_tokens": 2, "adaptive": {"step_ms": 5}},
            "needs both step_ms and row_ms",
        ),
        (
            {"method": "idlm", "num_speculative_tokens": 2, "adaptive": {"min_dwell": 1.5}},
            "min_dwell must be a step count",
        ),
        (
            {"method": "idlm", "num_speculative_tokens": 2, "adaptive": {"margin": 1}},
            r"margin must be in \[0, 1\)",
        ),
        (
            {"method": "idlm", "num_speculative_tokens": 2, "adaptive": {"margin": -1}},
            "adaptive margin must be a number >= 0",
        ),
        (
            {"method": "idlm", "num_speculative_tokens": 2, "lookup": "yes"},
            "lookup must be true, false or an object",
        ),
        (
            {"method": "idlm", "num_speculative_tokens": 2, "lookup": {"max_ngram": 0}},
            "lookup min_ngram and max_ngram must be integers >= 1",
        ),
        (
            {"method": "idlm", "num_speculative_tokens": 2, "lookup": {"n": 3}},
            "lookup must be true, false or an object",
        ),
        (
            {
                "method": "idlm",
                "num_speculative_tokens": 2,
                "lookup": {"min_ngram": 5, "max_ngram": 3},
            },
            "lookup min_ngram 5 is larger than max_ngram 3",
        ),
        (
            {"method": "idlm", "num_speculative_tokens": 2, "lookup": {"recent": -1}},
            "lookup recent must be an integer >= 0",
        ),
        (
            {
                "method": "idlm",
                "num_speculative_tokens": 2,
                "adaptive": {"row_ms": 1, "step_ms": 5},
                "uniform_query_len": True,
            },
            "cannot be combined with uniform_query_len",
        ),
    ],
)
def test_invalid_isd_options_are_refused_with_the_key_named(spec, message):
    with pytest.raises(ValueError, match=message):
        IsdOptions.from_user(spec)


def test_a_checkpoint_without_mask_token_is_refused_at_startup(demo_models, llm_factory):
    with (
        pytest.raises(
            ValueError, match="is not an I-DLM checkpoint: its config has no mask_token_id"
        ),
        llm_factory(demo_models["base"], 2),
    ):
        pass


def test_more_drafts_than_vllm_can_schedule_is_an_error(demo_models, llm_factory):
    expected = "num_speculative_tokens=65 needs 130 draft slots"
    with pytest.raises(ValueError, match=expected), llm_factory(demo_models["idlm"], 65):
        pass


@pytest.mark.parametrize("parallel", ["tensor_parallel_size", "pipeline_parallel_size"])
def test_lossless_mode_refuses_parallel_engines_before_starting(demo_models, llm_factory, parallel):
    spec = {"draft_lora": str(demo_models["lora"])}
    with (
        pytest.raises(ValueError, match=r"draft_lora \(lossless mode\) supports tensor_par"),
        llm_factory(demo_models["base"], 2, spec, **{parallel: 2}),
    ):
        pass


def test_a_stride_the_checkpoint_was_not_trained_for_warns(demo_models, tmp_path):
    from vllm_idlm.formats.checkpoint import read_checkpoint_facts

    config = json.loads((demo_models["idlm"] / "config.json").read_text())
    facts = read_checkpoint_facts(config, "demo")
    assert facts.check_num_drafts(3) is None
    assert "trained for strides [2, 3, 4]" in facts.check_num_drafts(6)


def test_an_adapter_gives_every_stride_it_was_trained_for(demo_models):
    """idlm_gate.json records strides [2, 3, 4] (and block_size 3): every one of them, not
    only the block size's, is a K the adaptive policy may choose in lossless mode."""
    from vllm_idlm.config import IsdOptions
    from vllm_idlm.formats.adapter import read_adapter_facts

    facts = read_adapter_facts(str(demo_models["lora"]))
    assert facts.strides == (2, 3, 4)
    assert facts.check_num_drafts(1) is None
    options = IsdOptions(num_drafts=3).resolved(facts.mask_token_id, facts.strides)
    assert options.ks == (1, 2, 3)  # K = N - 1


@pytest.fixture(scope="module")
def isd_llm(demo_models, llm_factory):
    with llm_factory(demo_models["idlm"], 2) as llm:
        yield llm


def test_a_prompt_containing_the_mask_id_is_refused_and_others_still_run(
    isd_llm, demo_models, heldout_prompts, as_prompts
):
    mask = json.loads((demo_models["idlm"] / "config.json").read_text())["mask_token_id"]
    params = SamplingParams(temperature=0, max_tokens=8)
    with pytest.raises(VLLMValidationError, match=f"contains the I-DLM MASK token \\(id {mask}\\)"):
        isd_llm.generate(as_prompts([heldout_prompts[0][:5] + [mask] + [7]]), params)
    outputs = isd_llm.generate(as_prompts(heldout_prompts[:2]), params, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 8 for o in outputs)


def test_a_prompt_whose_text_tokenizes_to_mask_is_refused(isd_llm):
    params = SamplingParams(temperature=0, max_tokens=4)
    with pytest.raises(VLLMValidationError, match="MASK token"):
        isd_llm.generate(["def f(x):\n    return <|mask|> + 1"], params)
    out = isd_llm.generate(["def f(x):\n    return"], params, use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


def test_published_sdar_layout_loads_without_trust_remote_code(
    demo_models, tmp_path, llm_factory, heldout_prompts, generate
):
    """`SDARForCausalLM`, `model_type: sdar`, `block_size`, a remote-code `auto_map`."""
    ckpt = tmp_path / "sdar"
    shutil.copytree(demo_models["idlm"], ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    config.pop("idlm")
    config.update(
        architectures=["SDARForCausalLM"],
        model_type="sdar",
        block_size=3,
        auto_map={
            "AutoConfig": "configuration_sdar.SDARConfig",
            "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM",
        },
    )
    (ckpt / "config.json").write_text(json.dumps(config))
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = heldout_prompts[:4]
    with llm_factory(demo_models["idlm"]) as llm:
        expected = generate(llm, prompts, params)
    with llm_factory(ckpt, 3) as llm:
        assert generate(llm, prompts, params) == expected


def test_warning_for_untrained_stride_reaches_the_log(demo_models, llm_factory, caplog):
    caplog.set_level(logging.WARNING, logger="vllm_idlm")
    with llm_factory(demo_models["idlm"], 5):
        pass
    assert "stride N=6, but" in caplog.text
