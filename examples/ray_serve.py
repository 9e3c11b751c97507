"""Serve an I-DLM with ISD on Ray Serve LLM, query it with the `openai` client, print the
speculative-decoding counters Ray exports, shut down.

python examples/ray_serve.py --model ~/.cache/vllm-idlm/demo/idlm [--port 8000]
python examples/ray_serve.py --model ~/.cache/vllm-idlm/demo/base \
    --draft-lora ~/.cache/vllm-idlm/demo/lora
"""

import argparse
import json
from pathlib import Path

PROMPTS = ["def read_config(path):\n", "class LRUCache:\n    def __init__(self, size):\n"]


def has_chat_template(model: Path) -> bool:
    config = model / "tokenizer_config.json"
    return (model / "chat_template.jinja").is_file() or (
        config.is_file() and "chat_template" in json.loads(config.read_text())
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--draft-lora", type=Path)
    parser.add_argument("--num-drafts", type=int, default=3)
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()

    import openai
    import ray
    from ray import serve

    from vllm_idlm.launch import free_port
    from vllm_idlm.on_ray.common import on_cpu, wait_for_counters
    from vllm_idlm.on_ray.serve import build_app, llm_config

    model = args.model.expanduser()
    engine_kwargs = {"max_model_len": 2048}
    if on_cpu():  # vLLM's CPU build would size the KV cache from the RAM; 1 GiB is plenty
        engine_kwargs["kv_cache_memory_bytes"] = 1 << 30
    metrics_port = free_port()
    ray.init(include_dashboard=False, _metrics_export_port=metrics_port)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        config = llm_config(
            model,
            model_id="idlm",
            num_drafts=args.num_drafts,
            draft_lora=args.draft_lora and args.draft_lora.expanduser(),
            engine_kwargs=engine_kwargs,
        )
        serve.run(build_app(config))  # returns once the engine is up

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{args.port}/v1", api_key="unused")
        for prompt in PROMPTS:
            done = client.completions.create(
                model="idlm", prompt=prompt, max_tokens=48, temperature=0
            )
            print(repr(prompt), "->", repr(done.choices[0].text))
        if has_chat_template(model):
            chat = client.chat.completions.create(
                model="idlm",
                messages=[{"role": "user", "content": "class Stack:"}],
                max_tokens=48,
                temperature=0,
            )
            print("chat ->", repr(chat.choices[0].message.content))

        # Ray's metrics agent lags the engine by a few seconds.
        counters = wait_for_counters(metrics_port, {"ray_vllm_spec_decode_num_drafts_total": 1})
        for name, value in counters.items():
            print(f"{name} {value:g}")
        drafts = counters["ray_vllm_spec_decode_num_drafts_total"]
        accepted = counters["ray_vllm_spec_decode_num_accepted_tokens_total"]
        if drafts:
            print(f"tokens per ISD round {1 + accepted / drafts:.2f}")
    finally:
        serve.shutdown()
        ray.shutdown()
