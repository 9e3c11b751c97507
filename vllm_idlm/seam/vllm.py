"""vLLM's private symbols, for the rest of the plugin: `from vllm_idlm.seam.vllm import X`
gives vLLM's X where the seam table lists it (called, subclassed or read), and refuses any
name the table does not list. Each is imported on first use, so that importing this module
imports nothing of vLLM (the runner's module stays unloaded in the API server).
"""

from __future__ import annotations

import importlib
from typing import Any

from vllm_idlm.seam.table import by_name

_TABLE = by_name()


def __getattr__(name: str) -> Any:
    touch = _TABLE.get(name)
    if touch is None:
        raise AttributeError(
            f"vllm_idlm.seam.vllm has no {name!r}: list it in vllm_idlm/seam/table.py first"
        )
    return getattr(importlib.import_module(touch.module), touch.qualname)
