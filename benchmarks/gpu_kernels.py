"""GPU check of the idlm_kernels Triton kernels: compiled parity grid, then timings.

Run on one CUDA GPU (torch + Triton; no vLLM, no network), from the repository root:

    python benchmarks/gpu_kernels.py --out results/gpu

1. Parity (compiled): ``isd_verify_and_draft`` over vocab 100 / 8193 / 151936, batches 1..64, K = 3,
   greedy / random / mixed, zero drafts, zero masks, bf16 logits; ``gated_lora`` at hidden 4096, rank
   128, packed qkv, fp32 and bf16. Tokens must be ``torch.equal`` to the reference, floats within the
   style guide's tolerance rule, and a second kernel run bit-identical to the first.
2. Timing (median ms by ``triton.testing.do_bench``, L2 flushed): each kernel vs its PyTorch
   reference on the same GPU and vs the bytes-moved floor at the measured copy bandwidth; then a
   sweep of the ISD kernel's launch parameters on its slowest path (top-p).

Writes ``parity.csv``, ``timing.csv`` and ``env.txt`` under ``--out`` and prints tables. Budget: well
under 8 minutes on an H200; a deadline skips what is left rather than overrun. The unit tests run
compiled on the same machine with ``pytest -q tests/kernels`` (``-m gpu`` for the full-size grid);
neither needs the project installed.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def _import_idlm_kernels() -> None:
    """Make ``import idlm_kernels`` work without pip install (the package lives in kernels/)."""
    if importlib.util.find_spec("idlm_kernels") is not None:
        return
    init = REPO / "kernels" / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        "idlm_kernels", init, submodule_search_locations=[str(init.parent)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["idlm_kernels"] = module
    spec.loader.exec_module(module)


_import_idlm_kernels()

import triton  # noqa: E402
import triton.testing  # noqa: E402

from idlm_kernels.gated_lora import gated_lora_ref  # noqa: E402
from idlm_kernels.gated_lora_triton import gated_lora_triton  # noqa: E402
from idlm_kernels.isd_sample import isd_verify_and_draft_ref  # noqa: E402
from idlm_kernels.isd_sample_triton import IsdTuning, isd_verify_and_draft_triton  # noqa: E402
from idlm_kernels.testing import (  # noqa: E402
    IsdBatch,
    assert_close_to_gold,
    assert_isd_steps_match,
    make_isd_batch,
)

K = 3  # drafts (and MASK rows) per request
HIDDEN, RANK, QKV = 4096, 128, (4096, 1024, 1024)
# --smoke (CPU, TRITON_INTERPRET=1, tiny shapes) checks this script's plumbing without a GPU.
DEVICE = "cuda"
VOCABS, BATCHES, BIG_VOCAB = (100, 8193, 151936), (1, 8, 64), 151936


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def passed(self) -> bool:
        return time.monotonic() > self.end


def _steps_equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def isd_parity(deadline: Deadline) -> list[dict]:
    cases = [
        (vocab, num_reqs, mode, K, K, torch.float32)
        for vocab in VOCABS
        for num_reqs in BATCHES
        for mode in ("greedy", "random", "mixed")
    ]
    cases += [
        (BIG_VOCAB, 16, "mixed", 0, K, torch.float32),  # cold start: zero drafts
        (BIG_VOCAB, 16, "mixed", K, 0, torch.float32),  # zero masks
        (BIG_VOCAB, 16, "mixed", K, K, torch.bfloat16),
        (VOCABS[1], 64, "random", K, K, torch.float16),
    ]
    rows = []
    for vocab, num_reqs, mode, drafts, masks, dtype in cases:
        name = f"isd V={vocab} B={num_reqs} {mode} n={drafts} m={masks} {str(dtype)[6:]}"
        if deadline.passed():
            rows.append({"case": name, "result": "skipped (deadline)", "detail": ""})
            continue
        batch = make_isd_batch(
            num_reqs,
            vocab,
            drafts,
            masks,
            mode=mode,
            dtype=dtype,
            device=DEVICE,
            seed=vocab + num_reqs,
        )
        rows.append({"case": name, **_check_isd(batch)})
        print(f"{rows[-1]['result']:>6}  {name}  {rows[-1]['detail']}", flush=True)
    return rows


def _check_isd(batch: IsdBatch) -> dict:
    try:
        reference = isd_verify_and_draft_ref(*batch.args())
        actual = isd_verify_and_draft_triton(*batch.args())
        again = isd_verify_and_draft_triton(*batch.args())
        assert_isd_steps_match(actual, reference, batch)
        if not _steps_equal(actual, again):
            raise AssertionError("two kernel runs differ")
        mean_accepted = actual.num_accepted.double().mean().item()
        return {"result": "PASS", "detail": f"mean accepted {mean_accepted:.2f}"}
    except Exception as e:  # a failing case is recorded, the grid goes on
        return {"result": "FAIL", "detail": f"{type(e).__name__}: {str(e)[:300]}"}


def _lora_case(num_reqs: int, dtype: torch.dtype, sizes: tuple[int, ...], seed: int = 0):
    """Decode layout: B requests of 2K+1 rows, the last K (MASK) rows gated. num_reqs = 0 means a
    training-size batch instead: 4096 tokens, every other one gated."""
    gen = torch.Generator().manual_seed(seed)
    tokens = num_reqs * (2 * K + 1) if num_reqs else 4096
    y = torch.randn(tokens, sum(sizes), generator=gen)
    x = torch.randn(tokens, HIDDEN, generator=gen)
    a_list = [torch.randn(RANK, HIDDEN, generator=gen) / HIDDEN**0.5 for _ in sizes]
    b_list = [torch.randn(s, RANK, generator=gen) / RANK**0.5 for s in sizes]
    # gated rows: the K MASK rows at the end of each request's 2K+1 rows
    rows = torch.tensor([r * (2 * K + 1) + K + 1 + j for r in range(num_reqs) for j in range(K)])
    if not num_reqs:
        rows = torch.arange(1, tokens, 2)
    to = {"device": DEVICE, "dtype": dtype}
    return (
        y.to(**to), x.to(**to), [a.to(**to) for a in a_list], [b.to(**to) for b in b_list],
        rows.to(DEVICE),
    )  # fmt: skip


def lora_parity(deadline: Deadline) -> list[dict]:
    rows = []
    for num_reqs in (*BATCHES, 0):
        for dtype in (torch.float32, torch.bfloat16):
            batch = f"B={num_reqs}" if num_reqs else "train T=4096 G=2048"
            name = f"gated_lora {batch} qkv rank={RANK} {str(dtype)[6:]}"
            if deadline.passed():
                rows.append({"case": name, "result": "skipped (deadline)", "detail": ""})
                continue
            y, x, a_list, b_list, gated = _lora_case(num_reqs, dtype, QKV)
            try:
                gold = gated_lora_ref(
                    y.double(), x.double(), [a.double() for a in a_list],
                    [b.double() for b in b_list], gated, 1.0, QKV,
                )  # fmt: skip
                reference = gated_lora_ref(y.clone(), x, a_list, b_list, gated, 1.0, QKV)
                actual = gated_lora_triton(y.clone(), x, a_list, b_list, gated, 1.0, QKV)
                ungated = torch.ones(y.shape[0], dtype=torch.bool, device=DEVICE)
                ungated[gated] = False
                if not torch.equal(actual[ungated], y[ungated]):
                    raise AssertionError("an ungated row changed")
                atol = 1e-4 if dtype == torch.float32 else 2e-2
                assert_close_to_gold(actual, reference, gold, atol=atol, name="y")
                rows.append({"case": name, "result": "PASS", "detail": ""})
            except Exception as e:
                rows.append(
                    {"case": name, "result": "FAIL", "detail": f"{type(e).__name__}: {e}"[:300]}
                )
            print(f"{rows[-1]['result']:>6}  {name}  {rows[-1]['detail']}", flush=True)
    return rows


def _ms(fn: Callable[[], object]) -> float:
    if DEVICE == "cpu":  # --smoke: one timed call
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    return float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"))


def copy_bandwidth() -> float:
    """Achieved device copy bandwidth in bytes/s (read + write of 1 GiB)."""
    src = torch.empty(1 << (20 if DEVICE == "cpu" else 28), dtype=torch.float32, device=DEVICE)
    dst = torch.empty_like(src)
    ms = _ms(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / (ms / 1e3)


def _isd_bytes(batch: IsdBatch, greedy: bool) -> int:
    """Bytes any implementation must move: logits read, next draft probs written (zeros when
    greedy) and, for random requests, noise and draft probs read."""
    num_rows, vocab = batch.logits.shape
    num_masks = int(batch.num_mask_tokens.sum())
    total = batch.logits.numel() * batch.logits.element_size() + num_masks * vocab * 4
    if not greedy:
        total += num_rows * vocab * 4 + batch.draft_probs.numel() * 4
    return total


def isd_timing(deadline: Deadline, bandwidth: float) -> list[dict]:
    results = []
    settings = {  # (mode, top_k, top_p)
        "greedy": ("greedy", 0, 1.0),
        "random": ("random", 0, 1.0),
        "random top-p 0.95": ("random", 0, 0.95),
        "random top-k 50 top-p 0.9": ("random", 50, 0.9),
    }
    for num_reqs in (1, 4, 16, 64):
        for label, (mode, top_k, top_p) in settings.items():
            if deadline.passed():
                break
            batch = make_isd_batch(
                num_reqs, BIG_VOCAB, K, K, mode=mode, device=DEVICE, seed=num_reqs
            )
            batch.top_k = torch.full_like(batch.top_k, top_k)
            batch.top_p = torch.full_like(batch.top_p, top_p)
            args = (*batch.args(), K)
            ref_ms = _ms(lambda args=args: isd_verify_and_draft_ref(*args))
            triton_ms = _ms(lambda args=args: isd_verify_and_draft_triton(*args))
            floor_ms = _isd_bytes(batch, mode == "greedy") / bandwidth * 1e3
            results.append(_timing_row("isd_verify_and_draft", f"V={BIG_VOCAB} B={num_reqs} {label}",
                                       ref_ms, triton_ms, floor_ms))  # fmt: skip
    return results


SWEEP = (  # the first is the default
    IsdTuning(),
    IsdTuning(block=4096),
    IsdTuning(block=1024),
    IsdTuning(num_pivots=8),
    IsdTuning(num_pivots=32, sub=128),
    IsdTuning(block=4096, sub=512, num_warps=16),
    IsdTuning(cap=0),  # thresholds always searched over the whole row
)


def isd_tuning_sweep(deadline: Deadline, bandwidth: float) -> list[dict]:
    """Top-p (the slowest path) under each launch config; outputs must equal the default's."""
    results = []
    for num_reqs in (1, 64):
        batch = make_isd_batch(num_reqs, BIG_VOCAB, K, K, mode="random", device=DEVICE, seed=3)
        batch.top_k = torch.zeros_like(batch.top_k)
        batch.top_p = torch.full_like(batch.top_p, 0.95)
        args = (*batch.args(), K)
        expected = isd_verify_and_draft_triton(*args)
        floor_ms = _isd_bytes(batch, greedy=False) / bandwidth * 1e3
        for tuning in SWEEP:
            if deadline.passed():
                return results
            try:
                step = isd_verify_and_draft_triton(*args, tuning=tuning)
                same = _steps_equal(step[:3], expected[:3])
                ms = _ms(
                    lambda args=args, tuning=tuning: isd_verify_and_draft_triton(
                        *args, tuning=tuning
                    )
                )
            except Exception as e:  # a config that does not compile is a result, not a crash
                same, ms = f"error {type(e).__name__}", float("nan")
            shape = (
                f"V={BIG_VOCAB} B={num_reqs} top-p 0.95 pivots={tuning.num_pivots} "
                f"sub={tuning.sub} warps={tuning.num_warps} block={tuning.block} cap={tuning.cap} "
                f"same={same}"
            )
            results.append(_timing_row("isd sweep", shape, float("nan"), ms, floor_ms))
    return results


