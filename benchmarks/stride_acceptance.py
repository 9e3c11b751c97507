"""How often drafts pass, position by position, at each fixed stride: does acceptance depend
on how many drafts a step carries?

    python benchmarks/stride_acceptance.py --models ~/.cache/vllm-idlm/demo --k 1 2 3 --c 1

One fixed-K engine per K, one after another, on the same held-out prompts (greedy, a closed
loop of c requests). From each engine's ISD metrics: verify rounds, warm rounds (those with
K drafts), the conditional acceptance a_j = accepted at j / accepted at j - 1 (position 1:
over the warm rounds), tokens per round as measured and as the formula of
`vllm_idlm.stride_plan` gives them from that engine's own a_j, and tok/s. The adaptive
policy keeps one estimate per request and position, pooled over the strides it drafted at:
where a_j differs between strides, that estimate misprices the strides it was not seen at
(RESULTS.md, thirty-first session).
"""

from __future__ import annotations

import argparse
import gc
from pathlib import Path

from sweep import ENGINE, heldout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=Path("~/.cache/vllm-idlm/demo"))
    ap.add_argument("--k", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--c", type=int, default=1, help="requests decoded at once")
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    models = args.models.expanduser()

    from vllm import LLM, SamplingParams

    from vllm_idlm.measure import timed_generate
    from vllm_idlm.stride_plan import cumulative, tokens_per_forward

    prompts = heldout(models, args.prompts, 32)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    print(
        "| K | verify rounds | warm rounds | conditional acceptance by position | "
        "tokens per round, measured | formula | tok/s |"
    )
    print("|---|---|---|---|---|---|---|")
    for k in args.k:
        spec = {"method": "idlm", "num_speculative_tokens": k, "adaptive": False}
        llm = LLM(
            model=str(models / "idlm"),
            speculative_config=spec,
            max_num_seqs=max(args.c, 1),
            **ENGINE,
        )
        timed_generate(llm, prompts[:4], params, concurrency=args.c)  # warm-up
        run = timed_generate(llm, prompts, params, concurrency=args.c)
        metrics = run.metrics
        warm = metrics.num_draft_tokens / k  # every warm round carries k drafts
        conditional = metrics.acceptance_per_position
        formula = tokens_per_forward(cumulative(conditional), k)
        tokens = sum(len(o) for o in run.outputs)
        print(
            f"| {k} | {metrics.num_rounds} | {warm:.0f} | "
            f"{', '.join(f'{a:.3f}' for a in conditional)} | "
            f"{metrics.tokens_per_forward:.3f} | {formula:.3f} | {tokens / run.seconds:.1f} |",
            flush=True,
        )
        del llm
        gc.collect()


if __name__ == "__main__":
    main()
