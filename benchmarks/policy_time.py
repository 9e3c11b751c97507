"""What the adaptive policy itself costs per engine step: `StridePolicy.choose` for a batch
and `observe` of the verdicts its drafts get, in a loop without vLLM.

    python benchmarks/policy_time.py --requests 1 4 16 64

For each batch size, two regimes: a step cost under which drafting pays (every request drafts
and every step brings verdicts, so the plan is priced anew each step) and one under which it
does not (the batch decodes plainly; the plan is priced anew only when the batch or the
estimates change). Verdicts are drawn with acceptance 0.7 per position from a fixed seed.
Printed: microseconds per step, the mean of `--repeats` timings of `--steps` steps (the
policy's time lands on every step of the engine, `step_parts.py` shows it as `choose`).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from vllm_idlm.adaptive import StridePolicy
from vllm_idlm.adaptive_config import AdaptiveConfig
from vllm_idlm.step_cost import StepCost

# Step costs shaped like the demo models' on this machine (ms: a, b per row, d, e, m), with
# a large or a small fixed part a: drafting pays, or it does not.
REGIMES = {"drafting": 20.0, "plain": 4.0}


def per_step(requests: int, a_ms: float, steps: int, seed: int) -> float:
    cost = StepCost(a_ms * 1e-3, 0.07e-3, 0.5e-3, e=0.1e-3, m=0.03e-3, a_start=a_ms * 1e-3)
    policy = StridePolicy(AdaptiveConfig(strides=(1, 2, 3)), cost)
    req_ids = [f"r{i}" for i in range(requests)]
    rng = random.Random(seed)
    start = time.perf_counter()
    for _ in range(steps):
        for req_id, k in zip(req_ids, policy.choose(req_ids), strict=True):
            if k:
                accepted = 0
                while accepted < k and rng.random() < 0.7:
                    accepted += 1
                policy.observe(req_id, k, accepted)
    return (time.perf_counter() - start) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    for regime, a_ms in REGIMES.items():
        for n in args.requests:
            times = [per_step(n, a_ms, args.steps, seed) for seed in range(args.repeats)]
            print(
                f"{regime:8s} requests={n:3d}  {statistics.mean(times) * 1e6:7.1f} us per step "
                f"(min {min(times) * 1e6:.1f})"
            )


if __name__ == "__main__":
    main()
