"""A real `vllm serve` process with ISD on the demo I-DLM, shared by the server tests."""

from __future__ import annotations

import pytest

from vllm_idlm.launch import Server


@pytest.fixture(scope="session")
def isd_server(demo_models, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("server") / "vllm_serve.log"
    spec = {"method": "idlm", "num_speculative_tokens": 3}
    with Server(demo_models["idlm"], log_path, spec) as server:
        yield {
            "url": server.url,
            "model": str(demo_models["idlm"]),
            "proc": server.proc,
            "log": log_path,
        }
