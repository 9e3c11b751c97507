"""Shared fixtures: a tiny random Qwen3 / Llama + tokenizer, and one tiny demo build per session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from idlm_training.config import ModelShape, load_recipe
from idlm_training.modeling import build_model
from idlm_training.tokenizer import MASK_TOKEN, train_bpe_tokenizer

TEXT = [
    "def add(a, b):\n    return a + b\n\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n    print(i * i)\n",
    "import os\nimport sys\n\nif __name__ == '__main__':\n    main()\n",
] * 20

TINY_SHAPE = ModelShape(
    vocab_size=320,
    hidden_size=64,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=32,
    intermediate_size=128,
    max_position_embeddings=256,
)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return train_bpe_tokenizer(TEXT, 300)


@pytest.fixture(scope="session")
def mask_id(tiny_tokenizer) -> int:
    return tiny_tokenizer.convert_tokens_to_ids(MASK_TOKEN)


def tiny_llama(shape: ModelShape, eos_token_id: int, seed: int):
    """The Llama twin of `build_model` (the family of SmolLM2 and other imported bases)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_position_embeddings,
        tie_word_embeddings=shape.tie_word_embeddings,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        bos_token_id=None,
    )
    model = LlamaForCausalLM(config)
    model.set_attn_implementation("sdpa")
    return model


@pytest.fixture(params=["qwen3", "llama"])
def tiny_model(request, tiny_tokenizer):
    """A random fp32 model (2 layers, hidden 64) of each supported family; random init is
    enough for exactness tests."""
    eos = tiny_tokenizer.eos_token_id
    if request.param == "llama":
        return tiny_llama(TINY_SHAPE, eos, seed=0).eval()
    return build_model(TINY_SHAPE, eos, tiny_tokenizer.pad_token_id, seed=0).eval()


@pytest.fixture(scope="session")
def tiny_base_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    from idlm_training.export import save_base_checkpoint

    model = build_model(
        TINY_SHAPE, tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id, seed=0
    )
    return save_base_checkpoint(model, tiny_tokenizer, tmp_path_factory.mktemp("base") / "base")


@pytest.fixture(scope="session")
def tiny_demo(tmp_path_factory) -> dict[str, Path]:
    """The `tiny` preset built once per session (about half a minute on 2 cores)."""
    from idlm_training.demo import build_demo

    torch.manual_seed(0)
    return build_demo(load_recipe("tiny"), tmp_path_factory.mktemp("demo"), log=lambda m: None)
