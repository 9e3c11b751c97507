"""Engine fixtures: real vLLM engines (CPU build, fp32) over the demo checkpoints."""

from __future__ import annotations

import contextlib
import gc

import pytest

ENGINE_DEFAULTS = dict(
    dtype="float32",
    max_model_len=512,
    enforce_eager=True,  # the compiled path is exercised by the server tests
    kv_cache_memory_bytes=512 << 20,
    disable_log_stats=False,
    seed=0,
)


@contextlib.contextmanager
def open_llm(model, num_drafts: int | None = None, spec_extra: dict | None = None, **kwargs):
    from vllm import LLM

    args = {**ENGINE_DEFAULTS, **kwargs}
    if num_drafts is not None:
        args["speculative_config"] = {
            "method": "idlm",
            "num_speculative_tokens": num_drafts,
            **(spec_extra or {}),
        }
    llm = LLM(model=str(model), **args)
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


@pytest.fixture(scope="session")
def llm_factory():
    return open_llm


def token_prompts(prompts):
    from vllm.inputs import TokensPrompt

    return [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]


@pytest.fixture(scope="session")
def as_prompts():
    return token_prompts


def generate_ids(llm, prompts, params) -> list[list[int]]:
    outputs = llm.generate(token_prompts(prompts), params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


@pytest.fixture(scope="session")
def generate():
    return generate_ids
