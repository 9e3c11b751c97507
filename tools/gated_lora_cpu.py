"""What the gated adapter costs a step on the CPU path: the reference, pre-packed weights, runs.

    python benchmarks/gated_lora_cpu.py            # SmolLM2-135M's shapes, rank 32
    python benchmarks/gated_lora_cpu.py --requests 1 2 4 8 --rows 1 3 --base
    python benchmarks/gated_lora_cpu.py --rank 8 --layers 28 --hidden 1024 --intermediate 3072

Every projection of every layer (qkv, o, gate_up, down; packed slices as vLLM packs them) gets
its LoRA delta on the MASK rows of `--requests` requests with `--rows` MASK rows each (each
request's span: its clean rows, then its MASK rows), as one forward of a decode step does;
prints the least time of `--repeats` passes over all layers, for `gated_lora_ref` (per slice:
two matmuls, scale, index_add_), `gated_lora_packed` (one gather, one shrink matmul per layer,
one expand per slice, one index_add_) and `gated_lora_runs` (per request one shrink matmul on a
view, per slice one addmm_ into the output's view), taken in turns. `--base` runs each layer's
base matmul (fp32 weights of the model's size) before its delta, untimed, as a real forward
does: the base weights stream through the caches between the adapter's calls, which is what a
serving step pays (the adapter's own weights then come from memory).
"""

from __future__ import annotations

import argparse
import time

import torch

from idlm_kernels.gated_lora import (
    gated_lora_packed,
    gated_lora_ref,
    gated_lora_runs,
    pack_lora,
    row_runs,
)


def make_layers(args, gen: torch.Generator) -> list[tuple]:
    h, i, kv, r = args.hidden, args.intermediate, args.kv, args.rank
    # (fan_in, output slices) of qkv_proj, o_proj, gate_up_proj, down_proj
    shapes = [(h, [h, kv, kv]), (h, [h]), (h, [i, i]), (i, [h])]
    layers = []
    for _ in range(args.layers):
        for fan_in, sizes in shapes:
            a = [torch.randn(r, fan_in, generator=gen) / fan_in**0.5 for _ in sizes]
            b = [torch.randn(s, r, generator=gen) / r**0.5 for s in sizes]
            base = torch.randn(fan_in, sum(sizes), generator=gen) if args.base else None
            layers.append((fan_in, sizes, a, b, pack_lora(a, b, 2.0, sizes), base))
    return layers


def timed_pass(layers, x, y, step) -> float:
    """Seconds spent in `step` over all layers (each layer's base matmul before it, untimed)."""
    spent = 0.0
    for layer in layers:
        fan_in, sizes, base = layer[0], layer[1], layer[5]
        if base is not None:
            x[fan_in] @ base
        start = time.perf_counter()
        step(layer, x[fan_in], y[sum(sizes)])
        spent += time.perf_counter() - start
    return spent


def step_functions(rows: torch.Tensor, runs: list[tuple[int, int]]) -> dict:
    """One layer's delta by each path, on the same gated rows."""
    return {
        "reference": lambda ly, x, y: gated_lora_ref(y, x, ly[2], ly[3], rows, 2.0, ly[1]),
        "packed": lambda ly, x, y: gated_lora_packed(y, x, ly[4], rows),
        "runs": lambda ly, x, y: gated_lora_runs(y, x, ly[4], runs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--intermediate", type=int, default=1536)
    ap.add_argument("--kv", type=int, default=192, help="k and v projection width")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 3, 16], help="MASK rows per request")
    ap.add_argument("--requests", type=int, nargs="+", default=[1], help="requests that draft")
    ap.add_argument("--base", action="store_true", help="stream base weights between the calls")
    ap.add_argument("--repeats", type=int, default=40)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    layers = make_layers(args, gen)
    for n in args.requests:
        for m in args.rows:
            span = 2 * m + 1  # last token, m drafts, m MASK rows (ISD at k = m)
            rows = torch.tensor([q * span + m + 1 + j for q in range(n) for j in range(m)])
            runs = row_runs(rows.tolist())
            tokens = n * span
            x = {d: torch.randn(tokens, d, generator=gen) for d in (args.hidden, args.intermediate)}
            y = {s: torch.randn(tokens, s, generator=gen) for s in {sum(ly[1]) for ly in layers}}
            steps = step_functions(rows, runs)
            for step in steps.values():  # warm-up
                timed_pass(layers, x, y, step)
            best = dict.fromkeys(steps, float("inf"))
            for _ in range(args.repeats):
                for name, step in steps.items():
                    best[name] = min(best[name], timed_pass(layers, x, y, step))
            print(
                f"{n:3d} requests x {m:2d} MASK rows: "
                + ", ".join(f"{name} {t * 1e3:6.2f} ms" for name, t in best.items())
                + f" per forward ({args.layers} layers{', base streamed' if args.base else ''})",
                flush=True,
            )


if __name__ == "__main__":
    main()
