"""Concurrency sweep as users run it: `vllm serve` per method, driven by `vllm bench serve`.

    python benchmarks/serve_sweep.py --models ~/.cache/vllm-idlm/demo --out results/serve_sweep.csv

The same methods and held-out prompts as `benchmarks/compare.py` (`common.parse_method`), but
each method is a real OpenAI-compatible server and the load comes from vLLM's own benchmark
client: for every temperature and concurrency c,
`vllm bench serve --dataset-name custom --max-concurrency c` over the prompts (as text,
`--ignore-eos` so every method produces the same number of tokens). Tokens per forward come
from the server's Prometheus counters (1 + accepted / draft rounds; for ISD a cold start is a
round with no drafts). Writes a CSV (method, temperature, concurrency, tok/s, ratio to plain,
mean TTFT and TPOT) and the PNG.

All servers are up at once and take turns at each point, the order rotating from point to
point with a quiet gap between them, as the offline sweep's engines do: run one server after
another, a ratio to plain compared runs a quarter of an hour apart on a machine whose speed
drifts by a third over such spans (DECISIONS.md). `--one-at-a-time` runs
one server after another (less memory: seven demo-model servers took 11 GiB together).

`--requests` sets how many requests each point sends (default: as many as `--prompts`, the
pool), drawn again from the pool where it asks for more, as `vllm bench serve` oversamples:
at concurrency 32-64 the 64 prompts of a point take under 2.5 s on the demo models. Longer
points are not enough on their own: at 192 requests a point's ratio to plain still moved by up
to 0.46 between rotations on this 2-core machine (DECISIONS.md, D19), so judge
a few percent over repeated runs, not one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DEMO_DIR, QUIET_S, demo_prompts, parse_method, write_table  # noqa: E402

SERVER_FLAGS = ["--enforce-eager", "--seed", "0"]
# KV cache per server: the demo models need 4 KB per token, 64 requests of 96 tokens 25 MB.
KV_BYTES = 256 << 20


def spec_counters(url: str) -> tuple[float, float]:
    """(draft rounds, accepted tokens) so far, from the server's /metrics."""
    from vllm_idlm.on_ray.common import counter_total

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return (
        counter_total(text, "vllm:spec_decode_num_drafts_total"),
        counter_total(text, "vllm:spec_decode_num_accepted_tokens_total"),
    )


