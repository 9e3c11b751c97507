"""The one way the plugin patches vLLM: every `wrap` / `replace` / `add` of the seam table,
applied once per process as the patched module loads.

vLLM calls the plugin's `register()` in every process it starts, possibly several times:
`install()` is idempotent (a patched attribute carries the target it was patched for, and is
never patched twice). Patches on modules not yet imported wait for their import, so that
processes that never build a model runner (the API server) never import one; several patches
may wait for the same module. The plugin's code a patch runs is imported on its first call,
not when the patch is applied: a patch fires in the middle of vLLM's imports, and the
plugin's module that holds it may itself be importing vLLM at that moment.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import sys
from collections.abc import Callable
from typing import Any

from vllm_idlm.seam.table import PATCH_KINDS, TABLE, Touch

MARK = "__idlm_seam__"  # on every patched attribute: the target it was patched for
_originals: dict[str, Any] = {}  # target -> what vLLM had there before the patch


def install(on_cpu: bool) -> None:
    """Apply every patch of the table (the CPU build's fixes on CPU only), now or as soon as
    its module is imported."""
    for touch in TABLE:
        if touch.kind in PATCH_KINDS and (on_cpu or not touch.cpu_only):
            when_imported(touch.module, functools.partial(apply, touch))


def original(touch: Touch) -> Any:
    """What vLLM defines at `touch.target`, whether or not it has been patched."""
    if touch.target in _originals:
        return _originals[touch.target]
    owner, name = _owner(touch)
    return getattr(owner, name, None)


def resolve(path: str) -> Any:
    """The object at "module:qualified.name"."""
    module, qualname = path.split(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def apply(touch: Touch) -> None:
    owner, name = _owner(touch)
    current = getattr(owner, name, None)
    if getattr(current, MARK, None) == touch.target:
        return  # patched already (also through a base class)
    if touch.kind == "add" and current is not None:
        raise RuntimeError(f"idlm: vLLM now defines {touch.target}; the plugin would hide it")
    if touch.kind == "wrap" and current is None:
        raise RuntimeError(f"idlm: vLLM has no {touch.target} to patch (see the seam table)")
    new = resolve(touch.by) if touch.kind == "replace" else _deferred(current, touch)
    _originals[touch.target] = current
    setattr(new, MARK, touch.target)
    setattr(owner, name, new)


def _owner(touch: Touch) -> tuple[Any, str]:
    *path, name = touch.qualname.split(".")
    owner: Any = importlib.import_module(touch.module)
    for part in path:
        owner = getattr(owner, part)
    return owner, name


def _deferred(current: Any, touch: Touch) -> Callable:
    """A function that imports `touch.by` on its first call and runs it: a wrap gets vLLM's
    original first, an added method is called as is."""
    impl: list[Callable] = []

    def target() -> Callable:
        if not impl:
            impl.append(resolve(touch.by))
        return impl[0]

    if touch.kind == "add":

        def added(*args, **kwargs):
            return target()(*args, **kwargs)

        return added

    @functools.wraps(current)
    def wrapped(*args, **kwargs):
        return target()(current, *args, **kwargs)

    return wrapped


class _OnImport(importlib.abc.MetaPathFinder):
    """Runs the patches waiting for a module right after the module's own code ran."""

    def __init__(self) -> None:
        self.waiting: dict[str, list[Callable[[], None]]] = {}

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.waiting:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None:
            return spec
        loader, run_module = spec.loader, spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            for patch in self.waiting.pop(fullname, ()):
                patch()

        loader.exec_module = exec_module
        return spec


_finder = _OnImport()


def when_imported(module_name: str, patch: Callable[[], None]) -> None:
    """Run `patch` now if `module_name` is imported, else right after its import."""
    if module_name in sys.modules:
        patch()
        return
    _finder.waiting.setdefault(module_name, []).append(patch)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
