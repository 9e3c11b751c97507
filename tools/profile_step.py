"""Where one engine step's time goes: plain decoding vs ISD, cProfile over an in-process engine.

python tools/profile_step.py --models ~/.cache/vllm-idlm/demo --k 3
python tools/profile_step.py --models ~/.cache/vllm-idlm/demo --k 1 --c 64   # under load
python tools/profile_step.py --zero-draft --c 64 --prompts 64   # ISD engine, no drafts

`--c` requests are decoded together (64 prompts by default then); one at a time by default.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
from pathlib import Path

FUNCTIONS = r"(core.py:\d+\(step\)|_model_forward|_prepare_inputs|sample_tokens\)|scheduler.py:\d+\(schedule\)|sampler.py:\d+\(forward\)|verify_and_draft)"


def profile(model: Path, prompts, spec, c: int) -> None:
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(model),
        dtype="float32",
        kv_cache_memory_bytes=512 << 20,
        speculative_config=spec,
        max_num_seqs=max(c, 1),
    )
    params = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False)  # warm-up
    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(0, len(prompts), c):  # c requests at a time
        batch = [{"prompt_token_ids": p} for p in prompts[i : i + c]]
        llm.generate(batch, params, use_tqdm=False)
    profiler.disable()
    stats = pstats.Stats(profiler)
    steps = next(
        (n for (_, _, name), (_, n, *_) in stats.stats.items() if name == "execute_model"), 0
    )
    print(f"\n=== {'plain' if spec is None else spec}, c = {c}, {steps} steps ===")
    stats.sort_stats("cumulative").print_stats(FUNCTIONS, 20)
    if c > 1:
        stats.sort_stats("tottime").print_stats(25)
    llm.llm_engine.engine_core.shutdown()


def main() -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine in this process: profilable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from demo_tiny import heldout_prompts

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", type=Path, default=Path("~/.cache/vllm-idlm/demo").expanduser())
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=None, help="default: max(8, c)")
    parser.add_argument("--c", type=int, default=1)
    parser.add_argument(
        "--zero-draft", action="store_true", help="an ISD engine in which no request drafts"
    )
    args = parser.parse_args()
    prompts = heldout_prompts(args.models / "idlm", args.prompts or max(8, args.c), 32)
    spec = {"method": "idlm", "num_speculative_tokens": args.k, "adaptive": False}
    if args.zero_draft:  # a pinned cost under which nothing drafts, and no probes
        spec["adaptive"] = {"step_ms": 1e-3, "row_ms": 1e3, "probe_every": 0}
    profile(args.models / "idlm", prompts, None, args.c)
    profile(args.models / "idlm", prompts, spec, args.c)


if __name__ == "__main__":
    main()
