"""Lossless mode: base checkpoint + gated adapter through vLLM reproduces the base model."""

from __future__ import annotations

import json

import pytest
import torch
from vllm import SamplingParams

from vllm_idlm.metrics import read_isd_metrics

GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


def spec_with(adapter, k=3):
    """The gated adapter at a fixed K (what these tests count drafts and acceptance of)."""
    return {"draft_lora": str(adapter), "adaptive": False}, k


@pytest.fixture(scope="module")
def plain_base(demo_models, heldout_prompts, llm_factory, generate):
    with llm_factory(demo_models["base"], max_num_seqs=64) as llm:
        return generate(llm, heldout_prompts, GREEDY)


@pytest.fixture(scope="module")
def lossless_run(demo_models, heldout_prompts, llm_factory, generate):
    """The default config: the adaptive policy on, with the step cost this machine measures."""
    extra = {"draft_lora": str(demo_models["lora"])}
    with llm_factory(demo_models["base"], 3, spec_extra=extra, max_num_seqs=64) as llm:
        outputs = generate(llm, heldout_prompts, GREEDY)
        (state,) = llm.collective_rpc("idlm_state")
    return outputs, state


def test_greedy_lossless_isd_equals_plain_base_decoding_on_64_prompts(plain_base, lossless_run):
    outputs, state = lossless_run
    assert sum(state["ks_chosen"].values()) > 0, "the adaptive policy did not run"
    mismatches = [i for i, (a, b) in enumerate(zip(plain_base, outputs, strict=True)) if a != b]
    assert not mismatches, f"{len(mismatches)}/64 differ: {mismatches[:5]}"


def test_the_adapter_is_what_makes_the_drafts(
    demo_models, heldout_prompts, llm_factory, generate, tmp_path
):
    """Same run with the adapter's B zeroed (gate open, delta zero): acceptance drops,
    so the gate really opens on MASK rows and the adapter drafts."""
    import shutil

    from safetensors.torch import load_file, save_file

    zero = tmp_path / "zero_lora"
    shutil.copytree(demo_models["lora"], zero)
    tensors = load_file(str(zero / "adapter_model.safetensors"))
    tensors = {k: torch.zeros_like(v) if "lora_B" in k else v for k, v in tensors.items()}
    save_file(tensors, str(zero / "adapter_model.safetensors"))
    tpf = {}
    for name, adapter in (("trained", demo_models["lora"]), ("zero", zero)):
        extra, k = spec_with(adapter)
        with llm_factory(demo_models["base"], k, spec_extra=extra, max_num_seqs=64) as llm:
            generate(llm, heldout_prompts[:16], GREEDY)
            tpf[name] = read_isd_metrics(llm.get_metrics()).tokens_per_forward
    assert tpf["trained"] > tpf["zero"] + 0.05, tpf


def test_lossless_sampling_matches_plain_base_sampling(
    demo_models, heldout_prompts, llm_factory, as_prompts, chi_square_p_value
):
    """Seeded chi-square homogeneity test on generated tokens 3-5 after one held-out
    prefix, T=1 and T=0.8 with top-k 20: 6 tests at p < 1e-4 (false alarm <= 0.06%)."""
    variants = [dict(temperature=1.0), dict(temperature=0.8, top_k=20)]
    prefix = heldout_prompts[5]
    samples = {}
    extra, k = spec_with(demo_models["lora"])
    for mode, spec in (("plain", (None, None)), ("isd", (k, extra))):
        with llm_factory(demo_models["base"], spec[0], spec_extra=spec[1], max_num_seqs=256) as llm:
            for j, kwargs in enumerate(variants):
                params = SamplingParams(max_tokens=5, ignore_eos=True, **kwargs)
                outs = llm.generate(as_prompts([prefix] * 1200), params, use_tqdm=False)
                samples[mode, j] = [list(o.outputs[0].token_ids) for o in outs]
            if mode == "isd":
                assert read_isd_metrics(llm.get_metrics()).num_accepted_tokens > 500
    for j in range(len(variants)):
        for pos in (2, 3, 4):
            p = chi_square_p_value(
                [s[pos] for s in samples["plain", j]], [s[pos] for s in samples["isd", j]]
            )
            assert p > 1e-4, f"variant {variants[j]}, token {pos + 1}: p={p:.2e}"


def test_a_batch_mixing_short_and_long_prompts(demo_models, heldout_prompts, llm_factory, generate):
    prompts = [p[:3] for p in heldout_prompts[:6]] + [
        sum(heldout_prompts[i : i + 8], []) for i in range(0, 48, 8)
    ]
    with llm_factory(demo_models["base"]) as llm:
        expected = generate(llm, prompts, GREEDY)
    extra, k = spec_with(demo_models["lora"], 2)
    with llm_factory(demo_models["base"], k, spec_extra=extra, max_num_seqs=5) as llm:
        assert generate(llm, prompts, GREEDY) == expected


def test_published_peft_adapter_layout_loads_and_is_lossless(
    demo_models, heldout_prompts, llm_factory, generate, tmp_path
):
    """A PEFT adapter saved by `peft` itself, with no idlm_gate.json: the MASK id comes
    from the base tokenizer's <|mask|> token."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(demo_models["base"], dtype=torch.float32)
    config = LoraConfig(
        r=16,
        lora_alpha=32,
        target_modules=["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj", "o_proj"],
        init_lora_weights=False,
    )
    peft_model = get_peft_model(base, config)
    peft_model.save_pretrained(tmp_path / "published")
    assert not (tmp_path / "published" / "idlm_gate.json").exists()
    prompts = heldout_prompts[:8]
    with llm_factory(demo_models["base"]) as llm:
        expected = generate(llm, prompts, GREEDY)
    extra, k = spec_with(tmp_path / "published")
    with llm_factory(demo_models["base"], k, spec_extra=extra) as llm:
        assert generate(llm, prompts, GREEDY) == expected


def test_ordinary_vllm_lora_with_draft_lora_is_refused(demo_models, llm_factory):
    extra, k = spec_with(demo_models["lora"])
    with (
        pytest.raises(ValueError, match="cannot be combined with --enable-lora"),
        llm_factory(demo_models["base"], k, spec_extra=extra, enable_lora=True),
    ):
        pass


def test_an_adapter_for_another_base_is_refused_at_startup(demo_models, llm_factory, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    bad = tmp_path / "other"
    shutil.copytree(demo_models["lora"], bad)
    tensors = load_file(str(bad / "adapter_model.safetensors"))
    key = next(k for k in tensors if "q_proj.lora_A" in k)
    tensors[key] = torch.zeros(tensors[key].shape[0], tensors[key].shape[1] + 8)
    save_file(tensors, str(bad / "adapter_model.safetensors"))
    extra, k = spec_with(bad)
    with (
        pytest.raises(ValueError, match="q_proj has lora_A"),
        llm_factory(demo_models["base"], k, spec_extra=extra),
    ):
        pass
    gate = json.loads((demo_models["lora"] / "idlm_gate.json").read_text())
    assert gate["mask_token_id"] >= 0
