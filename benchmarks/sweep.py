"""Concurrency sweep: plain decoding vs ISD at fixed K, adaptive ISD and vLLM's ngram, offline.

    python benchmarks/sweep.py --models ~/.cache/vllm-idlm/demo --out results/sweep.csv
    python benchmarks/sweep.py --models ~/.cache/vllm-idlm/demo --lossless   # base + adapter

For each method one engine (max_num_seqs = the largest concurrency), all alive at once and
taking turns at each point; for each concurrency c a closed loop keeps c requests in flight
over the same held-out prompts (stdlib files never trained on), greedy and T=0.7 (unseeded,
as `vllm bench serve` sends them; `--seeded` gives each request a seed of its own, and a
seeded random request decodes plainly under the adaptive policy, so that its output does
not depend on the machine's timings or the load). Writes a CSV (method, temperature, concurrency, tok/s,
ratio to plain) and, when matplotlib is installed, a PNG next to it with tokens/s and speedup
over plain against concurrency. Tokens per forward are in `serve_sweep.py`'s CSV (one server
per method): with several engines in one process vLLM's metrics registry holds only the last
engine's.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

# vLLM's shm message queue spins (sched_yield) for 1 s after a worker's last read: the
# seconds left between two engines' runs.
QUIET_S = 1.5
ENGINE = dict(
    dtype="float32",
    max_model_len=512,
    kv_cache_memory_bytes=1 << 30,
    enforce_eager=True,  # torch.compile costs a minute per engine on CPU and gains ~2% here
    disable_log_stats=False,
    seed=0,
)


def heldout(models: Path, count: int, length: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from idlm_training.config import load_recipe
    from idlm_training.corpus import load_corpus
    from idlm_training.evaluate import make_prompts

    tokenizer = AutoTokenizer.from_pretrained(models / "base")
    _, docs = load_corpus(load_recipe("demo").corpus)
    return make_prompts(tokenizer, docs, count=count, length=length, seed=1234)


def methods(args) -> list[tuple[str, Path, dict | None]]:
    model = args.models / ("base" if args.lossless else "idlm")
    extra = {"draft_lora": str(args.models / "lora")} if args.lossless else {}
    rows: list[tuple[str, Path, dict | None]] = [("plain", args.models / "base", None)]
    for k in args.k:
        spec = {"method": "idlm", "num_speculative_tokens": k, "adaptive": False, **extra}
        rows.append((f"isd K={k}", model, spec))
    if args.adaptive:
        spec = {"method": "idlm", "num_speculative_tokens": max(args.k), "adaptive": True}
        rows.append((f"adaptive K<={max(args.k)}", model, {**spec, **extra}))
    ngram = {"method": "ngram", "num_speculative_tokens": 3}
    ngram.update(prompt_lookup_max=4, prompt_lookup_min=2)
    rows.append(("ngram K=3", args.models / "base", ngram))
    return rows


def measure(model_of: dict, prompts, args) -> list[dict]:
    """Every method at every (temperature, concurrency) point, the methods taking turns at each
    point (the order rotating from point to point), with all engines alive: a ratio to plain
    then compares runs minutes apart at most, where one engine after another (the first
    version) compared runs a quarter of an hour apart on a machine whose speed drifts."""
    from vllm import LLM, SamplingParams

    from vllm_idlm.measure import timed_generate

    engines = {}
    try:
        for name, (model, spec) in model_of.items():
            engines[name] = LLM(
                model=str(model), speculative_config=spec, max_num_seqs=max(args.c), **ENGINE
            )
            warm = SamplingParams(temperature=0.0, max_tokens=8)
            timed_generate(engines[name], prompts[:2], warm, concurrency=2)
        names, rows, turn = list(engines), [], 0
        for t in args.temperature:
            params = [
                SamplingParams(
                    temperature=t, max_tokens=args.max_tokens, seed=i if t and args.seeded else None
                )
                for i in range(len(prompts))
            ]
            for c in args.c:
                for name in names[turn % len(names) :] + names[: turn % len(names)]:
                    # vLLM's workers spin for a second after their last step: let the engine
                    # that ran before go idle, or its spinning takes a core from this one.
                    time.sleep(QUIET_S)
                    r = timed_generate(engines[name], prompts, params, concurrency=c)
                    rows.append(
                        dict(
                            method=name,
                            temperature=t,
                            concurrency=c,
                            tok_s=round(r.tokens_per_second, 1),
                        )
                    )
                    print(rows[-1], file=sys.stderr, flush=True)
                turn += 1
    finally:
        for llm in engines.values():
            llm.llm_engine.engine_core.shutdown()
    order = {name: i for i, name in enumerate(model_of)}  # the table: method by method
    return sorted(rows, key=lambda r: order[r["method"]])


def plot(table: list[dict], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    temps = sorted({r["temperature"] for r in table})
    fig, axes = plt.subplots(2, len(temps), figsize=(6 * len(temps), 8), squeeze=False)
    for j, t in enumerate(temps):
        for name in dict.fromkeys(r["method"] for r in table):
            rows = [r for r in table if r["method"] == name and r["temperature"] == t]
            c = [r["concurrency"] for r in rows]
            axes[0][j].plot(c, [r["tok_s"] for r in rows], marker="o", label=name)
            axes[1][j].plot(c, [r["ratio"] for r in rows], marker="o", label=name)
        for i, label in enumerate(("output tokens/s", "speedup over plain")):
            axes[i][j].set_xscale("log", base=2)
            axes[i][j].set_xlabel("concurrency")
            axes[i][j].set_ylabel(label)
            axes[i][j].set_title(f"T={t}")
            axes[i][j].grid(True, alpha=0.3)
        axes[1][j].axhline(1.0, color="k", lw=0.8)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """Methods, concurrencies, temperatures and prompts (shared with serve_sweep.py)."""
    ap.add_argument("--models", type=Path, default=Path("~/.cache/vllm-idlm/demo"))
    ap.add_argument("--lossless", action="store_true", help="base + gated adapter as the ISD")
    ap.add_argument("--k", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--no-adaptive", dest="adaptive", action="store_false")
    ap.add_argument("--c", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--temperature", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)


def report(table: list[dict], args, title: str) -> None:
    """Ratios to plain, the table on stdout, the CSV and the PNG."""
    plain = {
        (r["temperature"], r["concurrency"]): r["tok_s"] for r in table if r["method"] == "plain"
    }
    for r in table:
        r["ratio"] = round(r["tok_s"] / plain[r["temperature"], r["concurrency"]], 3)
    print(f"\n{title}")
    header = "".join(f"{c:>8d}" for c in args.c)
    for t in args.temperature:
        print(f"\nT={t}: tok/s (ratio to plain) at concurrency\n{'method':18s}{header}")
        for name in dict.fromkeys(r["method"] for r in table):
            rows = [r for r in table if r["method"] == name and r["temperature"] == t]
            print(f"{name:18s}" + "".join(f"{r['tok_s']:8.0f}" for r in rows))
            print(f"{'':18s}" + "".join(f"{r['ratio']:7.2f}x" for r in rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    png = args.out.with_suffix(".png")
    print(f"\n{args.out}" + (f", {png}" if plot(table, png) else " (no matplotlib: no PNG)"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap)
    ap.add_argument("--out", type=Path, default=Path("results/sweep.csv"))
    ap.add_argument("--seeded", action="store_true", help="a seed per request at T > 0")
    args = ap.parse_args()
    args.models = args.models.expanduser()

    prompts = heldout(args.models, args.prompts, args.prompt_len)
    table = measure({name: (model, spec) for name, model, spec in methods(args)}, prompts, args)
    report(
        table,
        args,
        f"{len(prompts)} held-out prompts, {args.max_tokens} tokens, closed loop of c clients",
    )


if __name__ == "__main__":
    main()