def lora_timing(deadline: Deadline, bandwidth: float) -> list[dict]:
    results = []
    for sizes, label in ((QKV, "qkv"), ((HIDDEN,), "o_proj")):
        for num_reqs in (1, 4, 16, 64, 0):
            if deadline.passed():
                break
            results.append(_time_lora(num_reqs, sizes, f"{label} {sizes}", bandwidth))
    return results


def _time_lora(num_reqs: int, sizes: tuple[int, ...], label: str, bandwidth: float) -> dict:
    y, x, a_list, b_list, gated = _lora_case(num_reqs, torch.bfloat16, sizes)
    ref_ms = _ms(lambda: gated_lora_ref(y, x, a_list, b_list, gated, 1.0, sizes))
    triton_ms = _ms(lambda: gated_lora_triton(y, x, a_list, b_list, gated, 1.0, sizes))
    num_gated, out = gated.numel(), sum(sizes)
    # x rows, A and B read once; y rows read and written; all bf16
    floor_bytes = 2 * (num_gated * HIDDEN + RANK * HIDDEN * len(sizes) + out * RANK)
    floor_bytes += 2 * 2 * num_gated * out
    batch = f"B={num_reqs}" if num_reqs else "train"
    shape = f"{label} rank {RANK} bf16 {batch} G={num_gated}/{y.shape[0]} rows"
    return _timing_row("gated_lora", shape, ref_ms, triton_ms, floor_bytes / bandwidth * 1e3)


