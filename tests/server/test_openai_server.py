"""The OpenAI-compatible server with ISD: completions and chat, streaming or not, many
concurrent clients, aborted streams, bad prompts; the engine stays alive throughout."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest
import requests


def completion(server, **kwargs):
    body = {"model": server["model"], "max_tokens": 16, "temperature": 0, **kwargs}
    return requests.post(f"{server['url']}/v1/completions", json=body, timeout=120)


def test_completion_greedy_is_served_and_counts_its_tokens(isd_server):
    r = completion(isd_server, prompt="def parse(text):\n    ", max_tokens=20, ignore_eos=True)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["completion_tokens"] == 20
    assert body["choices"][0]["text"]


def test_completion_streaming_concatenates_to_the_non_streaming_text(isd_server):
    prompt = "import os\nimport sys\n\n\ndef main():\n"
    expected = completion(isd_server, prompt=prompt, max_tokens=24, ignore_eos=True).json()
    client = openai.OpenAI(base_url=f"{isd_server['url']}/v1", api_key="x")
    stream = client.completions.create(
        model=isd_server["model"],
        prompt=prompt,
        max_tokens=24,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    assert text == expected["choices"][0]["text"]


def test_chat_completion_streaming_and_not(isd_server):
    client = openai.OpenAI(base_url=f"{isd_server['url']}/v1", api_key="x")
    messages = [{"role": "user", "content": "Write a function that adds two numbers."}]
    full = client.chat.completions.create(
        model=isd_server["model"], messages=messages, max_tokens=16, temperature=0
    )
    assert full.choices[0].message.content is not None
    parts = client.chat.completions.create(
        model=isd_server["model"], messages=messages, max_tokens=16, temperature=0, stream=True
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
    assert streamed == full.choices[0].message.content


async def _stream_one(session, url, model, i):
    body = {
        "model": model,
        "prompt": f"class Handler{i}:\n    def ",
        "max_tokens": 24,
        "temperature": 0.8,
        "top_p": 0.95,
        "seed": i,
        "stream": True,
        "ignore_eos": True,
    }
    chunks = []
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


def test_32_concurrent_streaming_clients_all_complete(isd_server):
    async def run():
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            return await asyncio.gather(
                *[
                    _stream_one(session, isd_server["url"], isd_server["model"], i)
                    for i in range(32)
                ]
            )

    results = asyncio.run(run())
    assert len(results) == 32
    for chunks in results:
        finish = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")]
        assert finish[-1] == "length"


def test_an_aborted_stream_leaves_the_engine_serving(isd_server):
    async def abort_midway():
        async with aiohttp.ClientSession() as session:
            body = {
                "model": isd_server["model"],
                "prompt": "def f():\n",
                "max_tokens": 400,
                "stream": True,
                "ignore_eos": True,
            }
            async with session.post(f"{isd_server['url']}/v1/completions", json=body) as resp:
                seen = 0
                async for _ in resp.content:
                    seen += 1
                    if seen >= 5:
                        break  # leaving the context closes the connection mid-stream
        return seen

    assert asyncio.run(abort_midway()) >= 5
    assert requests.get(f"{isd_server['url']}/health", timeout=10).status_code == 200
    r = completion(isd_server, prompt="x = ", max_tokens=8)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


def test_a_prompt_with_the_mask_token_gets_a_400_and_the_server_lives(isd_server):
    r = completion(isd_server, prompt="a = <|mask|> + 1")
    assert r.status_code == 400
    assert "MASK token" in r.json()["error"]["message"]
    assert completion(isd_server, prompt="a = 1 + ").status_code == 200


@pytest.mark.parametrize(
    "bad", [{"temperature": 3.0}, {"top_p": 1.5}, {"min_p": 1.5, "temperature": 0.8}, {"n": 0}]
)
def test_impossible_sampling_options_get_a_400(isd_server, bad):
    r = completion(isd_server, prompt="y = ", **bad)
    assert r.status_code == 400, r.text
    assert completion(isd_server, prompt="y = ").status_code == 200


def test_prometheus_metrics_report_isd_rounds_and_k_positions(isd_server):
    completion(isd_server, prompt="for i in range(3):\n", max_tokens=32, ignore_eos=True)
    text = requests.get(f"{isd_server['url']}/metrics", timeout=10).text
    lines = [
        ln
        for ln in text.splitlines()
        if ln.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total")
    ]
    positions = sorted(int(ln.split('position="')[1].split('"')[0]) for ln in lines)
    # K = 3: up to 2K - 1 = 5 drafts a step (lookup drafts, then MASK-row drafts), one counter
    # per draft position, none for the MASK slots themselves
    assert positions == [0, 1, 2, 3, 4]
    drafts = [ln for ln in text.splitlines() if ln.startswith("vllm:spec_decode_num_drafts_total")]
    assert drafts and float(drafts[0].split()[-1]) > 0


@pytest.mark.parametrize("length", [129, 257])
def test_the_same_prompt_twice_with_prefix_caching_keeps_the_server_alive(
    isd_server, heldout_prompts, length
):
    """Regression: a prompt of 1 + k * 128 tokens (the CPU block size) sent twice. The second
    send hits the prefix cache with one token left to compute; vLLM pads that new decode with
    placeholder draft slots (-1), which the plugin took for drafts: at T = 0 the spec-decode
    metrics overflowed (IndexError, EngineDeadError), at T > 0 the sampler refused the
    drafts for lack of draft probabilities, and the server answered nothing after that."""
    stream = [t for p in heldout_prompts for t in p]
    prompt = stream[:length]
    greedy = [
        completion(isd_server, prompt=prompt, max_tokens=24, ignore_eos=True) for _ in range(2)
    ]
    assert [r.status_code for r in greedy] == [200, 200], greedy[-1].text
    assert greedy[0].json()["choices"][0]["text"] == greedy[1].json()["choices"][0]["text"]
    for seed in (0, 1):
        r = completion(
            isd_server, prompt=prompt, max_tokens=24, ignore_eos=True, temperature=0.8, seed=seed
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 24
    assert requests.get(f"{isd_server['url']}/health", timeout=10).status_code == 200
