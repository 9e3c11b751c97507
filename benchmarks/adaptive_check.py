"""A side-by-side check of the adaptive policy against plain decoding and fixed K.

    python benchmarks/adaptive_check.py --models ~/.cache/vllm-idlm/demo --c 1 8 64

Every engine is started first and kept alive (one per method: plain = the same I-DLM checkpoint
without speculation, ISD at each fixed K, adaptive), then at each concurrency c the methods
take turns, round after round, each round in a rotated order, on the same held-out prompts
(greedy, a closed loop of c requests). Interleaving puts every method under the same machine
load, so the ratios hold on a busy machine where back-to-back runs drift. Prints tok/s, the
ratio to plain (and the least and largest of the rounds' own ratios), to the best fixed K,
ISD's tokens per round (forward with draft slots), and, for each adaptive engine
(`adaptive`, `adaptive{...}` with settings), what its policy believes (step cost as measured
at start and fitted, acceptance, strides chosen). Engines start 1.5 s apart, so that one's
measurements at start do not share the machine with the last one's spinning workers.
Two engines of the same method differ by several points here (RESULTS.md, thirty-second
session, an A/A run): a difference between adaptive settings smaller than that needs repeats.
`--methods plain zero-draft` measures what a step costs on the ISD path when no request drafts.
`--lora DIR` runs lossless ISD instead: MODELS/base with the gated adapter DIR, on held-out chat
prompts under the base's chat template (the real model: `--models ~/.cache/vllm-idlm/smollm2
--lora ~/.cache/vllm-idlm/smollm2/smollm2_demo_lora/lora`).
`--mixed-lengths` gives each prompt its own max_tokens (the same for every method), so that no
method's requests finish in lockstep. `sweep.py` is the full benchmark (one engine at a time,
T = 0.7 too, CSV and plot).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from sweep import ENGINE, QUIET_S, heldout

# A pinned step cost under which drafting never pays, and no probes: every step of this
# engine is a zero-draft step on the ISD path (what the plugin costs when nobody drafts).
NEVER_DRAFTS = {"step_ms": 1e-3, "row_ms": 1e3, "probe_every": 1 << 30}


def parse_method(name: str) -> dict | None:
    """`plain`, `plain-sync` (without async scheduling, which vLLM turns off for ISD), `K=<k>`,
    `adaptive` (every stride up to --max-k), `adaptive{...}` (with the settings of that JSON
    object, e.g. `adaptive{"min_dwell": 32}` or a pinned step cost) or `zero-draft`."""
    if name in ("plain", "plain-sync"):
        return None
    if name.startswith("K="):
        return {"method": "idlm", "num_speculative_tokens": int(name[2:]), "adaptive": False}
    if name == "adaptive":
        return {"method": "idlm", "adaptive": True}
    if name.startswith("adaptive{"):
        return {"method": "idlm", "adaptive": json.loads(name.removeprefix("adaptive"))}
    if name == "zero-draft":
        return {"method": "idlm", "adaptive": NEVER_DRAFTS}
    raise SystemExit(
        f"adaptive_check: unknown method {name!r} "
        "(plain, plain-sync, K=<k>, adaptive, adaptive{...}, zero-draft)"
    )


def spread(rates: list[float], plain: list[float]) -> tuple[float, float]:
    """The least and the largest of a method's per-round ratios to plain decoding (the
    rounds are paired: the same prompts, back to back): how far one round's figure can be
    from the whole run's on this machine."""
    ratios = [r / p for r, p in zip(rates, plain, strict=True)]
    return min(ratios), max(ratios)


def output_lengths(max_tokens: int, count: int, mixed: bool) -> list[int]:
    """max_tokens of each prompt: all equal, or (mixed) spread evenly over [max_tokens / 2,
    3 max_tokens / 2) in a fixed scrambled order, the same for every method. With equal
    lengths and `ignore_eos`, plain decoding's c requests all finish on the same step and
    their successors share one prefill step, where requests that draft finish apart and
    prefill one or two per step: a lockstep no real load keeps."""
    if not mixed:
        return [max_tokens] * count
    golden = (5**0.5 - 1) / 2
    return [max(1, int(max_tokens * (0.5 + (i * golden) % 1.0))) for i in range(count)]