def _timing_row(op: str, shape: str, ref_ms: float, triton_ms: float, floor_ms: float) -> dict:
    row = {
        "op": op,
        "shape": shape,
        "ref_ms": round(ref_ms, 4),
        "triton_ms": round(triton_ms, 4),
        "floor_ms": round(floor_ms, 4),
        "speedup_vs_ref": round(ref_ms / triton_ms, 2),
        "floor_over_triton": round(floor_ms / triton_ms, 3),
    }
    print(" | ".join(str(v) for v in row.values()), flush=True)
    return row


def _write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "results" / "gpu")
    parser.add_argument(
        "--budget-s", type=float, default=420.0, help="stop starting new cases after this"
    )
    parser.add_argument("--skip-parity", action="store_true")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes")
    args = parser.parse_args()
    if args.smoke:
        global DEVICE, VOCABS, BATCHES, BIG_VOCAB, HIDDEN, RANK, QKV
        DEVICE, VOCABS, BATCHES, BIG_VOCAB = "cpu", (100, 300), (1, 3), 300
        HIDDEN, RANK, QKV = 64, 16, (64, 32, 32)
        torch.cuda.synchronize = lambda *a, **k: None  # do_bench is not used on CPU
    elif not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    if not args.smoke and os.environ.get("TRITON_INTERPRET", "0") not in ("0", ""):
        print("unset TRITON_INTERPRET: this script measures compiled kernels", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = Deadline(args.budget_s)
    gpu = "none (smoke)" if args.smoke else torch.cuda.get_device_name()
    env = (
        f"gpu={gpu} torch={torch.__version__} triton={triton.__version__} cuda={torch.version.cuda}"
    )
    print(env, flush=True)
    parity: list[dict] = []
    if not args.skip_parity:
        print("== parity (compiled) ==", flush=True)
        parity = isd_parity(deadline) + lora_parity(deadline)
        _write_csv(args.out / "parity.csv", parity)
    timing: list[dict] = []
    if not args.skip_timing:
        bandwidth = copy_bandwidth()
        env += f" copy_bandwidth_GBps={bandwidth / 1e9:.0f}"
        print(f"== timing (median ms; floor at {bandwidth / 1e9:.0f} GB/s copy bandwidth) ==")
        print("op | shape | ref_ms | triton_ms | floor_ms | speedup_vs_ref | floor_over_triton")
        timing = isd_timing(deadline, bandwidth) + lora_timing(deadline, bandwidth)
        timing += isd_tuning_sweep(deadline, bandwidth)
        _write_csv(args.out / "timing.csv", timing)
    (args.out / "env.txt").write_text(env + "\n")
    counts = {k: sum(r["result"].startswith(k) for r in parity) for k in ("PASS", "FAIL", "skip")}
    print(f"parity: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['skip']} skipped "
          f"(deadline) of {len(parity)}; timing rows: {len(timing)}; results in {args.out}")  # fmt: skip
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
