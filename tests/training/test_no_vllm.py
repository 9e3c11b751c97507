"""Training never imports vLLM: every module, and the formats it shares with serving, import
with `vllm` blocked."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys


def test_training_imports_without_vllm():
    code = (
        "import sys, importlib, pkgutil\n"
        "sys.modules['vllm'] = None\n"
        "import idlm_training\n"
        "for m in pkgutil.iter_modules(idlm_training.__path__):\n"
        "    importlib.import_module('idlm_training.' + m.name)\n"
        "import vllm_idlm.formats.adapter, vllm_idlm.formats.checkpoint\n"
        "assert sys.modules['vllm'] is None\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_module_list_is_not_empty():
    import idlm_training

    names = [m.name for m in pkgutil.iter_modules(idlm_training.__path__)]
    assert {"objective", "block_mask", "gated_lora", "isd_reference", "cli"} <= set(names)
    assert importlib.import_module("idlm_training.objective")
