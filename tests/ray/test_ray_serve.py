"""Ray Serve LLM serving the demo I-DLM with ISD (K = 3) on CPU: greedy answers equal plain
greedy decoding token for token, the spec-decode counters of the replica's engine reach
Ray's metrics endpoint, and a prompt holding the MASK token gets a 400 while the replica
keeps serving. One Ray cluster (2 CPUs) and one deployment for the whole module."""

from __future__ import annotations

import gc
import os

import pytest
import requests

from vllm_idlm.launch import free_port
from vllm_idlm.on_ray.common import wait_for_counters
from vllm_idlm.on_ray.serve import build_app, llm_config

pytest.importorskip("ray.serve.llm", reason="needs the `ray` extra (ray[serve])")

MODEL_ID = "idlm-demo"
NUM_DRAFTS = 3
MAX_TOKENS = 32
ENGINE = dict(
    dtype="float32", max_model_len=512, enforce_eager=True, kv_cache_memory_bytes=512 << 20
)
PROMPTS = [
    "def read_config(path):\n",
    "class LRUCache:\n    def __init__(self, size):\n",
    "import os\nimport sys\n\n\ndef main():\n",
    "    for i in range(len(items)):\n",
]


@pytest.fixture(scope="module")
def plain_greedy(demo_models) -> list[list[int]]:
    """Token ids of plain greedy decoding (no speculative config) with `vllm.LLM`, run
    before Ray starts so that the two never share the cores. vLLM's CPU platform edits
    os.environ (LD_PRELOAD, thread counts), which Ray's processes would inherit: restored."""
    from vllm import LLM, SamplingParams

    saved_env = dict(os.environ)
    llm = LLM(model=str(demo_models["idlm"]), **ENGINE)
    try:
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
        outputs = llm.generate(PROMPTS, params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs]
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        os.environ.clear()
        os.environ.update(saved_env)


@pytest.fixture(scope="module")
def served(demo_models, plain_greedy, start_ray):
    import ray
    from ray import serve

    metrics_port, http_port = free_port(), free_port()
    start_ray(_metrics_export_port=metrics_port)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": http_port})
        config = llm_config(
            demo_models["idlm"], model_id=MODEL_ID, num_drafts=NUM_DRAFTS, engine_kwargs=ENGINE
        )
        serve.run(build_app(config))  # returns once the replica's engine is up
        yield {"url": f"http://127.0.0.1:{http_port}", "metrics_port": metrics_port}
    finally:
        serve.shutdown()
        ray.shutdown()


def completion(served, prompt, **kwargs):
    body = {
        "model": MODEL_ID,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "return_token_ids": True,
        **kwargs,
    }
    return requests.post(f"{served['url']}/v1/completions", json=body, timeout=120)


def test_the_app_lists_the_model(served):
    r = requests.get(f"{served['url']}/v1/models", timeout=30)
    assert r.status_code == 200, r.text
    assert [m["id"] for m in r.json()["data"]] == [MODEL_ID]


def test_greedy_answers_equal_plain_greedy_decoding_token_for_token(served, plain_greedy):
    for prompt, expected in zip(PROMPTS, plain_greedy, strict=True):
        r = completion(served, prompt)
        assert r.status_code == 200, r.text
        choice, usage = r.json()["choices"][0], r.json()["usage"]
        assert choice["text"]
        if choice["finish_reason"] == "length":
            assert usage["completion_tokens"] == MAX_TOKENS
        else:
            assert choice["finish_reason"] == "stop"
            assert 0 < usage["completion_tokens"] < MAX_TOKENS
        assert choice["token_ids"] == expected, prompt


def test_the_replica_engine_ran_isd_and_ray_exports_its_counters(served):
    assert completion(served, "def fib(n):\n", ignore_eos=True).status_code == 200
    drafts = "ray_vllm_spec_decode_num_drafts_total"
    counters = wait_for_counters(served["metrics_port"], {drafts: 1}, timeout=90)
    assert counters.get(drafts, 0) > 0, counters
    draft_tokens = counters["ray_vllm_spec_decode_num_draft_tokens_total"]
    assert draft_tokens <= NUM_DRAFTS * counters[drafts]
    assert counters["ray_vllm_spec_decode_num_accepted_tokens_total"] <= draft_tokens


def test_a_prompt_with_the_mask_token_gets_a_400_and_the_replica_lives(served):
    r = completion(served, "a = <|mask|> + 1")
    assert r.status_code == 400, r.text
    assert "MASK token" in r.json()["error"]["message"]
    r = completion(served, "a = 1 + ", max_tokens=8)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1
