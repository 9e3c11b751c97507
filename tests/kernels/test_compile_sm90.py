"""Every Triton kernel compiles for an H100/H200 (sm_90) down to a cubin, without a GPU.

The interpreter accepts code that the compiler rejects (non-constexpr globals, scalar/block
mismatches in math builtins); this catches those on a CPU-only machine. It runs in a subprocess
because the kernel tests' conftest turns the interpreter on for this process.
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

ISD_POINTERS = {
    "logits": "*bf16", "noise": "*fp32", "draft_probs": "*fp32", "draft_ids": "*i64",
    "uniforms": "*fp64", "num_draft": "*i64", "draft_prob_index": "*i64", "num_mask": "*i64", "temperature": "*fp32",
    "top_k": "*i64", "top_p": "*fp32", "accepted_out": "*i8", "recovered_out": "*i64",
    "bonus_out": "*i64", "next_ids_out": "*i64", "next_probs_out": "*fp32", "scratch": "*fp32",
}  # fmt: skip


def _signature(fn, pointers: dict[str, str], constexprs: dict) -> dict[str, str]:
    sig = {name: "i32" for name in fn.arg_names}
    sig.update(pointers)
    sig.update({name: "constexpr" for name in constexprs})
    return sig


def _compile_all() -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from idlm_kernels import gated_lora_triton as lora
    from idlm_kernels import isd_sample_triton as isd

    target = GPUTarget("cuda", 90, 32)

    def build(fn, pointers, constexprs, num_warps=4):
        src = ASTSource(
            fn=fn, signature=_signature(fn, pointers, constexprs), constexprs=constexprs
        )
        compiled = triton.compile(src, target=target, options={"num_warps": num_warps})
        assert compiled.asm["cubin"], fn.__name__

    default = isd.IsdTuning()
    for logits in ("*bf16", "*fp32"):
        for has_probs in (True, False):
            constexprs = {
                "HAS_DRAFT_PROBS": has_probs,
                "BLOCK": default.block,
                "NUM_PIVOTS": default.num_pivots,
                "SUB": default.sub,
                "BLOCK_B": 64,
            }
            build(
                isd._isd_rows_kernel,
                {**ISD_POINTERS, "logits": logits},
                constexprs,
                default.num_warps,
            )
    # the other launch configs the GPU benchmark sweeps
    for pivots, sub, warps, block in ((16, 256, 8, 4096), (16, 256, 8, 1024), (8, 256, 8, 2048),
                                      (32, 128, 8, 2048), (16, 512, 16, 4096)):  # fmt: skip
        constexprs = {
            "HAS_DRAFT_PROBS": True, "BLOCK": block, "NUM_PIVOTS": pivots, "SUB": sub, "BLOCK_B": 64,
        }  # fmt: skip
        build(isd._isd_rows_kernel, ISD_POINTERS, constexprs, warps)
    pointers = {name: "*i64" for name in isd._assemble_kernel.arg_names}
    pointers.update({"accepted": "*i8", "width": "i32", "num_reqs": "i32"})
    build(isd._assemble_kernel, pointers, {"BLOCK_W": 4, "BLOCK_B": 64})
    for dtype, dot_fp32 in (("*bf16", False), ("*fp32", True)):
        shrink = {"x": dtype, "lora_a": dtype, "rows": "*i64", "partial": "*fp32"}
        consts = {
            "BLOCK_G": 16,
            "BLOCK_R": 128,
            "BLOCK_K": 32 if dot_fp32 else 64,
            "DOT_FP32": dot_fp32,
        }
        build(lora._shrink_kernel, shrink, consts)
        expand = {"y": dtype, "lora_b": dtype, "rows": "*i64", "partial": "*fp32", "scale": "fp32"}
        consts = {"BLOCK_G": 16, "BLOCK_R": 128, "BLOCK_N": 32, "DOT_FP32": dot_fp32}
        build(lora._expand_kernel, expand, consts)
    # training-size tiles (more than 256 gated rows, bf16)
    shrink = {"x": "*bf16", "lora_a": "*bf16", "rows": "*i64", "partial": "*fp32"}
    build(
        lora._shrink_kernel,
        shrink,
        {"BLOCK_G": 64, "BLOCK_R": 128, "BLOCK_K": 32, "DOT_FP32": False},
        8,
    )
    expand = {"y": "*bf16", "lora_b": "*bf16", "rows": "*i64", "partial": "*fp32", "scale": "fp32"}
    build(
        lora._expand_kernel,
        expand,
        {"BLOCK_G": 64, "BLOCK_R": 128, "BLOCK_N": 64, "DOT_FP32": False},
        8,
    )


def test_kernels_compile_for_sm90() -> None:
    try:
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
    except ImportError:
        pytest.skip("this Triton build has no NVIDIA backend")
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    subprocess.run([sys.executable, __file__], env=env, check=True, timeout=600)


if __name__ == "__main__":
    # conftest's idlm_kernels registration (for an uninstalled checkout); TRITON_INTERPRET=0 from
    # the parent's environment wins over its setdefault.
    runpy.run_path(str(Path(__file__).with_name("conftest.py")))
    _compile_all()
