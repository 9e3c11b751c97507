"""The seam to vLLM: the table holds on the installed vLLM (signatures by `inspect`, the rest
by reading its sources), nothing else imports vLLM's internals, patches apply once however
often the plugin registers, and the release checker reports what moved."""

from __future__ import annotations

import ast
import contextlib
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from vllm_idlm.seam import patch
from vllm_idlm.seam.sources import VllmSources, check, signature_of
from vllm_idlm.seam.table import CALLABLE_KINDS, PATCH_KINDS, TABLE, Touch

ROOT = Path(__file__).resolve().parents[2]
# vLLM's public API: what users of `vllm` import too.
PUBLIC = {"vllm", "vllm.sampling_params", "vllm.inputs", "vllm.outputs"}


def parse(path: Path) -> ast.Module:
    """A file's AST. CPython 3.11's AST conversion keeps its recursion depth in shared state
    (gh-106905): a background thread left by an earlier test that parses at the same moment
    makes it raise SystemError ("AST constructor recursion depth mismatch"); that is retried."""
    for _ in range(2):
        with contextlib.suppress(SystemError):
            return ast.parse(path.read_text())
    return ast.parse(path.read_text())


def _id(touch: Touch) -> str:
    return f"{touch.target}[{touch.kind}]"


@pytest.fixture(scope="module")
def installed() -> VllmSources:
    import vllm

    return VllmSources(Path(vllm.__file__).parent)


@pytest.mark.parametrize("touch", [t for t in TABLE if t.kind in CALLABLE_KINDS], ids=_id)
def test_the_installed_vllm_has_the_signature_the_table_pins(touch):
    """inspect.signature of what vLLM defines there (before any patch of the plugin)."""
    found = patch.original(touch)
    assert found is not None, f"vLLM {_version()} has no {touch.target}: see the seam table"
    now = signature_of(found)
    assert now == touch.params, (
        f"vLLM {_version()} changed {touch.target}: the seam table pins ({touch.params}), "
        f"vLLM has ({now}). Check what the plugin's {touch.kind} of it does ({touch.why}), "
        "then update vllm_idlm/seam/table.py"
    )


@pytest.mark.parametrize("touch", TABLE, ids=_id)
def test_vllms_sources_hold_every_touch(touch, installed):
    """The release checker (`tools/check_vllm_seam.py`) finds nothing wrong with the installed
    vLLM: fields, the facts the plugin relies on (custom_class forces the V1 runner), and the
    same signatures as `inspect`."""
    finding = check(installed, touch)
    assert finding is None, f"{touch.target} [{touch.kind}] ({touch.why}): {finding.message}"


def test_facts_the_plugin_relies_on_hold_in_vllms_source(installed):
    facts = [t for t in TABLE if t.kind == "mentions"]
    assert facts and all(check(installed, t) is None for t in facts)


def test_every_name_the_plugin_imports_from_the_seam_is_in_the_table():
    from vllm_idlm.seam import vllm as seam_vllm

    used = set()
    for path in (ROOT / "vllm_idlm").rglob("*.py"):
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.ImportFrom) and node.module == "vllm_idlm.seam.vllm":
                used |= {alias.name for alias in node.names}
    assert used
    for name in used:
        assert getattr(seam_vllm, name) is not None
    with pytest.raises(AttributeError, match="list it in vllm_idlm/seam/table.py"):
        seam_vllm.GPUModelRunner_not_listed  # noqa: B018


def test_nothing_outside_the_seam_imports_vllm_beyond_its_public_api():
    offenders = []
    for path in (ROOT / "vllm_idlm").rglob("*.py"):
        if "seam" in path.relative_to(ROOT / "vllm_idlm").parts:
            continue
        for node in ast.walk(parse(path)):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            offenders += [
                f"{path.relative_to(ROOT)}:{node.lineno} {name}"
                for name in names
                if (name == "vllm" or name.startswith("vllm.")) and name not in PUBLIC
            ]
    assert offenders == [], "private vLLM imports outside vllm_idlm/seam: use seam.vllm"


def test_every_touch_names_a_test_that_exists_and_every_patch_code_that_exists():
    for touch in TABLE:
        file, _, name = touch.test.partition("::")
        path = ROOT / "tests" / file
        assert path.is_file(), (touch.target, touch.test)
        if name:
            defined = {n.name for n in ast.walk(parse(path)) if isinstance(n, ast.FunctionDef)}
            assert name in defined, (touch.target, touch.test)
        if touch.kind in PATCH_KINDS:
            assert callable(patch.resolve(touch.by)), touch.by
        else:
            assert not touch.by, touch.target


