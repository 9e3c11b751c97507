"""The real pretrained model through vLLM: SmolLM2-135M-Instruct (Llama), imported here.

Lossless ISD (the unmodified base plus a gated adapter, published PEFT layout) emits exactly
the base model's greedy answers on chat prompts; an I-DLM converted from it by
`idlm-train convert` loads in vLLM as an I-DLM and decodes exactly its own greedy output.
Adapters and conversions here are untrained (random, non-zero): exactness cannot depend on
how good the drafts are.
"""

from __future__ import annotations

import json

import pytest
import torch
from vllm import SamplingParams

from vllm_idlm.metrics import read_isd_metrics

CHATS = [
    "What is the capital of France?",
    "How do I reverse a list in Python?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "Give me three tips for writing readable code.",
    "What does the `zip` function do in Python?",
    "Translate 'good morning' into Spanish and German.",
    "Why is the sky blue?",
    "Write a Python function that checks whether a number is prime.",
    "What is the difference between a list and a tuple?",
    "Summarize the plot of Romeo and Juliet in one sentence.",
    "How many minutes are there in a day? Show the calculation.",
    "Name three planets of the solar system.",
    "What is recursion? Give a short example.",
    "Suggest a name for a pet turtle.",
    "How do I open a file and read its lines in Python?",
]
GREEDY = SamplingParams(temperature=0, max_tokens=40)
REAL = dict(max_model_len=1024, max_num_seqs=16)


@pytest.fixture(scope="module")
def chat_prompts(smollm2_base):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_base)
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": c}], add_generation_prompt=True, tokenize=False
        )
        for c in CHATS
    ]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


@pytest.fixture(scope="module")
def plain_answers(smollm2_base, chat_prompts, llm_factory, generate):
    with llm_factory(smollm2_base, **REAL) as llm:
        return generate(llm, chat_prompts, GREEDY)


@pytest.fixture(scope="module")
def random_adapter(smollm2_base, tmp_path_factory):
    """A PEFT LoRA with non-zero random A and B on all seven projections, saved by `peft`
    itself (no idlm_gate.json: the MASK id comes from the base tokenizer's <|mask|>)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(smollm2_base, dtype=torch.float32)
    modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    config = LoraConfig(r=8, lora_alpha=16, target_modules=modules, init_lora_weights=False)
    out = tmp_path_factory.mktemp("adapter") / "random_lora"
    get_peft_model(base, config).save_pretrained(out)
    assert not (out / "idlm_gate.json").exists()
    return out


def test_the_real_models_answers_are_text_a_person_can_read(plain_answers, smollm2_base):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_base)
    answer = tokenizer.decode(plain_answers[0], skip_special_tokens=True)
    assert "Paris" in answer


def test_lossless_isd_on_the_real_model_equals_plain_base_decoding(
    smollm2_base, chat_prompts, plain_answers, random_adapter, llm_factory, generate
):
    spec = {"draft_lora": str(random_adapter)}
    with llm_factory(smollm2_base, 3, spec_extra=spec, **REAL) as llm:
        answers = generate(llm, chat_prompts, GREEDY)
        metrics = read_isd_metrics(llm.get_metrics())
    assert len(chat_prompts) >= 16
    mismatches = [i for i, (a, b) in enumerate(zip(plain_answers, answers, strict=True)) if a != b]
    assert not mismatches, f"{len(mismatches)}/16 chat answers differ: {mismatches}"
    assert metrics.num_rounds > 0  # ISD really ran


def test_a_converted_llama_idlm_loads_as_an_idlm_and_decodes_exactly(
    smollm2_base, chat_prompts, llm_factory, generate, tmp_path
):
    """`idlm-train convert` (one step) writes the I-DLM layout vLLM serves with ISD:
    `IdlmLlamaForCausalLM`, top-level `mask_token_id`, the strides it was trained for."""
    from idlm_training.cli import main

    out = tmp_path / "idlm"
    argv = ["convert", "--base", str(smollm2_base), "--out", str(out), "--recipe", "demo"]
    argv += ["--steps", "1", "--seq-len", "32", "--batch-size", "1", "--rollouts", "0"]
    assert main(argv) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["IdlmLlamaForCausalLM"]
    assert config["model_type"] == "llama" and config["mask_token_id"] == 49152
    prompts = chat_prompts[:6]
    with llm_factory(out, **REAL) as llm:
        expected = generate(llm, prompts, GREEDY)
    with llm_factory(out, 3, **REAL) as llm:
        assert generate(llm, prompts, GREEDY) == expected
