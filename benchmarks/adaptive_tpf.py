"""What the adaptive policy chooses, without the clock: tokens per forward under a pinned cost.

    python benchmarks/adaptive_tpf.py --c 1 --cost '{"step_ms": 10.5, "row_ms": 0.1,
        "draft_path_ms": 1.6}' --methods K=2 K=3 adaptive 'adaptive{"ema": 0.05}'

With the step cost pinned the policy's choices no longer follow the machine's timings, so a
greedy run is deterministic: the same prompts give the same strides and the same tokens per
forward on every run and every machine, and two policy settings compare exactly (where
`adaptive_check.py`'s tok/s ratios move 10-30% from run to run on this 2-core machine). It
prints, per method, tokens per request-step (one request in one forward); what those steps
would cost under the pinned model, from the rows they carried (tok/s at the pinned cost: the
policy's own objective, not this machine's clock); and, for adaptive, the strides chosen
(request-steps) and the verdicts seen per draft position. `adaptive{...}` adds settings to
the pinned cost (`ema`, `relax`, `min_dwell`, `probe_every`, ...).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from adaptive_check import parse_method
from sweep import ENGINE, heldout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=Path("~/.cache/vllm-idlm/demo"))
    ap.add_argument("--c", type=int, default=1, help="requests decoded at once")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-k", type=int, default=3, help="adaptive's largest stride")
    ap.add_argument("--cost", type=json.loads, required=True, help="the pinned step cost")
    ap.add_argument("--methods", nargs="+", default=["K=3", "adaptive"])
    args = ap.parse_args()
    models = args.models.expanduser()

    from vllm import LLM, SamplingParams

    prompts = heldout(models, args.prompts, 64)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    for name in args.methods:
        spec = parse_method(name)
        if spec is None or name == "zero-draft":
            raise SystemExit(f"adaptive_tpf: {name!r} is not a stride method (K=<k>, adaptive)")
        if spec["adaptive"] is not False:  # adaptive: its settings on top of the pinned cost
            extra = spec["adaptive"] if isinstance(spec["adaptive"], dict) else {}
            spec["adaptive"] = {**args.cost, **extra}
        spec.setdefault("num_speculative_tokens", args.max_k)
        llm = LLM(
            model=str(models / "idlm"), speculative_config=spec, max_num_seqs=args.c, **ENGINE
        )
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        (state,) = llm.collective_rpc("idlm_state")
        chosen = state.get("strides_chosen")
        # A fixed K gives every decode step of a request MASK rows (ISD's own counter); the
        # policy counts every request-step it chose for, plain ones included.
        steps = sum(chosen.values()) if chosen else state["num_steps"]
        line = f"{name:28s} c={args.c:3d}  {tokens / steps:.3f} tokens per request-step"
        # What those steps cost under the pinned model: the policy's own objective.
        carried = state["decode_rows"]
        ms = (
            args.cost["step_ms"] * carried["steps"]
            + args.cost["row_ms"] * carried["rows"]
            + args.cost.get("draft_path_ms", 0.0) * carried["spec_steps"]
            + args.cost.get("draft_request_ms", 0.0) * carried["draft_requests"]
        )
        line += f"  {1000 * tokens / ms:.1f} tok/s at the pinned cost"
        if chosen:
            seen = state["observed_positions"]
            line += f"  strides {chosen}  verdicts per position {seen}"
            line += (
                f"  probes {state['probes']}  spec steps {carried['spec_steps']}/{carried['steps']}"
            )
        print(line, flush=True)
        llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main()
