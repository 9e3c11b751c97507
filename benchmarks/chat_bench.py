"""The real model: plain base vs lossless ISD vs ISD (converted) vs vLLM's ngram, on chat prompts.

    python benchmarks/chat_bench.py --models ~/.cache/vllm-idlm/smollm2 [--out results/chat.csv]

Held-out instruction prompts (stdlib modules never used for training, see
training/instructions.py) under the model's chat template. One engine per method
(max_num_seqs = the largest concurrency); for each concurrency c a closed loop keeps c
requests in flight. Greedy and T=0.7 (unseeded: under the adaptive policy a seeded request
keeps K fixed). Prints tokens per forward, acceptance per position, output tokens/s and the
ratio to plain decoding of the base; for greedy, whether the output equals plain decoding
(lossless rows must say yes).
Models: `--lora DIR` (gated adapter over DIR/base), `--idlm DIR` (converted checkpoint);
by default the smollm2_lora and smollm2_convert recipes' outputs under --models. `--methods`
adds the adaptive policy over either (`lossless-adaptive`, `converted-adaptive`) or picks a subset.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

ENGINE = dict(dtype="float32", kv_cache_memory_bytes=2 << 30, disable_log_stats=False, seed=0)


def chat_prompts(model: Path, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from idlm_training.instructions import chat_prompt_ids, heldout_chat_prompts

    return chat_prompt_ids(AutoTokenizer.from_pretrained(model), heldout_chat_prompts(count))


def sampling(temperature: float, count: int, max_tokens: int):
    from vllm import SamplingParams

    if temperature == 0:
        return [SamplingParams(temperature=0.0, max_tokens=max_tokens)] * count
    return [SamplingParams(temperature=temperature, max_tokens=max_tokens)] * count


def bench(model: Path, spec, prompts, runs, max_num_seqs: int) -> dict[tuple, object]:
    """{(temperature, concurrency): RunResult} for one engine."""
    from vllm import LLM

    from vllm_idlm.measure import timed_generate

    llm = LLM(model=str(model), speculative_config=spec, max_num_seqs=max_num_seqs, **ENGINE)
    try:
        timed_generate(llm, prompts[:2], runs[0][2][:2], concurrency=2)  # warm-up
        return {(t, c): timed_generate(llm, prompts, params, c) for t, c, params in runs}
    finally:
        llm.llm_engine.engine_core.shutdown()


METHODS = ("plain", "lossless", "converted", "ngram", "lossless-adaptive", "converted-adaptive")


def methods(args) -> list[tuple[str, Path, dict | None]]:
    base = args.models / "base"
    isd = {"method": "idlm", "num_speculative_tokens": args.k, "adaptive": False}
    adaptive = {**isd, "adaptive": True}
    lossless = {"draft_lora": str(args.lora)} if args.lora and args.lora.is_dir() else None
    converted = args.idlm if args.idlm and args.idlm.is_dir() else None
    ngram = {"method": "ngram", "num_speculative_tokens": 3}
    table: dict[str, tuple[str, Path, dict | None] | None] = {
        "plain": ("plain", base, None),
        "lossless": (f"lossless isd K={args.k}", base, {**isd, **lossless}) if lossless else None,
        "converted": (f"isd K={args.k} (converted)", converted, isd) if converted else None,
        "ngram": ("ngram K=3", base, {**ngram, "prompt_lookup_max": 4, "prompt_lookup_min": 2}),
        "lossless-adaptive": (f"lossless adaptive K<={args.k}", base, {**adaptive, **lossless})
        if lossless
        else None,
        "converted-adaptive": (f"adaptive K<={args.k} (converted)", converted, adaptive)
        if converted
        else None,
    }
    return [table[m] for m in args.methods if table[m] is not None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", type=Path, default=Path("~/.cache/vllm-idlm/smollm2"))
    parser.add_argument("--lora", type=Path, default=None)
    parser.add_argument("--idlm", type=Path, default=None)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--temperature", type=float, nargs="+", default=[0.0, 0.7])
    parser.add_argument("--out", type=Path, default=None, help="CSV file")
    parser.add_argument(
        "--methods", nargs="+", choices=METHODS, default=["plain", "lossless", "converted", "ngram"]
    )
    args = parser.parse_args()
    args.models = args.models.expanduser()
    args.lora = args.lora or args.models / "smollm2_lora" / "lora"
    args.idlm = args.idlm or args.models / "smollm2_convert" / "idlm"

    prompts = chat_prompts(args.models / "base", args.prompts)
    runs = [
        (t, c, sampling(t, len(prompts), args.max_tokens))
        for t in args.temperature
        for c in args.concurrency
    ]
    table, outputs = [], {}
    for name, model, spec in methods(args):
        results = bench(model, spec, prompts, runs, max(args.concurrency))
        for (t, c), r in results.items():
            m = r.metrics
            is_isd = bool(spec) and spec["method"] == "idlm"
            outputs[name, t, c] = r.outputs
            table.append(
                dict(
                    method=name,
                    temperature=t,
                    concurrency=c,
                    tok_s=round(r.tokens_per_second, 2),
                    tpf=round(m.tokens_per_forward, 3) if m.num_rounds else 1.0,
                    accept_per_pos=" ".join(f"{a:.2f}" for a in m.acceptance_per_position)
                    if is_isd
                    else "-",
                    tokens=r.num_tokens,
                )
            )
            print(table[-1], file=sys.stderr, flush=True)
    plain = {(r["temperature"], r["concurrency"]): r for r in table if r["method"] == "plain"}
    print(
        f"\n{len(prompts)} held-out chat prompts, up to {args.max_tokens} tokens each\n"
        f"{'method':26s} {'T':>4s} {'conc':>4s} {'tok/fwd':>8s} {'accept/pos':>16s} "
        f"{'tok/s':>8s} {'vs plain':>8s} {'=plain?':>7s}"
    )
    for r in table:
        ref = plain[r["temperature"], r["concurrency"]]
        r["ratio"] = round(r["tok_s"] / ref["tok_s"], 3)
        same = "-"
        if r["temperature"] == 0:
            key = (r["temperature"], r["concurrency"])
            same = outputs[(r["method"], *key)] == outputs[("plain", *key)]
            r["same_as_plain"] = same
            same = "yes" if same else "no"
        print(
            f"{r['method']:26s} {r['temperature']:4.1f} {r['concurrency']:4d} {r['tpf']:8.2f} "
            f"{r['accept_per_pos']:>16s} {r['tok_s']:8.1f} {r['ratio']:7.2f}x {same:>7s}"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        fields = list(dict.fromkeys(k for r in table for k in r))
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(table)


if __name__ == "__main__":
    main()
