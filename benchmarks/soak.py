"""Soak a real `vllm serve` with ISD: many concurrent clients, random requests, aborts, bad input.

    python benchmarks/soak.py --models ~/.cache/vllm-idlm/demo [--requests 600] [--concurrency 64]

For each mode (ISD on the I-DLM; lossless ISD, the base plus the gated adapter) it starts a
plain server of the same checkpoint, records its answers to the greedy requests, stops it,
then starts the ISD server and sends the whole mix with `--concurrency` clients at once:

- token-id prompts of random lengths cut from held-out text, a third of them repeated
  (prefix-cache hits, including lengths of 1 + k * block size);
- random sampling options (greedy, temperature, top-k / top-p, seeds, penalties,
  logprobs, n, stop strings), completions and chat, streaming or not;
- streams aborted after a few chunks;
- bad requests: the MASK token in the prompt, impossible options, prompts too long.

It prints requests served / aborted / refused (4xx) / failed (5xx), tokens, greedy answers
checked against the plain server, and the server's resident memory after each round of the
same mix (`--rounds`; all but the last are warm-up); `--json` writes the same figures. A mode fails when the engine died, any request got a
5xx or did not complete, a greedy answer differs from the plain server's, a bad request was
not refused, or the server's memory grew by more than 5% after warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

from vllm_idlm.launch import Server

MAX_MODEL_LEN = 512
BLOCK = 128  # KV block size of the CPU build (prefix-cache granularity)


@dataclass
class Report:
    mode: str
    requests: int = 0
    served: int = 0
    aborted: int = 0
    refused_4xx: int = 0
    failed_5xx: int = 0
    incomplete: int = 0
    bad_not_refused: int = 0
    tokens: int = 0
    greedy_checked: int = 0
    greedy_mismatches: int = 0
    engine_alive: bool = True
    engine_errors: int = 0
    rss_after_warmup_mb: float = 0.0
    rss_end_mb: float = 0.0
    rss_per_round_mb: list[float] = field(default_factory=list)
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def memory_flat(self) -> bool:
        """Resident memory at the end within 5% of what it was after warm-up."""
        return self.rss_end_mb <= self.rss_after_warmup_mb * 1.05

    @property
    def ok(self) -> bool:
        return (
            self.memory_flat
            and self.engine_alive
            and not self.engine_errors
            and not self.failed_5xx
            and not self.incomplete
            and not self.bad_not_refused
            and not self.greedy_mismatches
        )


def held_out_token_stream(models: Path) -> list[int]:
    """Token ids of held-out stdlib sources (never trained on), as the demo tokenizer reads them."""
    from transformers import AutoTokenizer

    from idlm_training.config import load_recipe
    from idlm_training.corpus import load_corpus

    tokenizer = AutoTokenizer.from_pretrained(models / "idlm")
    _, heldout = load_corpus(load_recipe("demo").corpus)
    text = "\n".join(doc.prompt + doc.text for doc in heldout[:12])
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def make_requests(stream: list[int], count: int, seed: int) -> list[dict]:
    """The request mix: each entry is {"kind", "path", "body"}; deterministic in `seed`."""
    rng = random.Random(seed)
    lengths = [1 + BLOCK, 1 + 2 * BLOCK, BLOCK, 2, 17, 64, 200, 300, 450]
    pool = []
    for i in range(count // 3 + 1):
        n = lengths[i] if i < len(lengths) else rng.randint(1, 460)
        start = rng.randrange(0, len(stream) - n)
        pool.append(stream[start : start + n])
    requests = []
    for _ in range(count):
        prompt = rng.choice(pool)  # ~3 sends per prompt: prefix-cache hits
        roll = rng.random()
        max_tokens = rng.randint(1, min(48, MAX_MODEL_LEN - len(prompt)))
        body: dict = {"prompt": prompt, "max_tokens": max_tokens}
        if roll < 0.10:
            requests.append(bad_request(rng, prompt))
            continue
        if roll < 0.25:
            body.update(temperature=rng.choice([0.0, 0.8]), stream=True, max_tokens=48)
            body["max_tokens"] = min(48, MAX_MODEL_LEN - len(prompt))
            requests.append({"kind": "abort", "path": "/v1/completions", "body": body})
            continue
        if roll < 0.55:
            body.update(temperature=0.0, ignore_eos=True)
            if rng.random() < 0.2:
                body["repetition_penalty"] = 1.2
            if rng.random() < 0.2:
                body["logprobs"] = 2
            requests.append({"kind": "greedy", "path": "/v1/completions", "body": body})
            continue
        body.update(
            temperature=rng.choice([0.5, 0.8, 1.0]),
            top_p=rng.choice([1.0, 0.9]),
            top_k=rng.choice([-1, 20]),
            stream=rng.random() < 0.5,
        )
        if rng.random() < 0.3:
            body["seed"] = rng.randrange(1000)
        if rng.random() < 0.2:
            body["presence_penalty"] = 0.5
        if rng.random() < 0.2:
            body["n"] = rng.choice([2, 3])
        if rng.random() < 0.2:
            body["stop"] = ["\n\n"]
        if rng.random() < 0.2:
            body["logprobs"] = 3
        if rng.random() < 0.25:
            chat = {
                "messages": [{"role": "user", "content": "Write a Python function."}],
                "max_tokens": body["max_tokens"],
                "temperature": body["temperature"],
                "stream": body["stream"],
            }
            requests.append({"kind": "sampled", "path": "/v1/chat/completions", "body": chat})
        else:
            requests.append({"kind": "sampled", "path": "/v1/completions", "body": body})
    return requests


def bad_request(rng: random.Random, prompt: list[int]) -> dict:
    bad = rng.choice(
        [
            {"prompt": "x = <|mask|> + 1", "max_tokens": 4},  # the MASK token in the prompt
            {"prompt": prompt, "max_tokens": 4, "temperature": -1.0},
            {"prompt": prompt, "max_tokens": 4, "top_p": 1.5},
            {"prompt": prompt, "max_tokens": 4, "n": 0},
            {"prompt": prompt, "max_tokens": 4, "min_p": 1.5, "temperature": 0.8},
            {"prompt": prompt, "max_tokens": 4, "logit_bias": {"10000000": 10}},  # not a token
            {"prompt": [7] * (MAX_MODEL_LEN + 10), "max_tokens": 4},  # too long
            {"prompt": prompt, "max_tokens": MAX_MODEL_LEN * 4},
        ]
    )
    return {"kind": "bad", "path": "/v1/completions", "body": bad}


async def send(session, url: str, model: str, request: dict, rng: random.Random) -> dict:
    """One request; returns {"status", "texts", "tokens", "complete", "aborted"}."""
    body = {"model": model, **request["body"]}
    async with session.post(url + request["path"], json=body) as resp:
        if resp.status != 200:
            await resp.read()
            return {"status": resp.status}
        if not body.get("stream"):
            data = await resp.json()
            texts = [
                c.get("text", (c.get("message") or {}).get("content")) for c in data["choices"]
            ]
            finished = all(c.get("finish_reason") in ("stop", "length") for c in data["choices"])
            tokens = data["usage"]["completion_tokens"]
            return {"status": 200, "texts": texts, "tokens": tokens, "complete": finished}
        stop_after = rng.randint(1, 4) if request["kind"] == "abort" else None
        chunks = 0
        finish = None
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunks += 1
            for choice in json.loads(line[6:]).get("choices", []):
                finish = choice.get("finish_reason") or finish
            if stop_after is not None and chunks >= stop_after:
                return {"status": 200, "aborted": True}  # leaving closes the connection
        return {"status": 200, "tokens": 0, "complete": finish in ("stop", "length")}


async def run_all(url: str, model: str, requests: list[dict], concurrency: int, seed: int):
    rng = random.Random(seed + 1)
    queue: asyncio.Queue = asyncio.Queue()
    for i, r in enumerate(requests):
        queue.put_nowait((i, r))
    results: list[dict | None] = [None] * len(requests)

    async def worker(session):
        while not queue.empty():
            i, r = queue.get_nowait()
            try:
                results[i] = await send(session, url, model, r, rng)
            except (TimeoutError, aiohttp.ClientError) as e:
                results[i] = {"status": 599, "error": repr(e)}

    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*[worker(session) for _ in range(concurrency)])
    return results


def greedy_answers(url: str, model: str, requests: list[dict]) -> dict[int, list[str]]:
    greedy = [r for r in requests if r["kind"] == "greedy"]
    results = asyncio.run(run_all(url, model, greedy, 16, 0))
    index = [i for i, r in enumerate(requests) if r["kind"] == "greedy"]
    return {i: res.get("texts") for i, res in zip(index, results, strict=True)}


def soak_mode(mode: str, models: Path, args, workdir: Path) -> Report:
    checkpoint = models / ("idlm" if mode == "isd" else "base")
    spec = {"method": "idlm", "num_speculative_tokens": args.k}
    if mode == "lossless":
        spec["draft_lora"] = str(models / "lora")
    requests = make_requests(held_out_token_stream(models), args.requests, args.seed)
    report = Report(mode, requests=args.rounds * len(requests))
    with Server(checkpoint, workdir / f"{mode}_plain.log", max_model_len=MAX_MODEL_LEN) as plain:
        expected = greedy_answers(plain.url, str(checkpoint), requests)
    with Server(checkpoint, workdir / f"{mode}.log", spec, max_model_len=MAX_MODEL_LEN) as server:
        # Rounds of the same mix: all but the last warm the server up; memory must stay flat
        # through the last. A plain vLLM server's memory also grows over the first rounds of
        # this mix and levels off (allocator pools, the largest batches seen): measured with
        # plain and ISD servers side by side, +105/+84/+48/+34 MB vs +142/+142/+75/+37 MB per
        # round of 300 requests; a leak of per-request state would grow by the same amount
        # every round.
        start = time.perf_counter()
        results = []
        for round_ in range(args.rounds):
            results += asyncio.run(
                run_all(server.url, str(checkpoint), requests, args.concurrency, args.seed + round_)
            )
            report.rss_per_round_mb.append(round(server.rss_bytes() / 2**20, 1))
            if round_ == args.rounds - 2:
                report.rss_after_warmup_mb = server.rss_bytes() / 2**20
        report.seconds = time.perf_counter() - start
        report.rss_end_mb = server.rss_bytes() / 2**20
        report.engine_alive = server.alive() and server.healthy()
        log = server.log_path.read_text(errors="replace")
    report.engine_errors = log.count("EngineDeadError") + log.count("EngineCore encountered")
    for i, (request, result) in enumerate(zip(requests * args.rounds, results, strict=True)):
        status = result["status"]
        if status >= 500:
            report.failed_5xx += 1
            report.problems.append(f"#{i} {request['kind']}: {status} {result.get('error', '')}")
        elif status >= 400:
            report.refused_4xx += 1
            if request["kind"] != "bad":
                report.problems.append(f"#{i} {request['kind']} refused with {status}")
                report.incomplete += 1
        elif request["kind"] == "bad":
            report.bad_not_refused += 1
            report.problems.append(f"#{i} bad request {request['body']} was served")
        elif result.get("aborted"):
            report.aborted += 1
        elif not result.get("complete"):
            report.incomplete += 1
            report.problems.append(f"#{i} {request['kind']} did not complete")
        else:
            report.served += 1
            report.tokens += result.get("tokens", 0)
            if request["kind"] == "greedy":
                report.greedy_checked += 1
                if result["texts"] != expected[i % len(requests)]:
                    report.greedy_mismatches += 1
                    report.problems.append(f"#{i} greedy answer differs from the plain server")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=Path, required=True, help="demo dir: base/, idlm/, lora/")
    ap.add_argument("--modes", nargs="*", default=["isd", "lossless"])
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=4, help="rounds of the mix (last one measured)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    reports = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes:
            reports.append(soak_mode(mode, args.models.expanduser(), args, Path(tmp)))
    print(
        "| mode | requests | served | aborted | refused 4xx | 5xx | incomplete | tokens "
        "| greedy checked / mismatched | RSS after warm-up -> end (MB) | seconds |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in reports:
        print(
            f"| {r.mode} | {r.requests} | {r.served} | {r.aborted} | {r.refused_4xx} "
            f"| {r.failed_5xx} | {r.incomplete} | {r.tokens} | {r.greedy_checked} / "
            f"{r.greedy_mismatches} | {r.rss_after_warmup_mb:.0f} -> {r.rss_end_mb:.0f} "
            f"| {r.seconds:.0f} |"
        )
        for problem in r.problems[:10]:
            print(f"  {r.mode}: {problem}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) | {"ok": r.ok} for r in reports], indent=1))
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
