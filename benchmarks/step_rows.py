"""What one step costs against its query rows, on the engine's own dummy steps.

    python benchmarks/step_rows.py --models ~/.cache/vllm-idlm/smollm2 \
        --lora ~/.cache/vllm-idlm/smollm2/smollm2_demo_lora/lora

Starts one ISD engine (fixed K, so that the adaptive policy's calibration does not run) and,
inside its worker, times the steps the policy's cost model prices (`vllm_idlm.engine.
calibration`): a plain step of R rows (forward, logits, argmax) for R from 1 up, and, for c
requests at each stride k of `--k`, a speculative step (c (1 + 2k) rows, k MASK slots each,
the gated adapter on them in lossless mode, the ISD sampler's pass) against a plain step of c
rows and one of as many rows as the speculative step. Each figure is the least of
`--repeats`, the kinds taken in turns. Prints the table and the straight line t = a + b R
fitted over the plain steps as engine start fits it, with what that line predicts for the
speculative step's extra cost: where the line and the measurement part, the cost model
prices drafting wrongly at that batch size. The last column, the speculative step over the
plain step of as many rows, is what calibration's floors (d, e and m per MASK slot) see.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from sweep import ENGINE


def _measure(worker, rows_list, batches, strides, repeats):
    from vllm_idlm.engine.calibration import _plain_rows, _speculative_rows

    runner = worker.model_runner
    mask_id = runner.drafter.options.mask_token_id

    def timed(fn) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    plain = {
        r: min(timed(lambda r=r: _plain_rows(runner, r)) for _ in range(repeats)) for r in rows_list
    }
    speculative = {}
    for k in strides:
        for c in batches:
            base = own = spec = float("inf")
            rows = c * (1 + 2 * k)
            for _ in range(repeats):  # in turns, as `speculative_floor` does
                base = min(base, timed(lambda c=c: _plain_rows(runner, c)))
                own = min(own, timed(lambda rows=rows: _plain_rows(runner, rows)))
                spec = min(spec, timed(lambda c=c, k=k: _speculative_rows(runner, k, mask_id, c)))
            speculative[k, c] = (base, own, spec)
    return plain, speculative


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=Path("~/.cache/vllm-idlm/demo"))
    ap.add_argument("--lora", type=Path, default=None, help="lossless ISD: MODELS/base + DIR")
    ap.add_argument(
        "--k", type=int, nargs="+", default=[1], help="the strides of the speculative steps"
    )
    ap.add_argument(
        "--rows", type=int, nargs="+", default=[1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128]
    )
    ap.add_argument("--c", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    args.models = args.models.expanduser()
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # a function to the worker

    from vllm import LLM

    from vllm_idlm.step_cost import least_squares

    spec = {"method": "idlm", "num_speculative_tokens": max(args.k), "adaptive": False}
    if args.lora:
        spec["draft_lora"] = str(args.lora.expanduser())
    model = args.models / ("base" if args.lora else "idlm")
    # Every row a request of its own, as in a decode step (`_dummy_run` spreads its rows over
    # up to max_num_seqs requests).
    seqs = max(max(args.rows), max(args.c) * (1 + 2 * max(args.k)))
    llm = LLM(model=str(model), speculative_config=spec, max_num_seqs=seqs, **ENGINE)
    (result,) = llm.collective_rpc(_measure, args=(args.rows, args.c, args.k, args.repeats))
    plain, speculative = result
    rows = sorted(plain)
    a, b, _ = least_squares([(r, plain[r]) for r in rows])
    print(
        f"\nplain steps: the line fitted over them, a = {a * 1e3:.2f} ms, b = {b * 1e3:.3f} ms per row"
    )
    print("  rows   ms    line ms")
    for r in rows:
        print(f"  {r:4d} {plain[r] * 1e3:7.2f} {(a + b * r) * 1e3:7.2f}")
    print("\nc requests at stride k (1 + 2k rows each) against a plain step of c rows and one of")
    print("as many rows (all three in turns): the last column is what calibration's floors see")
    print("     k     c  plain ms  spec ms  ratio  extra ms  line's extra  own rows ms  over own")
    for (k, c), (base, own, spec_s) in sorted(speculative.items()):
        line_extra = b * c * 2 * k
        print(
            f"  {k:4d}  {c:4d} {base * 1e3:8.2f} {spec_s * 1e3:8.2f} {spec_s / base:6.2f}"
            f" {(spec_s - base) * 1e3:8.2f} {line_extra * 1e3:12.2f} {own * 1e3:11.2f}"
            f" {(spec_s - own) * 1e3:9.2f}"
        )


if __name__ == "__main__":
    main()
