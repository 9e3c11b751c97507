"""What the gated adapter costs a step on the CPU path: the reference against pre-packed weights.

    python benchmarks/gated_lora_cpu.py            # SmolLM2-135M's shapes, rank 32
    python benchmarks/gated_lora_cpu.py --rank 8 --layers 28 --hidden 1024 --intermediate 3072

Every projection of every layer (qkv, o, gate_up, down; packed slices as vLLM packs them) gets
its LoRA delta on `m` MASK rows, as one forward of a decode step does; prints the least time of
`--repeats` passes over all layers, for `gated_lora_ref` (per slice: two matmuls, scale,
index_add_) and `gated_lora_packed` (one shrink matmul per layer, one expand per slice, one
index_add_), taken in turns.
"""

from __future__ import annotations

import argparse
import time

import torch

from idlm_kernels.gated_lora import gated_lora_packed, gated_lora_ref, pack_lora


def reference_pass(layers, x, y, rows) -> None:
    for fan_in, sizes, a, b, _ in layers:
        gated_lora_ref(y[sum(sizes)], x[fan_in], a, b, rows, 2.0, sizes)


def packed_pass(layers, x, y, rows) -> None:
    for fan_in, sizes, _, _, packed in layers:
        gated_lora_packed(y[sum(sizes)], x[fan_in], packed, rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--intermediate", type=int, default=1536)
    ap.add_argument("--kv", type=int, default=192, help="k and v projection width")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 3, 16], help="MASK rows")
    ap.add_argument("--repeats", type=int, default=40)
    args = ap.parse_args()
    h, i, kv, r = args.hidden, args.intermediate, args.kv, args.rank
    gen = torch.Generator().manual_seed(0)
    # (fan_in, output slices) of qkv_proj, o_proj, gate_up_proj, down_proj
    shapes = [(h, [h, kv, kv]), (h, [h]), (h, [i, i]), (i, [h])]
    layers = []
    for _ in range(args.layers):
        for fan_in, sizes in shapes:
            a = [torch.randn(r, fan_in, generator=gen) / fan_in**0.5 for _ in sizes]
            b = [torch.randn(s, r, generator=gen) / r**0.5 for s in sizes]
            layers.append((fan_in, sizes, a, b, pack_lora(a, b, 2.0, sizes)))
    for m in args.rows:
        tokens = m + 1  # the MASK rows after one clean row
        rows = torch.arange(1, tokens)
        x = {n: torch.randn(tokens, n, generator=gen) for n in (h, i)}
        y = {s: torch.randn(tokens, s, generator=gen) for s in {sum(sz) for _, sz, *_ in layers}}
        passes = (("ref", reference_pass), ("packed", packed_pass))
        for _, fn in passes:  # warm-up
            fn(layers, x, y, rows)
        best = {"ref": float("inf"), "packed": float("inf")}
        for _ in range(args.repeats):
            for name, fn in passes:
                start = time.perf_counter()
                fn(layers, x, y, rows)
                best[name] = min(best[name], time.perf_counter() - start)
        print(
            f"{m:3d} MASK rows: reference {best['ref'] * 1e3:6.2f} ms, "
            f"packed {best['packed'] * 1e3:6.2f} ms per forward ({args.layers} layers)",
            flush=True,
        )


if __name__ == "__main__":
    main()