def write_dataset(models: Path, args, folder: Path) -> Path:
    """The held-out prompts as text, one JSON object per line (vLLM's custom dataset)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(models / "base")
    path = folder / "prompts.jsonl"
    with open(path, "w") as f:
        for ids in demo_prompts(models, args.prompts, args.prompt_len):
            f.write(json.dumps({"prompt": tokenizer.decode(ids)}) + "\n")
    return path


def bench(
    server, dataset: Path, tokenizer: Path, t: float, c: int, args, out: Path, num_prompts=None
) -> dict:
    vllm = shutil.which("vllm", path=str(Path(sys.executable).parent)) or "vllm"
    name = f"t{t}_c{c}.json"
    cmd = [
        vllm,
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        server.url,
        "--model",
        server.model,
        "--tokenizer",
        str(tokenizer),
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(dataset),
        "--skip-chat-template",
        "--num-prompts",
        str(num_prompts or args.requests),
        "--custom-output-len",
        str(args.max_tokens),
        "--ignore-eos",
        "--temperature",
        str(t),
        "--max-concurrency",
        str(c),
        "--seed",
        "0",
        "--save-result",
        "--result-dir",
        str(out),
        "--result-filename",
        name,
    ]
    before = spec_counters(server.url)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise RuntimeError(f"vllm bench serve failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    after = spec_counters(server.url)
    result = json.loads((out / name).read_text())
    rounds, accepted = after[0] - before[0], after[1] - before[1]
    return dict(
        temperature=t,
        concurrency=c,
        tok_s=round(result["output_throughput"], 1),
        tpf=round(1 + accepted / rounds, 3) if rounds else 1.0,
        ttft_ms=round(result["mean_ttft_ms"], 1),
        tpot_ms=round(result["mean_tpot_ms"], 2),
        completed=result["completed"],
    )


def points(args) -> list[tuple[float, int]]:
    return [(t, c) for t in args.temperature for c in args.c]


def run_point(name: str, server, dataset: Path, t: float, c: int, args, folder: Path) -> dict:
    row = bench(server, dataset, args.models / "base", t, c, args, folder)
    if row["completed"] != args.requests:
        raise RuntimeError(f"{name}: {row['completed']} of {args.requests} done")
    row = {"method": name, **row}
    print(row, file=sys.stderr, flush=True)
    return row


def main() -> None:
    import psutil

    from vllm_idlm.launch import Server

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=DEMO_DIR)
    ap.add_argument("--lora", type=Path, default=None, help="lossless ISD: DIR/base + adapter")
    ap.add_argument("--methods", nargs="+", default=["plain", "isd", "K=3", "ngram"])
    ap.add_argument("--max-k", type=int, default=3)
    ap.add_argument("--c", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--temperature", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=Path("results/serve_sweep.csv"))
    ap.add_argument("--one-at-a-time", action="store_true", help="one server after another")
    ap.add_argument(
        "--requests", type=int, default=None, help="requests per point (default: --prompts)"
    )
    args = ap.parse_args()
    args.models = args.models.expanduser()
    args.requests = args.requests or args.prompts

    table = []
    with tempfile.TemporaryDirectory(prefix="serve_sweep_") as tmp:
        folder = Path(tmp)
        dataset = write_dataset(args.models, args, folder)
        extra = [*SERVER_FLAGS, "--max-num-seqs", str(max(args.c))]

        def server(i: int, model: Path, spec: dict | None) -> Server:
            return Server(
                model, folder / f"server_{i}.log", spec=spec, extra=extra, kv_cache_bytes=KV_BYTES
            )

        def warm(up: Server) -> Server:
            # First-request compilation (e.g. ngram's matcher), not recorded.
            bench(up, dataset, args.models / "base", 0.0, 2, args, folder, num_prompts=4)
            return up

        lora = args.lora.expanduser() if args.lora else None
        runs = [
            (m.name, m.model, m.spec)
            for m in (parse_method(t, args.models, lora, args.max_k) for t in args.methods)
        ]
        if args.one_at_a_time:
            for i, (name, model, spec) in enumerate(runs):
                with server(i, model, spec) as up:
                    warm(up)
                    for t, c in points(args):
                        table.append(run_point(name, up, dataset, t, c, args, folder))
        else:
            with contextlib.ExitStack() as stack:
                servers = {
                    name: warm(stack.enter_context(server(i, model, spec)))
                    for i, (name, model, spec) in enumerate(runs)
                }
                free = psutil.virtual_memory().available / 2**30
                print(f"{len(servers)} servers up, {free:.1f} GiB memory left", file=sys.stderr)
                names = list(servers)
                for turn, (t, c) in enumerate(points(args)):
                    for name in names[turn % len(names) :] + names[: turn % len(names)]:
                        time.sleep(QUIET_S)  # the last server's workers spin for a second
                        table.append(run_point(name, servers[name], dataset, t, c, args, folder))
    order = {name: i for i, (name, _, _) in enumerate(runs)}  # the table: method by method
    table.sort(key=lambda r: order[r["method"]])
    plain = {
        (r["temperature"], r["concurrency"]): r["tok_s"] for r in table if r["method"] == "plain"
    }
    for r in table:
        if plain:
            r["vs_plain"] = round(r["tok_s"] / plain[r["temperature"], r["concurrency"]], 3)
        print(r)
    write_table(table, args.out)
    print(
        f"{args.requests} requests from {args.prompts} held-out prompts, {args.max_tokens} tokens"
    )
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
