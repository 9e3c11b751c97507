"""Where one engine step's time goes: plain decoding vs ISD, cProfile over an in-process engine.

python benchmarks/profile_step.py --models ~/.cache/vllm-idlm/demo --k 3
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
from pathlib import Path

FUNCTIONS = r"(core.py:\d+\(step\)|_model_forward|_prepare_inputs|sample_tokens\)|scheduler.py:\d+\(schedule\)|sampler.py:\d+\(forward\)|verify_and_draft)"


def profile(model: Path, prompts, spec) -> None:
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(model), dtype="float32", kv_cache_memory_bytes=512 << 20, speculative_config=spec
    )
    params = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False)  # warm-up
    profiler = cProfile.Profile()
    profiler.enable()
    for p in prompts:  # one request at a time
        llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)
    profiler.disable()
    print(f"\n=== {'plain' if spec is None else spec} ===")
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(FUNCTIONS, 20)
    llm.llm_engine.engine_core.shutdown()


def main() -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine in this process: profilable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from demo import heldout_prompts

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", type=Path, default=Path("~/.cache/vllm-idlm/demo").expanduser())
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    args = parser.parse_args()
    prompts = heldout_prompts(args.models / "idlm", args.prompts, 32)
    profile(args.models / "idlm", prompts, None)
    profile(args.models / "idlm", prompts, {"method": "idlm", "num_speculative_tokens": args.k})


if __name__ == "__main__":
    main()
