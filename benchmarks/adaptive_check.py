"""A quick side-by-side check of the adaptive policy: plain, ISD K=1 and adaptive K<=4.

    python benchmarks/adaptive_check.py --models ~/.cache/vllm-idlm/demo --c 1 8 64

One engine per method (demo I-DLM; plain = the same checkpoint without speculation), greedy;
at each c the held-out prompts go c at a time (batches, not a closed loop: quicker, and
enough to compare the methods in one run). Prints tok/s, the ratio to plain, tokens per
forward, and for adaptive what the policy believes (step cost, acceptance, strides chosen;
counters accumulate over the concurrencies). `sweep.py` is the full benchmark.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from sweep import ENGINE, heldout


def run(llm, prompts, c: int, max_tokens: int) -> float:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    batches = [prompts[i : i + c] for i in range(0, len(prompts), c)]

    def generate(batch) -> int:
        outputs = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in batch], params, use_tqdm=False
        )
        return sum(len(o.outputs[0].token_ids) for o in outputs)

    generate(batches[0])  # warm-up
    start, tokens = time.perf_counter(), 0
    for batch in batches:
        tokens += generate(batch)
    return tokens / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=Path("~/.cache/vllm-idlm/demo"))
    ap.add_argument("--c", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    args.models = args.models.expanduser()

    from vllm import LLM

    from vllm_idlm.metrics import read_isd_metrics

    prompts = heldout(args.models, args.prompts, 32)
    methods = {
        "plain": None,
        "ISD K=1": {"method": "idlm", "num_speculative_tokens": 1},
        "adaptive K<=4": {"method": "idlm", "num_speculative_tokens": 4, "adaptive": True},
    }
    plain: dict[int, float] = {}
    for name, spec in methods.items():
        llm = LLM(
            model=str(args.models / "idlm"),
            max_num_seqs=max(args.c),
            speculative_config=spec,
            **ENGINE,
        )
        for c in args.c:
            rate = run(llm, prompts, c, args.max_tokens)
            plain.setdefault(c, rate)
            line = f"{name:14s} c={c:3d} {rate:8.1f} tok/s {rate / plain[c]:5.2f}x"
            if spec is not None:
                line += f"  TPF {read_isd_metrics(llm.get_metrics()).tokens_per_forward:.2f}"
            print(line, flush=True)
        if spec is not None and spec.get("adaptive"):
            (state,) = llm.collective_rpc("idlm_state")
            print(f"  policy: {state['step_cost']}, acceptance {state['engine_acceptance']}")
            print(f"  strides chosen (request-steps): {state['strides_chosen']}")
        llm.llm_engine.engine_core.shutdown()
        del llm


if __name__ == "__main__":
    main()
