"""gated_lora_ref and its autograd: the gate-closed identity, hand cases, packed slices, gradients."""

from __future__ import annotations

import pytest
import torch

from idlm_kernels import ops
from idlm_kernels.gated_lora import (
    gated_lora_packed,
    gated_lora_ref,
    gated_lora_runs,
    pack_lora,
    row_runs,
)


def _inputs(tokens: int = 7, d_in: int = 12, d_out: int = 10, rank: int = 4, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    y = torch.randn(tokens, d_out, generator=gen)
    x = torch.randn(tokens, d_in, generator=gen)
    a = torch.randn(rank, d_in, generator=gen)
    b = torch.randn(d_out, rank, generator=gen)
    return y, x, a, b


def test_gate_closed_leaves_y_bit_identical_and_returns_it() -> None:
    y, x, a, b = _inputs()
    before = y.clone()
    out = ops.gated_lora(y, x, a, b, torch.zeros(0, dtype=torch.long), 2.0)
    assert out is y and torch.equal(y, before)


def test_only_gated_rows_change_and_by_the_lora_delta() -> None:
    y, x, a, b = _inputs()
    before = y.clone()
    rows = torch.tensor([5, 1])
    gated_lora_ref(y, x, a, b, rows, 0.5)
    untouched = torch.tensor([0, 2, 3, 4, 6])
    assert torch.equal(y[untouched], before[untouched])
    expected = before[rows] + 0.5 * (x[rows] @ a.T) @ b.T
    torch.testing.assert_close(y[rows], expected)


def test_rank_one_hand_case() -> None:
    y = torch.zeros(2, 2)
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    a = torch.tensor([[1.0, 1.0]])  # shrink: row sum
    b = torch.tensor([[1.0], [-1.0]])
    gated_lora_ref(y, x, a, b, torch.tensor([1]), 2.0)
    assert y.tolist() == [[0.0, 0.0], [14.0, -14.0]]


def test_packed_slices_equal_one_layer_per_slice() -> None:
    y, x, _, _ = _inputs(d_out=9)
    gen = torch.Generator().manual_seed(1)
    sizes, ranks = [4, 3, 2], [2, 3, 1]
    a_list = [torch.randn(r, 12, generator=gen) for r in ranks]
    b_list = [torch.randn(s, r, generator=gen) for s, r in zip(sizes, ranks, strict=True)]
    rows = torch.tensor([0, 3, 6])
    packed = gated_lora_ref(y.clone(), x, a_list, b_list, rows, 1.5, sizes)
    offset = 0
    for a, b, s in zip(a_list, b_list, sizes, strict=True):
        single = gated_lora_ref(y[:, offset : offset + s].clone(), x, a, b, rows, 1.5)
        assert torch.equal(packed[:, offset : offset + s], single)
        offset += s


def test_prepacked_weights_give_the_references_deltas_and_touch_no_other_row() -> None:
    """The serving layer's CPU path: every slice in one pair of matmuls, a slice the adapter
    does not target as a rank-0 pair (a no-op), the scale folded into the weights."""
    y, x, _, _ = _inputs(d_out=9)
    gen = torch.Generator().manual_seed(2)
    sizes, ranks = [4, 3, 2], [2, 0, 3]
    a_list = [torch.randn(r, 12, generator=gen) for r in ranks]
    b_list = [torch.randn(s, r, generator=gen) for s, r in zip(sizes, ranks, strict=True)]
    rows = torch.tensor([6, 2])
    expected = gated_lora_ref(y.clone(), x, a_list, b_list, rows, 1.5, sizes)
    packed = pack_lora(a_list, b_list, 1.5, sizes)
    assert packed.a_t.shape == (12, 5) and [b.shape for b in packed.b_t] == [(2, 4), (0, 3), (3, 2)]
    got = gated_lora_packed(y.clone(), x, packed, rows)
    torch.testing.assert_close(got, expected)
    others = torch.tensor([0, 1, 3, 4, 5])
    assert torch.equal(got[others], y[others])
    assert torch.equal(got[:, 4:7], y[:, 4:7])  # the untargeted slice: bit-identical
    closed = ops.gated_lora_inference(y.clone(), x, a_list, b_list, packed, rows[:0], 1.5, sizes)
    assert torch.equal(closed, y)


def test_row_runs_group_consecutive_rows() -> None:
    assert row_runs([]) == []
    assert row_runs([4]) == [(4, 5)]
    assert row_runs([2, 3, 4, 7, 9, 10]) == [(2, 5), (7, 8), (9, 11)]


@pytest.mark.parametrize("rows", [[5, 6], [1, 2, 5, 6], [0, 2, 4, 6], [6]])
def test_runs_give_the_references_deltas_and_touch_no_other_row(rows: list[int]) -> None:
    """The CPU path by runs of consecutive rows (views of x and y, addmm_ in place), and the
    serving dispatcher with runs given, on few runs and on more than it takes by runs."""
    y, x, _, _ = _inputs(d_out=9)
    gen = torch.Generator().manual_seed(4)
    sizes, ranks = [4, 3, 2], [2, 0, 3]
    a_list = [torch.randn(r, 12, generator=gen) for r in ranks]
    b_list = [torch.randn(s, r, generator=gen) for s, r in zip(sizes, ranks, strict=True)]
    gated = torch.tensor(rows)
    expected = gated_lora_ref(y.clone(), x, a_list, b_list, gated, 1.5, sizes)
    packed = pack_lora(a_list, b_list, 1.5, sizes)
    runs = row_runs(rows)
    got = gated_lora_runs(y.clone(), x, packed, runs)
    torch.testing.assert_close(got, expected)
    others = torch.tensor([r for r in range(y.shape[0]) if r not in rows])
    assert torch.equal(got[others], y[others])
    assert torch.equal(got[:, 4:7], y[:, 4:7])  # the untargeted slice: bit-identical
    served = ops.gated_lora_inference(y.clone(), x, a_list, b_list, packed, gated, 1.5, sizes, runs)
    torch.testing.assert_close(served, expected)
    assert torch.equal(served[others], y[others])


def test_bad_slice_sizes_are_rejected_with_their_values() -> None:
    y, x, a, b = _inputs()
    with pytest.raises(ValueError, match="sum to 9"):
        gated_lora_ref(y, x, [a], [b], torch.tensor([0]), 1.0, [9])


def test_autograd_matches_dense_masked_lora() -> None:
    y0, x0, a0, b0 = _inputs(seed=3)
    rows = torch.tensor([2, 4, 5])
    gate = torch.zeros(y0.shape[0], 1)
    gate[rows] = 1.0
    grad_out = torch.randn_like(y0)

    leaves = [t.clone().double().requires_grad_() for t in (y0, x0, a0, b0)]
    y, x, a, b = leaves
    with ops.use_backend("ref"):
        out = ops.gated_lora(y * 1.0, x, a, b, rows, 0.7)
    (out * grad_out.double()).sum().backward()

    dense = [t.clone().double().requires_grad_() for t in (y0, x0, a0, b0)]
    yd, xd, ad, bd = dense
    out_dense = yd + gate.double() * 0.7 * (xd @ ad.T) @ bd.T
    (out_dense * grad_out.double()).sum().backward()
    for got, want in zip(leaves, dense, strict=True):
        torch.testing.assert_close(got.grad, want.grad)


def test_autograd_gradcheck_packed() -> None:
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(5, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    a_list = [
        torch.randn(r, 6, generator=gen, dtype=torch.float64, requires_grad=True) for r in (2, 3)
    ]
    b_list = [
        torch.randn(s, r, generator=gen, dtype=torch.float64, requires_grad=True)
        for s, r in ((3, 2), (4, 3))
    ]
    y = torch.randn(5, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    rows = torch.tensor([1, 4])

    def fn(y, x, a0, a1, b0, b1):
        with ops.use_backend("ref"):
            return ops.gated_lora(y.clone(), x, [a0, a1], [b0, b1], rows, 0.3, [3, 4])

    assert torch.autograd.gradcheck(fn, (y, x, *a_list, *b_list))


def test_autograd_ignores_minus_one_padding_rows() -> None:
    y0, x0, a0, b0 = _inputs(seed=5)
    grads = []
    for rows in (torch.tensor([2, 5]), torch.tensor([-1, 2, -1, 5])):
        leaves = [t.clone().requires_grad_() for t in (x0, a0, b0)]
        with ops.use_backend("ref"):
            out = ops.gated_lora(y0.clone(), *leaves, rows, 0.7)
        out.square().sum().backward()
        grads.append([t.grad for t in leaves])
    for got, want in zip(*grads, strict=True):
        assert torch.equal(got, want)


def test_autograd_under_bf16_autocast_keeps_each_grad_in_its_dtype() -> None:
    """Regression: training under CPU bf16 autocast (bf16 activations, fp32 LoRA weights) failed
    in backward with "expected m1 and m2 to have the same dtype" (backward runs outside
    autocast). The gradients must match an fp32 computation on the same bf16 inputs."""
    y0, x0, a0, b0 = _inputs(tokens=9, seed=6)
    rows = torch.tensor([1, 3, 8])
    x = x0.bfloat16().requires_grad_()
    a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    with ops.use_backend("ref"), torch.autocast("cpu", dtype=torch.bfloat16):
        out = ops.gated_lora(y0.bfloat16(), x, a, b, rows, 0.5)
    out.float().sum().backward()
    assert x.grad.dtype == torch.bfloat16 and a.grad.dtype == b.grad.dtype == torch.float32

    xf, af, bf = (t.detach().float().requires_grad_() for t in (x, a0, b0))
    with ops.use_backend("ref"):
        ops.gated_lora(y0.clone(), xf, af, bf, rows, 0.5).sum().backward()
    # bf16 matmuls in the forward: agreement to bf16 precision
    torch.testing.assert_close(a.grad, af.grad, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(b.grad, bf.grad, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(x.grad.float(), xf.grad, rtol=2e-2, atol=2e-2)
