"""gated_lora_triton against the reference: untouched rows bit-identical, gated rows by the tolerance rule."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from idlm_kernels import ops  # noqa: E402
from idlm_kernels.gated_lora import gated_lora_ref  # noqa: E402
from idlm_kernels.gated_lora_triton import gated_lora_triton  # noqa: E402
from idlm_kernels.testing import assert_close_to_gold  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _case(tokens, d_in, sizes, ranks, num_gated, dtype, seed=0, device=DEVICE):
    gen = torch.Generator().manual_seed(seed)
    y = torch.randn(tokens, sum(sizes), generator=gen)
    x = torch.randn(tokens, d_in, generator=gen)
    a_list = [torch.randn(r, d_in, generator=gen) / d_in**0.5 for r in ranks]
    b_list = [torch.randn(s, r, generator=gen) / r**0.5 for s, r in zip(sizes, ranks, strict=True)]
    rows = torch.randperm(tokens, generator=gen)[:num_gated]
    to = {"device": device, "dtype": dtype}
    return (
        y.to(**to), x.to(**to), [a.to(**to) for a in a_list], [b.to(**to) for b in b_list],
        rows.to(device),
    )  # fmt: skip


def _check(tokens, d_in, sizes, ranks, num_gated, dtype, scale=0.5, atol=1e-5) -> None:
    y, x, a_list, b_list, rows = _case(tokens, d_in, sizes, ranks, num_gated, dtype)
    gold = gated_lora_ref(
        y.double().cpu(), x.double().cpu(), [a.double().cpu() for a in a_list],
        [b.double().cpu() for b in b_list], rows.cpu(), scale, sizes,
    )  # fmt: skip
    reference = gated_lora_ref(y.clone(), x, a_list, b_list, rows, scale, sizes)
    actual = gated_lora_triton(y.clone(), x, a_list, b_list, rows, scale, sizes)
    ungated = torch.ones(tokens, dtype=torch.bool, device=y.device)
    ungated[rows] = False
    assert torch.equal(actual[ungated], y[ungated])
    assert_close_to_gold(actual, reference, gold, atol=atol, name="y")


def test_kernel_matches_ref_single_slice_fp32() -> None:
    _check(tokens=11, d_in=72, sizes=[40], ranks=[8], num_gated=5, dtype=torch.float32)


def test_kernel_matches_ref_packed_qkv_slices_with_own_ranks_fp32() -> None:
    _check(
        tokens=9, d_in=48, sizes=[32, 16, 16], ranks=[8, 4, 20], num_gated=4, dtype=torch.float32
    )


def test_kernel_matches_ref_bf16() -> None:
    _check(
        tokens=20,
        d_in=130,
        sizes=[24, 40],
        ranks=[16, 16],
        num_gated=17,
        dtype=torch.bfloat16,
        atol=1e-2,
    )


def test_kernel_matches_ref_many_gated_rows_bf16() -> None:
    """More than 256 gated rows switches to the training-size tiles (64 rows, no split over in)."""
    _check(
        tokens=300, d_in=48, sizes=[40], ranks=[8], num_gated=280, dtype=torch.bfloat16, atol=1e-2
    )


def test_kernel_gate_closed_is_a_no_op() -> None:
    y, x, a_list, b_list, _ = _case(6, 32, [16], [4], 0, torch.float32)
    before = y.clone()
    out = gated_lora_triton(
        y, x, a_list, b_list, torch.zeros(0, dtype=torch.long, device=DEVICE), 1.0, [16]
    )
    assert out is y and torch.equal(y, before)


def test_kernel_forward_autograd_matches_ref_gradients() -> None:
    y, x, a_list, b_list, rows = _case(7, 32, [16, 8], [4, 4], 3, torch.float32)
    grads = []
    for backend in ("triton", "ref"):
        leaves = [t.clone().requires_grad_() for t in (x, *a_list, *b_list)]
        with ops.use_backend(backend):
            out = ops.gated_lora(y.clone(), leaves[0], leaves[1:3], leaves[3:5], rows, 0.5, [16, 8])
        out.square().sum().backward()
        grads.append([t.grad for t in leaves])
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("num_gated", [3, 48, 192, 2048])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_ref_realistic_shapes_on_gpu(num_gated: int, dtype: torch.dtype) -> None:
    """Decode (3-192 MASK rows of 2K+1 per request) and training-size (2048 of 4096) gates."""
    atol = 1e-4 if dtype == torch.float32 else 2e-2
    tokens = max(448, 2 * num_gated)
    sizes, ranks = [4096, 1024, 1024], [128] * 3
    _check(
        tokens=tokens,
        d_in=4096,
        sizes=sizes,
        ranks=ranks,
        num_gated=num_gated,
        dtype=dtype,
        atol=atol,
    )


def test_kernel_in_place_on_a_tracked_y_keeps_its_gradient_exact() -> None:
    """Only y needs a gradient (frozen adapter, grad mode on): the kernel's raw in-place write
    must still be recorded, and y's gradient passes through unchanged."""
    y, x, a_list, b_list, rows = _case(6, 32, [16], [4], 2, torch.float32)
    leaf = y.clone().requires_grad_()
    with ops.use_backend("triton"):
        out = ops.gated_lora(leaf * 1.0, x, a_list, b_list, rows, 0.5, [16])
    out.sum().backward()
    assert torch.equal(leaf.grad, torch.ones_like(y))


def test_kernel_skips_minus_one_padding_rows_like_the_ref() -> None:
    """A fixed-size rows tensor padded with -1 (CUDA graphs) adds the delta to the real rows only."""
    y, x, a_list, b_list, rows = _case(9, 32, [16, 8], [4, 4], 3, torch.float32)
    padded = torch.cat([rows[:2], torch.full((2,), -1, device=rows.device), rows[2:]])
    want = gated_lora_ref(y.clone(), x, a_list, b_list, rows, 0.5, [16, 8])
    assert torch.equal(gated_lora_ref(y.clone(), x, a_list, b_list, padded, 0.5, [16, 8]), want)
    got = gated_lora_triton(y.clone(), x, a_list, b_list, padded, 0.5, [16, 8])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    ungated = torch.ones(9, dtype=torch.bool, device=y.device)
    ungated[rows] = False
    assert torch.equal(got[ungated], y[ungated])


def test_the_serving_op_runs_the_kernel_under_triton_and_the_packed_ref_otherwise() -> None:
    from idlm_kernels.gated_lora import gated_lora_packed, pack_lora

    sizes = [32, 16, 16]
    y, x, a_list, b_list, rows = _case(9, 48, sizes, [8, 4, 20], 3, torch.float32)
    packed = pack_lora(a_list, b_list, 0.5, sizes)
    with ops.use_backend("triton"):
        kernel = ops.gated_lora_inference(y.clone(), x, a_list, b_list, packed, rows, 0.5, sizes)
    with ops.use_backend("ref"):
        ref = ops.gated_lora_inference(y.clone(), x, a_list, b_list, packed, rows, 0.5, sizes)
    assert torch.equal(kernel, gated_lora_triton(y.clone(), x, a_list, b_list, rows, 0.5, sizes))
    assert torch.equal(ref, gated_lora_packed(y.clone(), x, packed, rows))
