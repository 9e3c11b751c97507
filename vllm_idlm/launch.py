"""Start and stop a real `vllm serve` process (tests, benchmarks, examples).

vLLM-free: it runs the `vllm` command of the current interpreter's environment as a
subprocess, waits for `/health`, and measures the resident memory of the whole process
tree (API server, engine core, workers).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

STARTUP_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`vllm serve MODEL` on a free local port; a context manager that stops it."""

    def __init__(
        self,
        model: str | Path,
        log_path: str | Path,
        spec: dict[str, Any] | None = None,
        extra: list[str] | tuple[str, ...] = (),
        dtype: str = "float32",
        max_model_len: int = 512,
        kv_cache_bytes: int = 512 << 20,
    ) -> None:
        self.model = str(model)
        self.log_path = Path(log_path)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        vllm = shutil.which("vllm", path=str(Path(sys.executable).parent)) or "vllm"
        self.cmd = [
            vllm,
            "serve",
            self.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            dtype,
            "--max-model-len",
            str(max_model_len),
            "--kv-cache-memory-bytes",
            str(kv_cache_bytes),
            *(["--speculative-config", json.dumps(spec)] if spec else []),
            *extra,
        ]
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = STARTUP_TIMEOUT_S) -> Server:
        log = open(self.log_path, "w")  # noqa: SIM115 (held by the server until it exits)
        self.proc = subprocess.Popen(
            self.cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy()
        )
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited {self.proc.returncode}:\n{self.log_tail()}")
            if self.healthy():
                return self
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"vllm serve did not start in {timeout_s:.0f}s:\n{self.log_tail()}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def rss_bytes(self) -> int:
        """Resident memory of the server and every process it started."""
        import psutil

        if not self.alive():
            return 0
        root = psutil.Process(self.proc.pid)
        total = 0
        for p in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                total += p.memory_info().rss
        return total

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
