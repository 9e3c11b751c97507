"""32 concurrent streaming completions with aiohttp against `vllm serve` with ISD.

vllm serve CKPT --speculative-config '{"method": "idlm", "num_speculative_tokens": 3}'
python examples/async_stream_clients.py --url http://localhost:8000 --model CKPT
"""

import argparse
import asyncio
import json
import time

import aiohttp


async def stream_one(session, url, model, i):
    body = {
        "model": model,
        "prompt": f"def handler_{i}(request):\n",
        "max_tokens": 64,
        "temperature": 0.8,
        "seed": i,
        "stream": True,
    }
    first, text = None, []
    start = time.perf_counter()
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            first = first or time.perf_counter() - start
            text.append(json.loads(line[6:])["choices"][0]["text"])
    return first, time.perf_counter() - start, "".join(text)


async def main(url, model, n):
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        results = await asyncio.gather(*[stream_one(session, url, model, i) for i in range(n)])
    for i, (ttft, total, text) in enumerate(results[:4]):
        print(f"#{i}: first token {ttft * 1000:.0f} ms, done {total:.2f} s: {text[:60]!r}")
    print(f"{n} streams completed")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://localhost:8000")
    parser.add_argument("--model", required=True)
    parser.add_argument("-n", type=int, default=32)
    args = parser.parse_args()
    asyncio.run(main(args.url, args.model, args.n))
