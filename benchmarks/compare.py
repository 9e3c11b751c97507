"""Methods side by side on one model: tokens per second, tokens per forward, acceptance.

    python benchmarks/compare.py --workload demo --methods plain isd K=3 ngram --c 1 4 16 64
    python benchmarks/compare.py --models ~/.cache/vllm-idlm/smollm2 \\
        --lora ~/.cache/vllm-idlm/smollm2/smollm2_demo_lora/lora --workload code \\
        --methods plain isd mask ngram --c 1 4 16 --temperature 0 0.7 --rounds 6

Every method is an engine of its own (`common.Engine`), all up at once, taking turns round
after round at each point (temperature, concurrency c; a closed loop keeps c requests in
flight). Per method: output tokens/s, its ratio to plain decoding with the least and largest of
the rounds' own ratios, tokens per forward (tokens over the forwards the requests took:
clock-free, comparable across methods), ISD's acceptance per position and per draft source
(lookup / MASK rows), and, greedy, whether its tokens are plain decoding's. Methods
(`common.parse_method`): plain, isd (the default: adaptive stride, lookup on), mask (no lookup),
K=<k>, K=<k>-mask, idlm{...}, ngram, suffix; `name@2` runs a second engine of a method (the A/A
spread), `name@old=DIR` imports the plugin from another checkout. Workloads: `demo` (held-out
stdlib source, for the tiny demo models), and for the real model's chat template `chat`
(prose, no code), `code` (writing code) and `edit` (rewriting a function shown).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    DEMO_DIR,
    WORKLOADS,
    Engine,
    interleave,
    parse_method,
    prompts_for,
    ratio_range,
    write_table,
)


def rounds_of(prompts: list, params_for, size: int, rounds: int) -> list[tuple[list, list]]:
    """`rounds` batches of `size` prompts, taken in turn from the pool (wrapping around)."""
    batches = []
    for r in range(rounds):
        picked = [prompts[(r * size + i) % len(prompts)] for i in range(size)]
        batches.append((picked, [params_for(i) for i in range(size)]))
    return batches


def row(name: str, t: float, c: int, tally, plain) -> dict:
    m = tally.metrics
    tpf = sum(tally.tokens) / tally.forwards if tally.forwards else None
    out = dict(
        method=name,
        temperature=t,
        concurrency=c,
        tok_s=round(tally.rate, 2),
        tpf=round(tpf, 3) if tpf else "",
        requests=tally.requests,
    )
    if plain is not None:
        ratio, low, high = ratio_range(tally, plain)
        out.update(
            vs_plain=round(ratio, 3), vs_plain_min=round(low, 3), vs_plain_max=round(high, 3)
        )
        if t == 0:
            out["equals_plain"] = tally.outputs == plain.outputs
    if m is not None and m.num_rounds and m.drafted_per_position:
        pairs = zip(m.acceptance_rate_per_position, m.drafted_per_position, strict=True)
        rates = [r for r, d in pairs if d]
        out["accept_per_pos"] = " ".join(f"{a:.2f}" for a in rates)
        out["lookup_drafts"] = m.lookup_draft_tokens
        out["lookup_accept"] = round(m.lookup_acceptance, 3)
        out["mask_drafts"] = m.mask_draft_tokens
        out["mask_accept"] = round(m.mask_acceptance, 3)
    return out


def policy_line(name: str, before: dict | None, after: dict | None) -> str | None:
    """What a stride policy chose over a point (request-steps by K) and its step times'
    corrections (real minus measured, per band of batch sizes and K), from idlm_state."""
    if not after or "step_times" not in after:
        return None
    old = (before or {}).get("ks_chosen", {})
    chosen = {k: n - old.get(k, 0) for k, n in after["ks_chosen"].items() if n - old.get(k, 0)}
    offsets = {k: round(v, 2) for k, v in after["step_times"]["offsets_ms"].items()}
    return f"  {name}: K chosen {chosen}, probes {after['probes']}, offsets (ms) {offsets}"


def print_point(rows: list[dict]) -> None:
    head = f"{'method':22s} {'T':>4s} {'c':>3s} {'tok/s':>8s} {'x plain':>7s} {'range':>11s} "
    head += f"{'tok/fwd':>7s} {'accept/pos':>16s} {'lookup':>13s} {'mask':>13s} {'=plain':>6s}"
    print(head)
    for r in rows:
        span = f"{r['vs_plain_min']:.2f}-{r['vs_plain_max']:.2f}" if "vs_plain_min" in r else ""
        lookup = f"{r['lookup_drafts']}@{r['lookup_accept']:.2f}" if "lookup_drafts" in r else ""
        mask = f"{r['mask_drafts']}@{r['mask_accept']:.2f}" if "mask_drafts" in r else ""
        same = {True: "yes", False: "NO"}.get(r.get("equals_plain"), "")
        tpf = f"{r['tpf']:.2f}" if r["tpf"] else ""
        print(
            f"{r['method']:22s} {r['temperature']:4.1f} {r['concurrency']:3d} "
            f"{r['tok_s']:8.1f} {r.get('vs_plain', 0):7.2f} {span:>11s} {tpf:>7s} "
            f"{r.get('accept_per_pos', ''):>16s} {lookup:>13s} {mask:>13s} {same:>6s}",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=DEMO_DIR, help="DIR/base (and DIR/idlm)")
    ap.add_argument("--lora", type=Path, default=None, help="lossless ISD: DIR/base + adapter")
    ap.add_argument("--idlm", type=Path, default=None, help="ISD on this converted checkpoint")
    ap.add_argument("--workload", choices=WORKLOADS, default="demo")
    ap.add_argument("--methods", nargs="+", default=["plain", "isd", "mask", "ngram"])
    ap.add_argument("--c", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--temperature", type=float, nargs="+", default=[0.0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=None, help="per round (default max(8, 4c))")
    ap.add_argument("--pool", type=int, default=64, help="distinct prompts to draw rounds from")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-k", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="CSV of every row (and a PNG)")
    args = ap.parse_args()
    models = args.models.expanduser()
    lora = args.lora.expanduser() if args.lora else None

    from vllm import SamplingParams

    methods = [parse_method(m, models, lora, args.max_k) for m in args.methods]
    if args.idlm:
        from dataclasses import replace

        methods = [
            replace(m, model=args.idlm.expanduser()) if m.spec and m.spec["method"] == "idlm" else m
            for m in methods
        ]
    prompts = prompts_for(args.workload, models, args.pool)
    ignore_eos = args.workload == "demo"  # the tiny models' text has no end; chat answers do
    engines = {}
    table = []
    try:
        for method in methods:
            engine = engines[method.name] = Engine(method, max(args.c))
            state = engine.state or {}
            policy = sorted(k for k in ("step_times", "step_cost") if k in state)  # new / old
            print(f"  {method.name}: up {policy}", file=sys.stderr, flush=True)
        for t in args.temperature:

            def params_for(i: int, t=t):
                return SamplingParams(
                    temperature=t, max_tokens=args.max_tokens, ignore_eos=ignore_eos
                )

            warm = rounds_of(prompts, params_for, 2, 1)
            interleave(engines, warm, 2)  # first-request compilation, untimed
            for c in args.c:
                size = args.prompts or max(8, 4 * c)
                states = {name: engine.state for name, engine in engines.items()}
                tallies = interleave(engines, rounds_of(prompts, params_for, size, args.rounds), c)
                for name, engine in engines.items():
                    line = policy_line(name, states[name], engine.state)
                    if line:
                        print(line, flush=True)
                plain = tallies.get("plain")
                rows = [row(name, t, c, tally, plain) for name, tally in tallies.items()]
                print_point(rows)
                table += rows
    finally:
        for engine in engines.values():
            engine.close()
    if args.out:
        write_table(table, args.out)
        print(f"wrote {args.out} (and a PNG beside it)", file=sys.stderr)


if __name__ == "__main__":
    main()