def test_every_patch_is_applied_once_however_often_the_plugin_registers():
    """register() runs in every vLLM process, possibly several times; the old per-module
    guards were repeated 18 times. Each patched attribute wraps vLLM's own function once."""
    code = """
        from vllm_idlm import plugin
        from vllm_idlm.seam import patch
        from vllm_idlm.seam.table import TABLE, PATCH_KINDS
        plugin.register()
        plugin._registered = False
        plugin.register()
        patch.install(on_cpu=True)
        import vllm.v1.worker.gpu_model_runner, vllm.v1.worker.cpu_worker
        import vllm.v1.engine.core, vllm.v1.worker.worker_base, vllm.v1.spec_decode.metrics
        for t in TABLE:
            if t.kind not in PATCH_KINDS:
                continue
            owner, name = patch._owner(t)
            now = getattr(owner, name)
            assert getattr(now, patch.MARK) == t.target, t.target
            inner = getattr(now, "__wrapped__", None)
            assert getattr(inner, patch.MARK, None) is None, ("patched twice", t.target)
        print("OK")
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


def test_two_patches_waiting_for_one_module_both_run(tmp_path, monkeypatch):
    """`lazy.when_imported` dropped a second patch for a module already waited for."""
    (tmp_path / "idlm_seam_probe.py").write_text("value = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ran = []
    patch.when_imported("idlm_seam_probe", lambda: ran.append("first"))
    patch.when_imported("idlm_seam_probe", lambda: ran.append("second"))
    assert ran == []
    import idlm_seam_probe  # noqa: F401

    assert ran == ["first", "second"]
    patch.when_imported("idlm_seam_probe", lambda: ran.append("now"))
    assert ran == ["first", "second", "now"]
    monkeypatch.delitem(sys.modules, "idlm_seam_probe")


def test_an_engine_module_imports_directly_after_the_plugins_load():
    """Importing vllm_idlm.engine.runner after load_general_plugins() failed with a circular
    import: the runner module's import of vLLM's runner fired the plugin's patch, which
    imported the half-initialized vllm_idlm.engine.runner."""
    code = """
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        import vllm_idlm.engine.runner
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
        assert GPUModelRunner.execute_model.__idlm_seam__.endswith("execute_model")
        print("OK")
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


def test_a_wrap_runs_the_plugins_code_around_vllms_and_keeps_its_signature(monkeypatch):
    module = types.ModuleType("idlm_seam_fake")
    module.double = lambda x, y=1: 2 * x * y
    plugin_code = types.ModuleType("idlm_seam_code")
    plugin_code.around = lambda original, x, y=1: original(x, y) + 1
    monkeypatch.setitem(sys.modules, "idlm_seam_fake", module)
    monkeypatch.setitem(sys.modules, "idlm_seam_code", plugin_code)
    touch = Touch("idlm_seam_fake:double", "wrap", "x, y=", "", "", by="idlm_seam_code:around")
    patch.apply(touch)
    patch.apply(touch)
    assert module.double(3) == 7 and module.double(3, y=2) == 13  # once, not twice
    assert patch.original(touch)(3) == 6


def test_the_checker_reports_what_moved_vanished_or_changed(tmp_path):
    """A fake release: a changed signature, a method gone, a class moved, a field gone, a
    function with a new optional parameter, and a fact no longer true."""
    pkg = tmp_path / "vllm"
    (pkg / "worker").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_version.py").write_text("__version__ = version = '9.9.9'\n")
    (pkg / "worker" / "__init__.py").write_text("")
    (pkg / "worker" / "new_home.py").write_text("class Moved:\n    pass\n")
    (pkg / "worker" / "runner.py").write_text(
        textwrap.dedent(
            """
            from .base import Base

            class Runner(Base):
                def step(self, batch, *, eager=False):
                    self.seen = 1

                @classmethod
                def make(cls, n):
                    return cls()

            def filt(logits, k, p, fast=True):
                return "custom_class"
            """
        )
    )
    (pkg / "worker" / "base.py").write_text(
        "class Base:\n    def forward(self, x):\n        pass\n"
    )
    sources = VllmSources(tmp_path)
    assert sources.version == "9.9.9"
    R = "vllm.worker.runner"

    def finding(target, kind, params=""):
        found = check(sources, Touch(target, kind, params, "", ""))
        return None if found is None else (found.status, found.message)

    assert finding(f"{R}:Runner.step", "wrap", "self, batch, *, eager=") is None
    assert finding(f"{R}:Runner.make", "call", "n") is None  # classmethod: cls dropped
    assert finding(f"{R}:Runner.forward", "override", "self, x") is None  # from the base
    assert finding(f"{R}:Runner", "fields", "seen forward") is None
    assert finding(f"{R}:Runner.step", "wrap", "self, batch") == (
        "breaks",
        "signature (self, batch) is now (self, batch, *, eager=)",
    )
    assert finding(f"{R}:filt", "call", "logits, k, p")[0] == "compatible"
    assert finding(f"{R}:filt", "wrap", "logits, k, p")[0] == "breaks"
    assert finding(f"{R}:Runner.gone", "wrap", "self") == ("breaks", "Runner has no gone")
    assert finding(f"{R}:Moved", "value") == (
        "breaks",
        f"moved? no Moved in {R}; one in vllm.worker.new_home",
    )
    assert finding(f"{R}:Nowhere", "value") == ("breaks", "vanished: no Nowhere anywhere")
    assert finding(f"{R}:Runner", "fields", "seen missing") == ("breaks", "has no missing")
    assert finding(f"{R}:filt", "mentions", "custom_class") is None
    assert finding(f"{R}:Runner.step", "mentions", "custom_class")[0] == "breaks"
    assert finding(f"{R}:Runner.added", "add") is None
    assert finding(f"{R}:Runner.step", "add")[0] == "breaks"


def test_the_checker_script_reads_a_wheel_and_names_the_release(tmp_path, installed):
    import zipfile

    import vllm

    wheel = tmp_path / "vllm-0.0-py3-none-any.whl"
    site = Path(vllm.__file__).parent.parent
    with zipfile.ZipFile(wheel, "w") as zf:
        for touch in TABLE:
            base = touch.module.replace(".", "/")
            for rel in (base + ".py", base + "/__init__.py", "vllm/_version.py"):
                if (site / rel).is_file() and rel not in zf.namelist():
                    zf.write(site / rel, rel)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "check_vllm_seam.py"), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.stdout.startswith(f"vLLM {_version()} ({wheel.name}): "), proc.stdout
    # Only the modules the table names are in this wheel: bases and re-exports elsewhere
    # are missing, and the checker says so rather than crash.
    assert proc.returncode in (0, 1), proc.stderr[-3000:]


def _version() -> str:
    import vllm

    return vllm.__version__
