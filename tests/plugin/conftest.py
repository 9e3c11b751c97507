"""Engine fixtures: real vLLM engines (CPU build, fp32) over the demo checkpoints."""

from __future__ import annotations

import contextlib
import gc
from collections import Counter

import pytest
import torch

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


def _chi_square_p_value(a: list[int], b: list[int], min_count: int = 10) -> float:
    """p-value of the homogeneity test between two samples of categories; categories
    with fewer than `min_count` pooled observations are merged into one bin."""
    ca, cb = Counter(a), Counter(b)
    pooled = ca + cb
    frequent = [t for t, c in pooled.items() if c >= min_count]
    rare = [t for t in pooled if t not in frequent]
    table = [[ca[t] for t in frequent], [cb[t] for t in frequent]]
    if rare:
        table[0].append(sum(ca[t] for t in rare))
        table[1].append(sum(cb[t] for t in rare))
    obs = torch.tensor(table, dtype=torch.float64)
    if obs.shape[1] < 2:
        return 1.0
    expected = obs.sum(1, keepdim=True) * obs.sum(0, keepdim=True) / obs.sum()
    stat = ((obs - expected) ** 2 / expected).sum()
    dof = torch.tensor(float(obs.shape[1] - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, stat / 2))


@pytest.fixture(scope="session")
def chi_square_p_value():
    return _chi_square_p_value
