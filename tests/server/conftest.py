"""A real `vllm serve` process with ISD on the demo I-DLM, shared by the server tests."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

STARTUP_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: Path, spec: dict, log_path: Path, extra: list[str] = ()) -> tuple:
    port = free_port()
    vllm = shutil.which("vllm", path=str(Path(sys.executable).parent))
    cmd = [
        vllm,
        "serve",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "512",
        "--kv-cache-memory-bytes",
        str(512 << 20),
        "--speculative-config",
        json.dumps(spec),
        *extra,
    ]
    log = open(log_path, "w")  # noqa: SIM115 (held by the server process until it exits)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + STARTUP_TIMEOUT_S
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"vllm serve exited {proc.returncode}:\n{log_path.read_text()[-4000:]}"
            )
        try:
            if requests.get(f"{base}/health", timeout=2).status_code == 200:
                return proc, base
        except requests.RequestException:
            pass
        time.sleep(1)
    proc.kill()
    raise RuntimeError(
        f"vllm serve did not start in {STARTUP_TIMEOUT_S}s:\n{log_path.read_text()[-4000:]}"
    )


def stop_server(proc) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="session")
def isd_server(demo_models, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("server") / "vllm_serve.log"
    proc, base = start_server(
        demo_models["idlm"], {"method": "idlm", "num_speculative_tokens": 3}, log_path
    )
    yield {"url": base, "model": str(demo_models["idlm"]), "proc": proc, "log": log_path}
    stop_server(proc)
