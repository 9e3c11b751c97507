"""Why the adaptive engine decodes requests plainly: its stride-0 request-steps by cause, and
the step cost its plans saw.

    python benchmarks/stride_zero.py --models ~/.cache/vllm-idlm/demo --c 2 4

For each concurrency c, an in-process adaptive engine (K = --max-k) decodes held-out prompts in
a closed loop of c requests (greedy, --rounds passes over them), with `StridePolicy.choose`
wrapped. Every request-step given stride 0 is put down to one cause, the first that applies:
the step was a plain probe (`plain_probe_every`); the batch's plan was plain decoding for
every request; the plan gave this request 0; or the plan gave it a stride and the policy kept 0
(dwell or hysteresis). Changes of a request's stride from one step to the next are counted
too. On full-batch steps it also records the step cost (a, d, e), the mean position-1
estimate, and what the model predicted for stride 2 for every request against plain decoding.
It prints the 10th, 50th and 90th percentiles of each, for the steps planned plain and for
those planned drafting. Long plain runs with a high d there mean that the cost fit's d, not
the acceptance, put the batch plain.
"""

from __future__ import annotations

import argparse
import collections
import os
from pathlib import Path

from sweep import ENGINE, heldout


def percentiles(values: list[float]) -> str:
    v = sorted(values)
    return "/".join(f"{v[int(q * (len(v) - 1))]:.3f}" for q in (0.1, 0.5, 0.9))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=Path("~/.cache/vllm-idlm/demo"))
    ap.add_argument("--c", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--max-k", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    models = args.models.expanduser()

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the policy in this process
    from vllm import LLM, SamplingParams

    from vllm_idlm.adaptive import StridePolicy
    from vllm_idlm.measure import timed_generate
    from vllm_idlm.stride_plan import cumulative, rows_per_forward, tokens_per_forward

    full = {"c": 0}  # the batch size whose steps are recorded
    causes: collections.Counter = collections.Counter()
    strides: collections.Counter = collections.Counter()
    last: dict[str, int] = {}
    steps: list[tuple] = []
    choose = StridePolicy.choose

    def traced(self, req_ids):
        out = choose(self, req_ids)
        plan = self.planner.decision
        batch_plain = plan is None or not any(plan.strides)
        planned = plan.strides if plan is not None else [0] * len(req_ids)
        for req_id, k, k_plan in zip(req_ids, out, planned, strict=True):
            strides[k] += 1
            if k == 0:
                if self.probing_plain:
                    causes["plain probe"] += 1
                elif batch_plain:
                    causes["the batch's plan plain"] += 1
                elif k_plan == 0:
                    causes["the plan gave this request 0"] += 1
                else:
                    causes["kept at 0 (dwell, hysteresis)"] += 1
            if last.get(req_id, k) != k:
                causes["stride changes"] += 1
            last[req_id] = k
        n = len(req_ids)
        if n == full["c"]:
            cost, rates = self.cost, [cumulative(self.requests[r].conditional) for r in req_ids]
            tokens = sum(tokens_per_forward(r, 2) for r in rates)
            rows = sum(rows_per_forward(r, 2) for r in rates)
            stride_two = tokens / cost(rows, n, 2 * n)
            position_one = sum(self.requests[r].conditional[0] for r in req_ids) / n
            steps.append(
                (
                    not batch_plain,
                    cost.a * 1e3,
                    cost.d * 1e3,
                    cost.e * 1e3,
                    position_one,
                    stride_two / (n / cost(n, 0)),
                )
            )
        return out

    StridePolicy.choose = traced
    prompts = heldout(models, args.prompts, 32)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    spec = {"method": "idlm", "num_speculative_tokens": args.max_k, "adaptive": True}
    for c in args.c:
        llm = LLM(model=str(models / "idlm"), speculative_config=spec, max_num_seqs=c, **ENGINE)
        causes.clear()
        strides.clear()
        last.clear()
        steps.clear()
        full["c"] = c
        for _ in range(args.rounds):
            timed_generate(llm, prompts, params, concurrency=c)
        print(f"c = {c}: request-steps by stride {dict(sorted(strides.items()))}")
        print(f"  stride 0 by cause, and stride changes: {dict(causes)}")
        names = ("a ms", "d ms", "e ms", "position-1 estimate", "stride 2 / plain predicted")
        for drafting in (True, False):
            chosen = [s for s in steps if s[0] == drafting]
            if not chosen:
                continue
            parts = ", ".join(
                f"{name} {percentiles([s[i + 1] for s in chosen])}" for i, name in enumerate(names)
            )
            print(f"  {len(chosen)} full-batch steps planned {'drafting' if drafting else 'plain'}")
            print(f"    (10th/50th/90th percentiles) {parts}")
        runs, current = [], 0
        for s in steps:
            if not s[0]:
                current += 1
            elif current:
                runs.append(current)
                current = 0
        if current:
            runs.append(current)
        print(f"  plain runs: {len(runs)}, the longest {sorted(runs)[-5:]}", flush=True)
        del llm


if __name__ == "__main__":
    main()
