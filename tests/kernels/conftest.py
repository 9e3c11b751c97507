"""Kernel tests run compiled on a GPU and under Triton's interpreter elsewhere.

TRITON_INTERPRET must be set before any ``@triton.jit`` function is defined (and stay set while
interpreted kernels launch), i.e. before the Triton modules are imported, hence here. On a machine
where the project is not installed (a bare GPU box), ``idlm_kernels`` is registered from
``kernels/`` so that ``pytest tests/kernels`` still runs.
"""

import importlib.util
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if importlib.util.find_spec("idlm_kernels") is None:
    _init = Path(__file__).resolve().parents[2] / "kernels" / "__init__.py"
    _spec = importlib.util.spec_from_file_location(
        "idlm_kernels", _init, submodule_search_locations=[str(_init.parent)]
    )
    assert _spec is not None and _spec.loader is not None
    sys.modules["idlm_kernels"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["idlm_kernels"])
