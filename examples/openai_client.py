"""The official `openai` client against `vllm serve` with ISD (chat and completions).

python examples/openai_client.py --url http://localhost:8000/v1 --model CKPT
"""

import argparse

import openai

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://localhost:8000/v1")
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.url, api_key="unused")
    done = client.completions.create(
        model=args.model, prompt="def parse_args():\n", max_tokens=48, temperature=0
    )
    print(done.choices[0].text)
    stream = client.chat.completions.create(
        model=args.model,
        messages=[{"role": "user", "content": "class Stack:"}],
        max_tokens=48,
        temperature=0.7,
        stream=True,
    )
    for chunk in stream:
        if chunk.choices:
            print(chunk.choices[0].delta.content or "", end="", flush=True)
    print()
