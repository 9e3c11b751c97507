"""The dispatcher: one place chooses the backend; nothing imports vLLM."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from idlm_kernels import ops


def test_auto_uses_the_reference_for_cpu_tensors() -> None:
    with ops.use_backend("auto"):
        assert not ops.use_triton(torch.zeros(1))


def test_forced_backends_and_restore() -> None:
    before = ops.get_backend()
    with ops.use_backend("ref"):
        assert ops.get_backend() == "ref" and not ops.use_triton(torch.zeros(1))
    assert ops.get_backend() == before


def test_unknown_backend_is_rejected_with_its_name() -> None:
    with pytest.raises(ValueError, match="'cuda'"):
        ops.set_backend("cuda")  # type: ignore[arg-type]


def test_kernels_import_without_vllm() -> None:
    code = (
        "import sys; sys.modules['vllm'] = None\n"
        "import idlm_kernels.ops, idlm_kernels.testing\n"
        "assert 'vllm' not in [m.split('.')[0] for m in sys.modules if sys.modules[m]]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
