"""What real engine steps cost, against what the adaptive policy's step-cost fit believes.

    python benchmarks/step_trace.py --models ~/.cache/vllm-idlm/demo --c 4

Runs the adaptive engine in this process on held-out prompts (greedy, a closed loop of c
requests), records every step the policy's cost model is fed (decode rows, drafting requests,
MASK slots, prompt tokens, seconds) and then fits c = a + b R + [n > 0] d + e n + m M by
ordinary least squares over all decode steps of the run. Prints that fit, the median plain
and speculative step, what calibration measured at start and what the online fit held at
intervals and at the end: where the two disagree, the policy was pricing steps wrongly. The
other half of its model, per stride: the tokens per request-step it expected (at its
acceptance estimates) against those the request-steps emitted, and where the run's time went
(decode steps, steps with prompt tokens).
`--adaptive '{"plain_probe_every": 1073741824}'` runs it without plain probes. `--lora DIR`
runs lossless ISD on the real model, as `adaptive_check.py --lora` does (MODELS/base with the
gated adapter DIR, held-out chat prompts). `--dump FILE` writes the steps and what was
measured at start as JSON, so that variants of the online fit can be replayed on them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path


def least_squares(steps: list[tuple]) -> list[float] | None:
    """(a, b, d, e, m) in seconds over decode steps (rows, drafting, masks, prompt, seconds)."""
    import numpy as np

    decode = np.array([s for s in steps if s[3] == 0], dtype=float).reshape(-1, 5)
    if len(decode) < 5:
        return None
    rows, drafting, masks, _, seconds = decode.T
    x = np.stack([np.ones(len(decode)), rows, drafting > 0, drafting, masks], axis=1)
    coef, *_ = np.linalg.lstsq(x, seconds, rcond=None)
    return coef.tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=Path("~/.cache/vllm-idlm/demo"))
    ap.add_argument("--c", type=int, default=4)
    ap.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    ap.add_argument("--prompts", type=int, default=None, help="default: 12 c")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--adaptive", default="true", help="true, or a JSON object of settings")
    ap.add_argument("--lora", type=Path, default=None, help="gated adapter: lossless ISD")
    ap.add_argument("--snapshots", type=int, default=12, help="fit values printed in between")
    ap.add_argument(
        "--dump",
        type=Path,
        default=None,
        help="write the steps and the cost measured at start as JSON (to refit them offline)",
    )
    args = ap.parse_args()

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process
    from sweep import ENGINE, heldout
    from vllm import LLM, SamplingParams

    import vllm_idlm.engine.runner as runner_module
    from vllm_idlm.adaptive import StridePolicy
    from vllm_idlm.measure import timed_generate
    from vllm_idlm.stride_plan import cumulative, tokens_per_forward

    steps: list[tuple] = []
    fits: list[tuple] = []
    observe = runner_module.observe_step
    choose = StridePolicy.choose

    def observe_step(cost, step, now):
        seconds = observe(cost, step, now)
        if seconds is not None:
            steps.append((step.rows, step.drafting, step.masks, step.prompt_tokens, seconds))
            fits.append((cost.a, cost.b, cost.d, cost.e, cost.m))
        return seconds

    policies: list[StridePolicy] = []
    # What the policy expected of each request's next step (its stride, tokens per forward at
    # it) and, per stride, what those request-steps then emitted: [request-steps, expected
    # tokens, emitted tokens].
    expected: dict[str, tuple[int, float]] = {}
    by_stride: dict[int, list[float]] = {}

    def chosen(self, req_ids):
        if not policies:
            policies.append(self)
        strides = choose(self, req_ids)
        for req_id, k in zip(req_ids, strides, strict=True):
            tokens = tokens_per_forward(cumulative(self.requests[req_id].conditional), k)
            expected[req_id] = (k, tokens)
        return strides

    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    sample_tokens = GPUModelRunner.sample_tokens

    def sampled(self, *args, **kwargs):
        output = sample_tokens(self, *args, **kwargs)
        if isinstance(output, ModelRunnerOutput):
            for req_id, tokens in zip(output.req_ids, output.sampled_token_ids, strict=False):
                if req_id in expected and tokens:
                    k, tokens_expected = expected.pop(req_id)
                    row = by_stride.setdefault(k, [0, 0.0, 0.0])
                    row[0] += 1
                    row[1] += tokens_expected
                    row[2] += len(tokens)
        return output

    GPUModelRunner.sample_tokens = sampled

    runner_module.observe_step = observe_step  # measurement only: the timed values pass on
    StridePolicy.choose = chosen

    models = args.models.expanduser()
    adaptive = True if args.adaptive == "true" else json.loads(args.adaptive)
    spec = {"method": "idlm", "num_speculative_tokens": args.k, "adaptive": adaptive}
    count = args.prompts or 12 * args.c
    if args.lora:
        from chat_bench import chat_prompts

        spec["draft_lora"] = str(args.lora.expanduser())
        model = models / "base"
        prompts = chat_prompts(model, count)
    else:
        model = models / "idlm"
        prompts = heldout(models, count, 32)
    llm = LLM(model=str(model), max_num_seqs=args.c, speculative_config=spec, **ENGINE)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    run = timed_generate(llm, prompts, params, concurrency=args.c)
    tokens = sum(map(len, run.outputs))
    print(
        f"\n{tokens} tokens in {run.seconds:.2f} s: {tokens / run.seconds:.1f} tok/s, c = {args.c}"
    )

    def ms(values) -> str:
        return " ".join(f"{name}={v * 1e3:.3f}" for name, v in zip("abdem", values, strict=True))

    decode_s = sum(s[4] for s in steps if s[3] == 0)
    prefill_s = sum(s[4] for s in steps if s[3])
    print(
        f"steps timed: {decode_s:.2f} s in {sum(1 for s in steps if s[3] == 0)} decode steps, "
        f"{prefill_s:.2f} s in {sum(1 for s in steps if s[3])} steps with prompt tokens, "
        f"{run.seconds - decode_s - prefill_s:.2f} s untimed"
    )
    fit = least_squares(steps)
    if fit is not None:
        print(f"real steps, least squares over the decode steps (ms): {ms(fit)}")
    decode = [s for s in steps if s[3] == 0]
    for label, group in (
        ("plain", [s for s in decode if not s[1]]),
        ("speculative", [s for s in decode if s[1]]),
    ):
        if group:
            median = statistics.median(s[4] for s in group) * 1e3
            rows = statistics.mean(s[0] for s in group)
            print(
                f"{label} decode steps: {len(group)}, median {median:.2f} ms at {rows:.1f} rows on average"
            )
    if policies:
        policy = policies[0]
        cost = policy.cost
        print(
            f"measured at start (ms): a={cost.a_start * 1e3:.3f} b={cost.b_anchor * 1e3:.3f} "
            f"d>={cost.d_min * 1e3:.3f} e>={cost.e_min * 1e3:.3f} m={cost.m * 1e3:.3f}"
        )
        every = max(1, len(fits) // max(args.snapshots, 1))
        for i in range(0, len(fits), every):
            print(f"  online fit after {i:5d} steps (ms): {ms(fits[i])}")
        print(f"online fit at the end (ms): {ms((cost.a, cost.b, cost.d, cost.e, cost.m))}")
        print(f"strides chosen (request-steps): {dict(sorted(policy.chosen.items()))}")
        for k, (n, want, got) in sorted(by_stride.items()):
            print(
                f"  stride {k}: {n} request-steps, tokens per request-step expected "
                f"{want / n:.2f}, emitted {got / n:.2f}"
            )
        print(
            f"engine-wide acceptance at the end: {[round(a, 3) for a in policy.engine_conditional]}"
        )
        print(f"probes: {policy.probed}")
        if args.dump:
            start = {
                "a": cost.a_start,
                "b": cost.b_anchor,
                "anchor_weight": cost.anchor_weight,
                "d_min": cost.d_min,
                "e_min": cost.e_min,
                "m": cost.m,
                "shape": cost.shape,
            }
            # (rows, drafting, masks, prompt tokens, seconds) per step, in order.
            args.dump.write_text(json.dumps({"start": start, "steps": steps}))
            print(f"steps and start cost written to {args.dump}")
    llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main()