def isd_counts(llm) -> tuple[int, int]:
    """Forwards of requests that carried draft slots so far, and the engine's forwards of all
    kinds (prefills too); (0, 0) without ISD. From the worker's own counters: with several
    engines in one process vLLM's metrics registry holds only the last engine's."""
    (state,) = llm.collective_rpc("idlm_state")
    return (state["num_steps"], state["decode_rows"]["steps"]) if state else (0, 0)


def strides_chosen(state: dict) -> dict[int, int]:
    """The adaptive engine's request-steps by stride so far, from its `idlm_state`."""
    return {int(k): v for k, v in state["strides_chosen"].items()}


def policy_at(llm, name: str, c: int, before: dict) -> dict:
    """Print what an adaptive engine did at concurrency c (its request-steps by stride, since
    `before`) and what its step cost fit holds after it; returns the strides chosen so far."""
    (state,) = llm.collective_rpc("idlm_state")
    chosen = strides_chosen(state)
    delta = {k: v - before.get(k, 0) for k, v in chosen.items() if v - before.get(k, 0)}
    cost = ", ".join(f"{k} {v * 1e3:.3f}" for k, v in state["step_cost"].items())
    acceptance = ", ".join(f"{a:.2f}" for a in state["engine_acceptance"])
    print(
        f"  {name} at c = {c}: request-steps by stride {delta}; fit (ms) {cost}; "
        f"acceptance {acceptance}",
        flush=True,
    )
    return chosen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=Path("~/.cache/vllm-idlm/demo"))
    ap.add_argument("--c", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--methods", nargs="+", default=["plain", "K=1", "K=3", "adaptive"])
    ap.add_argument("--max-k", type=int, default=3, help="adaptive's largest stride")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--prompts",
        type=int,
        default=None,
        help="per round (default: 16, and at least 4c; fewer than 4c is allowed with a warning)",
    )
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument(
        "--mixed-lengths",
        action="store_true",
        help="each prompt its own max_tokens, spread over [max_tokens / 2, 3 max_tokens / 2)",
    )
    ap.add_argument("--lora", type=Path, default=None, help="lossless ISD: MODELS/base + DIR")
    ap.add_argument(
        "--warmup-c",
        type=int,
        default=0,
        help="warm every engine up (untimed) on 4c extra prompts at this concurrency first, "
        "so that no engine meets its largest batches (their shapes, the KV cache's pages) "
        "for the first time in a timed round",
    )
    args = ap.parse_args()
    args.models = args.models.expanduser()
    model = args.models / ("base" if args.lora else "idlm")
    lossless = {"draft_lora": str(args.lora.expanduser())} if args.lora else {}

    from vllm import LLM, SamplingParams

    from vllm_idlm.measure import timed_generate

    # At least 4c prompts per round: the loop keeps c in flight, and throughput is measured
    # mostly in that steady state, not in the tail where the batch drains (with exactly c
    # prompts, ISD's slowest request would set the time of all of them).
    def per_round(c: int, warn: bool = False) -> int:
        if args.prompts is None:
            return max(16, 4 * c)
        if warn and args.prompts < 4 * c:
            print(f"  c = {c}: {args.prompts} prompts per round, under 4c: the drain weighs more")
        return args.prompts

    timed = max(per_round(c) for c in args.c) * args.rounds
    count = timed + 4 * args.warmup_c
    if args.lora:
        from chat_bench import chat_prompts

        prompts = chat_prompts(model, count)
        if len(prompts) < count:
            raise SystemExit(f"adaptive_check: {len(prompts)} chat prompts, {count} needed")
    else:
        prompts = heldout(args.models, count, 32)
    params = [
        SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        for n in output_lengths(args.max_tokens, count, args.mixed_lengths)
    ]
    warmup = prompts[timed:]
    engines = {}
    for name in args.methods:
        # The engine measures its step cost as it starts: the last engine's workers, still
        # spinning after its warm-up, would take a core from those measurements.
        if engines:
            time.sleep(QUIET_S)
        spec = parse_method(name)
        if spec is not None and spec.get("adaptive", False) is not False:
            spec.setdefault("num_speculative_tokens", args.max_k)
        if spec is not None:
            spec.update(lossless)
        engines[name] = LLM(
            model=str(model),
            max_num_seqs=max(args.c),
            speculative_config=spec,
            **ENGINE,
            **({"async_scheduling": False} if name == "plain-sync" else {}),
        )
        if name.startswith("adaptive"):
            (state,) = engines[name].collective_rpc("idlm_state")
            cost = {k: f"{v * 1e3:.2f} ms" for k, v in state["step_cost"].items()}
            print(f"  {name}: step cost measured at engine start {cost}", flush=True)
            bend = ", ".join(f"{r}: {s * 1e3:+.2f}" for r, s in state["step_cost_bend"])
            print(f"  {name}: over the line, ms at rows {{{bend}}}", flush=True)
        # Warm-up, untimed: two requests, or with --warmup-c a round at that concurrency from
        # the end of the prompt list (prompts no timed round uses).
        if args.warmup_c:
            extra = warmup[: 4 * args.warmup_c]
            timed_generate(engines[name], extra, params[: len(extra)], args.warmup_c)
        else:
            timed_generate(engines[name], prompts[:2], params[:2], concurrency=2)

    names = list(engines)
    # Each adaptive engine's request-steps by stride before this c.
    adaptive = [n for n in names if n.startswith("adaptive")]
    chosen_before = {}
    for name in adaptive:
        (state,) = engines[name].collective_rpc("idlm_state")
        chosen_before[name] = strides_chosen(state)
    for c in args.c:
        size = per_round(c, warn=True)
        seconds = dict.fromkeys(names, 0.0)
        tokens = dict.fromkeys(names, 0)
        rounds, round_tokens = dict.fromkeys(names, 0), dict.fromkeys(names, 0)
        forwards = dict.fromkeys(names, 0)  # the engine's forwards, prefills included
        per_round_rate = {n: [] for n in names}  # tok/s of each round, for the spread
        for r in range(args.rounds):
            batch = prompts[r * size : (r + 1) * size]
            for name in names[r % len(names) :] + names[: r % len(names)]:
                # vLLM's workers spin for a second after their last step: let the engine
                # that ran before go idle, or its spinning takes a core from this one.
                time.sleep(QUIET_S)
                before = isd_counts(engines[name])
                lengths = params[r * size : (r + 1) * size]
                result = timed_generate(engines[name], batch, lengths, concurrency=c)
                seconds[name] += result.seconds
                tokens[name] += result.num_tokens
                per_round_rate[name].append(result.num_tokens / result.seconds)
                after = isd_counts(engines[name])
                rounds[name] += after[0] - before[0]
                forwards[name] += after[1] - before[1]
                # Every token but a request's first (its prefill's) came from a round.
                round_tokens[name] += result.num_tokens - len(batch)
        rate = {n: tokens[n] / seconds[n] for n in names}
        for name in adaptive:
            chosen_before[name] = policy_at(engines[name], name, c, chosen_before[name])
        plain = rate.get("plain")
        fixed = [rate[n] for n in names if n.startswith("K=")]
        best_fixed = max(fixed) if fixed else None
        for name in names:
            line = f"{name:9s} c={c:3d} {rate[name]:8.1f} tok/s"
            if plain:
                line += f"  {rate[name] / plain:5.2f}x plain"
                if name != "plain" and args.rounds > 1:
                    line += " ({:.2f}-{:.2f} by round)".format(
                        *spread(per_round_rate[name], per_round_rate["plain"])
                    )
            if best_fixed and name.startswith("adaptive"):
                line += f"  {rate[name] / best_fixed:5.2f}x best fixed K"
            if rounds[name] and name.startswith("K="):
                line += f"  {round_tokens[name] / rounds[name]:.2f} tokens per ISD round"
            if c == 1 and forwards[name]:
                # One request per forward: tokens per forward (TPF, a prefill's token
                # counted on it), the speedup a step as cheap as a plain one would give.
                tpf = tokens[name] / forwards[name]
                line += f"  TPF {tpf:.2f}"
                if plain:
                    line += f", speedup {rate[name] / plain / tpf:.2f}x TPF"
            print(line, flush=True)
    if "adaptive" in engines:
        (state,) = engines["adaptive"].collective_rpc("idlm_state")
        print(f"  policy: {state['step_cost']}, acceptance {state['engine_acceptance']}")
        print(f"  verdicts seen per draft position: {state['observed_positions']}")
        print(f"  step cost measured at engine start in {state['calibration_s']:.1f} s")
        print(f"  strides chosen (request-steps, all c): {state['strides_chosen']}")
        carried = state["decode_rows"]
        print(
            f"  probes {state['probes']}; speculative steps {carried['spec_steps']} of "
            f"{carried['steps']} decode steps, {carried['draft_requests']} drafting request-steps"
        )
        if "self_check" in state:
            print(f"  check against plain decoding: {state['self_check']}")
    for llm in engines.values():
        llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main()
