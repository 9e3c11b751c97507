"""`make demo-tiny`: ISD through vLLM on the embedded 3.6M demo models (code, not prose).

Runs the same held-out prompts through plain decoding, ISD on the demo I-DLM, and
lossless ISD (demo base + gated adapter), and prints tokens per forward, acceptance
and tokens/s against plain decoding.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from vllm_idlm.console import quiet, table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

quiet()  # before torch and vLLM load: the demo's output, not theirs (here and in vLLM's processes)

ENGINE = dict(
    dtype="float32",
    kv_cache_memory_bytes=512 << 20,
    disable_log_stats=False,
    seed=0,
    use_tqdm_on_load=False,
)


def heldout_prompts(model_dir: Path, count: int, length: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from idlm_training.config import load_recipe
    from idlm_training.corpus import load_corpus
    from idlm_training.evaluate import make_prompts

    _, heldout = load_corpus(load_recipe(os.environ.get("IDLM_DEMO_PRESET", "demo")).corpus)
    return make_prompts(AutoTokenizer.from_pretrained(model_dir), heldout, count, length, seed=7)


def run(name: str, model: Path, prompts, params, spec=None, **engine):
    from common import closed_loop  # benchmarks/common.py: the timed closed loop
    from vllm import LLM

    print(f"{name}: starting vLLM", flush=True)
    llm = LLM(model=str(model), speculative_config=spec, **{**ENGINE, **engine})
    try:
        closed_loop(llm, prompts[:2], [params] * 2, 1)  # warm-up
        result = closed_loop(llm, prompts, [params] * len(prompts), 1)
    finally:
        llm.llm_engine.engine_core.shutdown()
    print(f"{name}: {result.num_tokens} tokens in {result.seconds:.2f} s", flush=True)
    return result


def main() -> None:
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--models",
        type=Path,
        default=Path(os.environ.get("IDLM_DEMO_DIR", "~/.cache/vllm-idlm/demo")).expanduser(),
    )
    parser.add_argument(
        "--k",
        type=int,
        default=3,
        help="most drafts per step (stride K + 1; the stride policy picks 0..K)",
    )
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()
    idlm, base, lora = (args.models / n for n in ("idlm", "base", "lora"))
    prompts = heldout_prompts(idlm, args.prompts, 32)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    isd = {"method": "idlm", "num_speculative_tokens": args.k}
    methods = [  # (name, model, speculative config, engine args); each ISD after its plain
        ("plain decoding (I-DLM)", idlm, None, {}),
        (f"ISD K<={args.k} (I-DLM)", idlm, isd, {}),
        ("plain decoding (base)", base, None, {"enforce_eager": True}),
        (
            f"lossless ISD K<={args.k} (base + gated LoRA)",
            base,
            {**isd, "draft_lora": str(lora)},
            {},
        ),
    ]
    rows = [
        (name, run(name, model, prompts, params, spec, **engine))
        for name, model, spec, engine in methods
    ]
    tokenizer = AutoTokenizer.from_pretrained(idlm)
    print("\n" + "=" * 96)
    print(
        f"{len(prompts)} held-out stdlib prompts, {args.max_tokens} greedy tokens each, one request at a time"
    )
    cells = []
    for i, (name, result) in enumerate(rows):
        plain = rows[i - i % 2][1]
        m = result.metrics
        accept = " ".join(f"{a:.2f}" for a in m.acceptance_per_position) if m.num_rounds else "-"
        tpf = f"{result.tokens_per_forward:.2f}"
        speed = result.tokens_per_second
        cells.append(
            (
                name,
                tpf,
                accept,
                f"{speed:.1f}",
                f"{speed / plain.tokens_per_second:.2f}x",
                "yes" if result.outputs == plain.outputs else "NO",
            )
        )
    print(table(("run", "tok/fwd", "accept/pos", "tok/s", "vs plain", "same?"), cells))
    print("=" * 96)
    print("prompt:", repr(tokenizer.decode(prompts[0])[-120:]))
    print("ISD   :", repr(tokenizer.decode(rows[1][1].outputs[0])[:200]))


if __name__ == "__main__":
    main()
