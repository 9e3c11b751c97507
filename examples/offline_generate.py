"""Offline generation with ISD through `vllm.LLM` (the plugin only needs to be installed).

python examples/offline_generate.py ~/.cache/vllm-idlm/demo/idlm
"""

import sys

from vllm import LLM, SamplingParams

from vllm_idlm.metrics import read_isd_metrics

if __name__ == "__main__":  # vLLM spawns its engine process: guard the entry point
    model = sys.argv[1] if len(sys.argv) > 1 else "~/.cache/vllm-idlm/demo/idlm"
    llm = LLM(
        model=model,
        speculative_config={"method": "idlm", "num_speculative_tokens": 3},
        dtype="float32",
        kv_cache_memory_bytes=512 << 20,  # CPU build: a small KV cache is plenty here
        disable_log_stats=False,  # needed for get_metrics()
    )
    prompts = ["def read_config(path):\n", "class LRUCache:\n    def __init__(self, size):\n"]
    params = SamplingParams(temperature=0.7, top_p=0.95, max_tokens=64, seed=0)
    for out in llm.generate(prompts, params):
        print(repr(out.prompt), "->", repr(out.outputs[0].text))
    m = read_isd_metrics(llm.get_metrics())
    print(
        f"tokens per forward {m.tokens_per_forward:.2f}, acceptance per position "
        f"{[round(a, 2) for a in m.acceptance_per_position]}, cold starts {m.cold_start_share:.0%}"
    )
