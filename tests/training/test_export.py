"""Export -> load round trips: I-DLM checkpoint, gated adapter (PEFT format), tokenizer."""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from idlm_training.config import LoraConfig
from idlm_training.export import load_gated_lora, save_gated_lora, save_idlm_checkpoint
from idlm_training.gated_lora import attach_gated_lora
from idlm_training.tokenizer import MASK_TOKEN
from vllm_idlm.formats.checkpoint import architecture_for


def test_idlm_checkpoint_round_trip(tmp_path, tiny_model, tiny_tokenizer, mask_id):
    out = save_idlm_checkpoint(
        tiny_model, tiny_tokenizer, tmp_path / "idlm", mask_id, (2, 3, 4), {"name": "t"}
    )
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == tiny_model.config.model_type
    # The family's vLLM class, resolved without trust_remote_code (Qwen3 / Llama I-DLMs).
    assert cfg["architectures"] == [architecture_for(cfg["model_type"])]
    assert cfg["architectures"][0] in {"IdlmForCausalLM", "IdlmLlamaForCausalLM"}
    assert cfg["mask_token_id"] == mask_id
    assert cfg["idlm"] == {
        "mask_token_id": mask_id,
        "strides": [2, 3, 4],
        "block_size": 3,
        "recipe": {"name": "t"},
        "format_version": 1,
    }
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(0, mask_id, (1, 9))
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, tiny_model(input_ids=ids).logits)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.convert_tokens_to_ids(MASK_TOKEN) == mask_id and tok.eos_token is not None
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"]
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>assistant\n")


def test_gated_lora_round_trip_and_peft_format(tmp_path, tiny_base_dir, mask_id):
    model = AutoModelForCausalLM.from_pretrained(tiny_base_dir).eval()
    adapter = attach_gated_lora(model, LoraConfig(r=4, alpha=8.0), mask_id)
    with torch.no_grad():
        for p in adapter.parameters():
            p.normal_()
    out = save_gated_lora(adapter, tmp_path / "lora", str(tiny_base_dir), (2, 3, 4), {"name": "t"})
    gate = json.loads((out / "idlm_gate.json").read_text())
    assert (
        gate["gate"] == "mask_rows"
        and gate["mask_token_id"] == mask_id
        and gate["mask_embedding"] == "idlm_mask_embedding.safetensors"
    )
    fresh = AutoModelForCausalLM.from_pretrained(tiny_base_dir).eval()
    load_gated_lora(fresh, out)
    ids = torch.randint(0, mask_id, (1, 10))
    ids[0, 6:] = mask_id
    with torch.no_grad():
        assert torch.equal(fresh(input_ids=ids).logits, model(input_ids=ids).logits)

    from peft import PeftModel

    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_base_dir), out)
    q = peft_model.base_model.model.model.layers[0].self_attn.q_proj
    assert torch.equal(
        q.lora_A["default"].weight, adapter.layers["model.layers.0.self_attn.q_proj"].lora_A.weight
    )


def test_the_adapter_training_writes_is_what_serving_reads(tmp_path, tiny_base_dir, mask_id):
    """One format: serving's reader (the one `draft_lora` goes through) finds every attached
    layer's weights, the scale, the MASK row and the gate's facts of what training wrote."""
    from transformers import AutoConfig

    from vllm_idlm.formats.adapter import check_fits, read_adapter, read_adapter_facts

    model = AutoModelForCausalLM.from_pretrained(tiny_base_dir).eval()
    adapter = attach_gated_lora(model, LoraConfig(r=4, alpha=8.0), mask_id)
    with torch.no_grad():
        for p in adapter.parameters():
            p.normal_()
    out = save_gated_lora(adapter, tmp_path / "lora", str(tiny_base_dir), (2, 3), {"name": "t"})
    files = read_adapter(out)
    check_fits(files, AutoConfig.from_pretrained(tiny_base_dir))
    assert files.scale == 2.0 and len(files.weights) == len(adapter.layers)
    layer = adapter.layers["model.layers.1.mlp.down_proj"]
    assert torch.equal(files.weights[1, "down_proj"][0], layer.lora_A.weight.float())
    assert torch.equal(files.weights[1, "down_proj"][1], layer.lora_B.weight.float())
    assert torch.equal(files.mask_embedding, adapter.mask_embedding.detach().float())
    facts = read_adapter_facts(out)
    assert facts.mask_token_id == mask_id and facts.strides == (2, 3)
