"""Kernel tests run compiled on a GPU and under Triton's interpreter elsewhere.

TRITON_INTERPRET must be set before any ``@triton.jit`` function is defined, i.e. before the Triton
modules are imported, hence here.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
