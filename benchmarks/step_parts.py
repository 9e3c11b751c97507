"""Where each engine step's wall time goes, by kind of step, and what the policy predicted.

    python benchmarks/step_parts.py --models ~/.cache/vllm-idlm/demo --c 16 --methods zero 1 3 adaptive

For each method (`plain` and `plain-sync`: the same checkpoint without speculation, with and
without vLLM's async scheduling; `zero`: the
ISD engine with a step cost under which nothing drafts; `K`: fixed
K; `adaptive`, or `adaptive{...}` with settings as in adaptive_check.py) an in-process engine
decodes held-out prompts in a closed loop of c requests (greedy, equal lengths). Every
`LLMEngine.step` is timed with its parts (forward, input preparation, logits, sampling,
scheduling, output processing, the policy's choice), its rows and the tokens it emitted.
Printed per method: the mean parts of full-batch plain and speculative decode steps; tokens
per second of plain, speculative and prefill steps; what the speculative steps cost over
making their tokens at the plain steps' rate (a share of the decode time, measured within
the run, where the machine's drift cancels); for adaptive, what the policy predicted for the
steps it planned (its plan's tokens per ms and the all-plain batch's) against what they
delivered.
Wall-clock wrappers, not cProfile (`profile_step.py`): Python-heavy parts are not inflated.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from pathlib import Path

PARTS = (
    "execute",
    "forward",
    "prepare",
    "logits",
    "sample",
    "schedule",
    "update",
    "output",
    "choose",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=Path("~/.cache/vllm-idlm/demo"))
    ap.add_argument("--c", type=int, default=16)
    ap.add_argument("--methods", nargs="+", default=["zero", "1", "adaptive"])
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process
    from adaptive_check import NEVER_DRAFTS, parse_method
    from sweep import ENGINE, heldout
    from vllm import LLM, SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_idlm.adaptive import StridePolicy
    from vllm_idlm.engine.model import IdlmForCausalLM
    from vllm_idlm.engine.scheduler import IsdScheduler
    from vllm_idlm.measure import timed_generate

    step: dict = {}  # the step being timed
    active: set[str] = set()  # the parts being timed now
    steps: list[dict] = []

    def timed(cls, name: str, part: str, note=None) -> None:
        original = getattr(cls, name)

        @functools.wraps(original)
        def wrapper(*a, **k):
            if part in active:  # a subclass's override calling this one: timed once
                return original(*a, **k)
            active.add(part)
            start = time.perf_counter()
            try:
                out = original(*a, **k)
            finally:
                active.discard(part)
                step[part] = step.get(part, 0.0) + time.perf_counter() - start
            if note is not None:
                note(a, out)
            return out

        setattr(cls, name, wrapper)

    def note_execute(a, _):
        so = a[1]
        step["rows"] = so.total_num_scheduled_tokens
        step["prompt"] = sum(len(r.prompt_token_ids or ()) for r in so.scheduled_new_reqs)

    def note_sample(_, out):
        if isinstance(out, ModelRunnerOutput):
            step["tokens"] = sum(map(len, out.sampled_token_ids))
            step["requests"] = len(out.req_ids)

    def note_plan(a, _):
        policy, req_ids = a[0], a[1]
        plan = policy.planner.decision
        if plan is not None and req_ids:
            n = len(req_ids)
            step["plan"] = plan.goodput
            step["plain_predicted"] = n / policy.cost(n, 0)
            step["plan_drafts"] = any(plan.strides)

    timed(GPUModelRunner, "execute_model", "execute", note_execute)
    timed(GPUModelRunner, "_model_forward", "forward")
    timed(GPUModelRunner, "_prepare_inputs", "prepare")
    timed(IdlmForCausalLM, "compute_logits", "logits")
    timed(GPUModelRunner, "sample_tokens", "sample", note_sample)
    for scheduler in (Scheduler, IsdScheduler):  # the plain engines' and ISD's
        timed(scheduler, "schedule", "schedule")
        timed(scheduler, "update_from_output", "update")
    timed(OutputProcessor, "process_outputs", "output")
    timed(StridePolicy, "choose", "choose", note_plan)
    engine_step = LLMEngine.step

    def whole_step(self):
        step.clear()
        start = time.perf_counter()
        out = engine_step(self)
        step["total"] = time.perf_counter() - start
        steps.append(dict(step))
        return out

    LLMEngine.step = whole_step

    models = args.models.expanduser()
    prompts = heldout(models, args.prompts, 32)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    c = args.c
    for method in args.methods:
        extra: dict = {}
        if method == "plain-sync":
            extra["async_scheduling"] = False
        elif method != "plain":
            if method == "zero":
                adaptive, k = NEVER_DRAFTS, 3
            elif method.startswith("adaptive"):
                adaptive, k = parse_method(method)["adaptive"], 3
            else:
                adaptive, k = False, int(method)
            extra["speculative_config"] = {
                "method": "idlm",
                "num_speculative_tokens": k,
                "adaptive": adaptive,
            }
        llm = LLM(model=str(models / "idlm"), max_num_seqs=c, **extra, **ENGINE)
        timed_generate(llm, prompts[:4], params, concurrency=2)  # warm-up
        steps.clear()
        run = timed_generate(llm, prompts, params, concurrency=c)
        ran = [s for s in steps if "rows" in s]

        def kind(s: dict) -> str:
            if s["prompt"]:
                return "prefill"
            return "speculative" if s["rows"] > s.get("requests", 1 << 30) else "plain"

        full = [s for s in ran if kind(s) != "prefill" and s.get("requests") == c]
        print(f"\n{method}: {run.num_tokens / run.seconds:.1f} tok/s, c = {c}")
        for label in ("plain", "speculative"):
            group = [s for s in full if kind(s) == label]
            if not group:
                continue
            parts = " ".join(
                f"{p}={statistics.mean(s.get(p, 0.0) for s in group) * 1e3:.2f}"
                for p in ("total", *PARTS)
            )
            rows = statistics.mean(s["rows"] for s in group)
            tokens = statistics.mean(s.get("tokens", 0) for s in group)
            print(f"  full-batch {label} steps: {len(group)}, {rows:.1f} rows, {tokens:.1f} tokens")
            print(f"    their mean parts (ms): {parts}")
        for label in ("plain", "speculative", "prefill"):
            group = [s for s in ran if kind(s) == label]
            if group:
                seconds = sum(s["total"] for s in group)
                tokens = sum(s.get("tokens", 0) for s in group)
                print(
                    f"  {label:11s} steps {len(group):4d}: {seconds:.2f} s, {tokens} tokens, "
                    f"{tokens / seconds:.1f} tok/s, {seconds / len(group) * 1e3:.2f} ms each"
                )
        # Within the run (the machine's drift cancels): what the speculative steps cost over
        # making their tokens at the plain steps' rate, as a share of the decode steps' time.
        plain = [s for s in ran if kind(s) == "plain"]
        spec = [s for s in ran if kind(s) == "speculative"]
        if plain and spec:
            rate = sum(s.get("tokens", 0) for s in plain) / sum(s["total"] for s in plain)
            spec_s = sum(s["total"] for s in spec)
            over = spec_s - sum(s.get("tokens", 0) for s in spec) / rate
            decode_s = spec_s + sum(s["total"] for s in plain)
            print(f"  speculative steps over the plain steps' rate: {100 * over / decode_s:+.1f}%")
        planned = [s for s in full if "plan" in s] if method.startswith("adaptive") else []
        for label, drafts in (("drafting", True), ("plain", False)):
            group = [s for s in planned if s["plan_drafts"] == drafts]
            if group:
                got = sum(s.get("tokens", 0) for s in group) / sum(s["total"] for s in group)
                plan = statistics.mean(s["plan"] for s in group)
                plain = statistics.mean(s["plain_predicted"] for s in group)
                print(
                    f"  full-batch steps planned {label}: {len(group)}, delivered "
                    f"{got / 1e3:.3f} tokens per ms; predicted: the plan {plan / 1e3:.3f}, "
                    f"all plain {plain / 1e3:.3f}"
                )
        llm.llm_engine.engine_core.shutdown()
        del llm


if __name__ == "__main__":
    main()
