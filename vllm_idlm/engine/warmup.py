"""Measure the adaptive policy's step cost while the engine starts, right after vLLM's
warm-up (the KV cache is allocated and the model compiled), so that no request pays for it.

The worker classes are patched as their modules load, from `register()`: the CPU worker's
own import is what brings in the model runner, so patching from the runner's hooks would
find it half-initialized. An engine whose warm-up never runs is calibrated before its first
step instead (`runner.execute_model`).
"""

from __future__ import annotations

import functools
import sys

from vllm_idlm.engine import lazy

WORKERS = (
    ("vllm.v1.worker.gpu_worker", "Worker"),
    ("vllm.v1.worker.cpu_worker", "CPUWorker"),
)


def install() -> None:
    for module, name in WORKERS:
        lazy.when_imported(module, functools.partial(_wrap, module, name))


def _wrap(module: str, name: str) -> None:
    cls = getattr(sys.modules[module], name)
    original = cls.compile_or_warm_up_model
    if getattr(original, "_idlm_wrapped", False):
        return

    @functools.wraps(original)
    def compile_or_warm_up_model(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        from vllm_idlm.engine.calibration import calibrate_once

        calibrate_once(self.model_runner)
        return out

    compile_or_warm_up_model._idlm_wrapped = True
    cls.compile_or_warm_up_model = compile_or_warm_up_model
