"""What the adaptive policy itself costs per engine step: `StridePolicy.choose` for a batch,
`observe` of the verdicts its drafts get and the step cost's online fit, in a loop without
vLLM.

    python benchmarks/policy_time.py --requests 1 4 16 64 --tolerances 0.02 0

For each batch size, two regimes: a step cost under which drafting pays (every request drafts
and every step brings verdicts) and one under which it does not (the batch decodes plainly;
its probes bring verdicts now and then, and the estimates drift back between them). Each
step's time, as the cost model predicts it within +-10%, feeds the online fit as the engine's
steps do, so the fit's coefficients move as they do in the engine. Verdicts are drawn with
acceptance 0.7 per position from a fixed seed. Printed per `replan_tolerance`: microseconds
per step, the mean of `--repeats` timings of `--steps` steps (the policy's time lands on
every step of the engine, `step_parts.py` shows it as `choose`), and the share of steps on
which the batch's plan was made anew.
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


def per_step(
    requests: int, a_ms: float, steps: int, seed: int, tolerance: float
) -> tuple[float, float]:
    """(seconds per step, share of steps whose plan was made anew)."""
    cost = StepCost(a_ms * 1e-3, 0.07e-3, 0.5e-3, e=0.1e-3, m=0.03e-3, a_start=a_ms * 1e-3)
    config = AdaptiveConfig(strides=(1, 2, 3), replan_tolerance=tolerance)
    policy = StridePolicy(config, cost)
    req_ids = [f"r{i}" for i in range(requests)]
    rng = random.Random(seed)
    planned = 0
    start = time.perf_counter()
    for _ in range(steps):
        plan = policy.planner.decision
        strides = policy.choose(req_ids)
        planned += policy.planner.decision is not plan
        for req_id, k in zip(req_ids, strides, strict=True):
            if k:
                accepted = 0
                while accepted < k and rng.random() < 0.7:
                    accepted += 1
                policy.observe(req_id, k, accepted)
        rows, masks = sum(1 + 2 * k for k in strides), sum(strides)
        drafting = sum(1 for k in strides if k)
        seconds = cost(rows, drafting, masks) * rng.uniform(0.9, 1.1)
        cost.observe(rows, drafting, seconds, masks=masks)
    return (time.perf_counter() - start) / steps, planned / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tolerances", type=float, nargs="+", default=[0.02, 0.0])
    args = ap.parse_args()
    for regime, a_ms in REGIMES.items():
        for n in args.requests:
            for tolerance in args.tolerances:
                runs = [
                    per_step(n, a_ms, args.steps, seed, tolerance) for seed in range(args.repeats)
                ]
                times = [t for t, _ in runs]
                print(
                    f"{regime:8s} requests={n:3d} replan_tolerance={tolerance:<5g} "
                    f"{statistics.mean(times) * 1e6:7.1f} us per step "
                    f"(min {min(times) * 1e6:.1f}), plan made anew on "
                    f"{statistics.mean(p for _, p in runs):.0%} of steps"
                )


if __name__ == "__main__":
    main()
