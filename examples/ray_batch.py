"""Offline batch ISD over a Ray Dataset with N vLLM engine replicas (Ray Data's LLM processor).

    python examples/ray_batch.py --model ~/.cache/vllm-idlm/demo/idlm --replicas 2
    python examples/ray_batch.py --model ~/.cache/vllm-idlm/demo/base \\
        --draft-lora ~/.cache/vllm-idlm/demo/lora            # lossless mode

RAY_ADDRESS=... runs it on an existing cluster; without it a local one is started.
"""

from __future__ import annotations

import argparse
import time

PROMPTS = [
    "def read_config(path):\n",
    "class LRUCache:\n    def __init__(self, size):\n",
    "import os\nimport sys\n\n\ndef main():\n",
    "def fibonacci(n):\n",
    "    def __repr__(self):\n",
    "def parse_args(argv=None):\n",
    "class Stack:\n",
    "def merge_sorted(a, b):\n",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft-lora", help="gated adapter dir: lossless ISD over --model (a base)")
    ap.add_argument("--num-drafts", type=int, default=3, help="K; 0 = plain decoding")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()

    import ray

    from vllm_idlm.on_ray.data import build_processor

    ray.init(include_dashboard=False, log_to_driver=False)
    processor = build_processor(
        args.model,
        num_drafts=args.num_drafts or None,
        draft_lora=args.draft_lora,
        replicas=args.replicas,
        engine_kwargs=dict(dtype="float32", max_model_len=512, kv_cache_memory_bytes=512 << 20),
    )
    ds = ray.data.from_items(
        [{"id": i, "prompt": p, "max_tokens": args.max_tokens} for i, p in enumerate(PROMPTS)]
    )
    start = time.perf_counter()
    rows = sorted(processor(ds).take_all(), key=lambda r: r["id"])
    seconds = time.perf_counter() - start
    for row in rows:
        print(f"--- {row['prompt']!r}\n{row['generated_text']}")
    tokens = sum(r["num_generated_tokens"] for r in rows)
    print(f"\n{len(rows)} rows, {tokens} tokens in {seconds:.1f} s (engine start included)")
    ray.shutdown()


if __name__ == "__main__":
    main()
