"""Run a patch when a module is first imported (or now, if it already is).

The plugin runs in every vLLM process, including the API server, which never builds a
model runner: importing the runner module there would cost seconds and, on GPU builds,
risk touching CUDA early. Patches on such modules wait for their import.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def __init__(self, module_name: str, patch: Callable[[], None]) -> None:
        self.module_name = module_name
        self.patch = patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module_name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader, patch = spec.loader, self.patch
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            patch()

        loader.exec_module = exec_module
        return spec


def when_imported(module_name: str, patch: Callable[[], None]) -> None:
    if module_name in sys.modules:
        patch()
        return
    if any(isinstance(f, _PatchOnImport) and f.module_name == module_name for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _PatchOnImport(module_name, patch))
