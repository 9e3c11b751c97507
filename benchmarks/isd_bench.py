"""Plain decoding vs ISD (K = 1..4) vs vLLM's ngram on the same prompts, in one process.

    python benchmarks/isd_bench.py --models ~/.cache/vllm-idlm/demo [--out results/bench.csv]

For each method one engine (max_num_seqs = 16) runs the held-out prompts at
concurrency 1 (one request at a time) and 16 (all submitted at once), greedy. Prints
tokens per forward (from vLLM's spec-decode metrics), per-position acceptance, output
tokens/s and the ratio to plain decoding; the gated adapter's per-forward overhead
comes from `--lossless`.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

ENGINE = dict(
    dtype="float32",
    kv_cache_memory_bytes=1 << 30,
    disable_log_stats=False,
    seed=0,
    max_num_seqs=16,
)


def load_prompts(model_dir: Path, count: int, length: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from idlm_training.config import load_recipe
    from idlm_training.corpus import load_corpus
    from idlm_training.evaluate import make_prompts

    _, heldout = load_corpus(load_recipe(os.environ.get("IDLM_DEMO_PRESET", "demo")).corpus)
    return make_prompts(AutoTokenizer.from_pretrained(model_dir), heldout, count, length, seed=11)


def bench(model: Path, spec, prompts, params, concurrencies, **engine) -> dict[int, object]:
    from vllm import LLM

    from vllm_idlm.measure import timed_generate

    llm = LLM(model=str(model), speculative_config=spec, **{**ENGINE, **engine})
    try:
        timed_generate(llm, prompts[:4], params)  # warm-up
        return {c: timed_generate(llm, prompts, params, concurrency=c) for c in concurrencies}
    finally:
        llm.llm_engine.engine_core.shutdown()


def methods(args) -> list[tuple[str, str, Path, dict | None, dict]]:
    """(name, name of the plain row it is compared with, model, speculative config, engine)."""
    idlm, base, lora = (args.models / n for n in ("idlm", "base", "lora"))

    def isd(k, **extra):
        return {"method": "idlm", "num_speculative_tokens": k, "adaptive": False, **extra}

    rows = [("plain", "plain", idlm, None, {})]
    rows += [(f"isd K={k}", "plain", idlm, isd(k), {}) for k in args.k]
    ngram = {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    }
    rows.append(("ngram K=3", "plain", idlm, ngram, {}))
    if args.lossless:
        eager = {"enforce_eager": True}
        rows.append(("plain base eager", "plain base eager", base, None, eager))
        rows.append(("isd K=3 eager", "plain base eager", idlm, isd(3), eager))
        rows.append(
            ("lossless isd K=3", "plain base eager", base, isd(3, draft_lora=str(lora)), {})
        )
    return rows


def main() -> None:
    from vllm import SamplingParams

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", type=Path, default=Path("~/.cache/vllm-idlm/demo").expanduser())
    parser.add_argument("--k", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--lossless", action="store_true", help="also base / gated-adapter rows")
    parser.add_argument("--out", type=Path, default=None, help="CSV file")
    args = parser.parse_args()
    prompts = load_prompts(args.models / "idlm", args.prompts, 32)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    table = []
    for name, ref, model, spec, engine in methods(args):
        for conc, r in bench(model, spec, prompts, params, args.concurrency, **engine).items():
            m = r.metrics
            is_isd = bool(spec) and spec["method"] == "idlm"
            table.append(
                dict(
                    method=name,
                    ref=ref,
                    concurrency=conc,
                    tok_s=round(r.tokens_per_second, 1),
                    tpf=round(m.tokens_per_forward, 3) if m.num_rounds else 1.0,
                    # Per-position acceptance and the cold-start share assume K drafts per
                    # verify round: true for ISD, not for ngram's variable-length drafts.
                    accept_per_pos=" ".join(f"{a:.2f}" for a in m.acceptance_per_position)
                    if is_isd
                    else "-",
                    cold_start_share=round(m.cold_start_share, 3) if is_isd else "-",
                )
            )
            print(table[-1], file=sys.stderr, flush=True)
    plain = {(r["method"], r["concurrency"]): r["tok_s"] for r in table if r["method"] == r["ref"]}
    print(
        f"\n{'method':20s} {'conc':>4s} {'tok/fwd':>8s} {'accept/pos':>24s} {'cold':>5s} "
        f"{'tok/s':>8s} {'vs plain':>8s} {'of ideal':>8s} {'ms/step':>8s}"
    )
    for r in table:
        r["ratio"] = round(r["tok_s"] / plain[r["ref"], r["concurrency"]], 3)
        r["of_ideal"] = round(r["ratio"] / r["tpf"], 3)
        # Mean time of one engine step (forward + sampling + scheduling); at concurrency c
        # a step serves up to c requests, so this is approximate for c > 1 (batch tails).
        r["ms_per_step"] = round(1000 * r["tpf"] * r["concurrency"] / r["tok_s"], 2)
        print(
            f"{r['method']:20s} {r['concurrency']:4d} {r['tpf']:8.2f} {r['accept_per_pos']:>24s} "
            f"{r['cold_start_share']!s:>5.5} {r['tok_s']:8.1f} {r['ratio']:7.2f}x {r['of_ideal']:7.2f} "
            f"{r['ms_per_step']:8.2f}"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(table[0]))
            writer.writeheader()
            writer.writerows(table)


if __name__ == "__main__":
    main()
