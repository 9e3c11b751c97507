"""What the benchmarks share: engine settings, prompt sets, methods and the interleaved harness.

Every method runs in an engine of its own, in a process of its own (`Engine`), all of them up
at once and taking turns round after round, in a rotated order, with a quiet gap between runs
(vLLM's workers spin for a second after their last step): interleaving puts every method under
the same machine load, where runs one after another compared a machine whose speed drifts by a
third over a quarter of an hour (DECISIONS.md). A process per engine keeps each engine's
metrics its own, and lets a method run another checkout of the plugin (`Method.pythonpath`).
Two identical engines differ by up to 12 points in one run here: the A/A spread is measured by
running a method twice (`name@2`), and a difference inside it is a tie.
"""

from __future__ import annotations

import csv
import json
import multiprocessing as mp
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# vLLM's shm message queue spins (sched_yield) for 1 s after a worker's last read: the seconds
# left between two engines' runs.
QUIET_S = 1.5
ENGINE = dict(
    dtype="float32",
    max_model_len=1024,
    kv_cache_memory_bytes=1 << 30,
    enforce_eager=True,  # torch.compile costs a minute per engine on CPU and gains ~2% here
    disable_log_stats=False,
    seed=0,
    use_tqdm_on_load=False,
)
DEMO_DIR = Path("~/.cache/vllm-idlm/demo")
SMOLLM2_DIR = Path("~/.cache/vllm-idlm/smollm2")
WORKLOADS = ("demo", "chat", "code", "edit")


# ---- prompt sets ---------------------------------------------------------------------------


def demo_prompts(models: Path, count: int, length: int = 32) -> list[list[int]]:
    """Held-out stdlib source (files the demo models never trained on), `length` tokens each."""
    from transformers import AutoTokenizer

    from idlm_training.config import load_recipe
    from idlm_training.corpus import load_corpus
    from idlm_training.evaluate import make_prompts

    tokenizer = AutoTokenizer.from_pretrained(models / "base")
    _, docs = load_corpus(load_recipe("demo").corpus)
    return make_prompts(tokenizer, docs, count=count, length=length, seed=1234)


def chat_requests(workload: str, count: int) -> list[list[dict[str, str]]]:
    """Held-out chat requests (stdlib modules never used for training) of one workload:
    `chat`, free-form prose, no code asked or shown; `code`, writing a function or class from
    its description; `edit`, rewriting a function it was shown (type hints, a docstring)."""
    from idlm_training.chat_recipe import InstructionConfig
    from idlm_training.instructions import build_instructions

    _, heldout = build_instructions(InstructionConfig(heldout=400))  # 438 on Python 3.11
    kinds = {"code": ("write_function", "write_class"), "edit": ("type_hints", "docstring")}
    if workload == "chat":
        seen, out = set(), []
        for item in heldout:
            if item.source not in seen:
                seen.add(item.source)
                what = (
                    f"In a few sentences of plain English and without any code, say what "
                    f"`{item.source}` in Python's standard library is for and when one would "
                    "reach for it."
                )
                out.append([{"role": "user", "content": what}])
        return out[:count]
    return [i.messages for i in heldout if i.kind in kinds[workload]][:count]


def prompts_for(workload: str, models: Path, count: int) -> list[list[int]]:
    if workload == "demo":
        return demo_prompts(models, count)
    from transformers import AutoTokenizer

    from idlm_training.instructions import chat_prompt_ids

    tokenizer = AutoTokenizer.from_pretrained(models / "base")
    found = chat_prompt_ids(tokenizer, chat_requests(workload, count))
    if len(found) < count:
        raise SystemExit(f"{workload}: {len(found)} held-out prompts, {count} asked for")
    return found


# ---- methods -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Method:
    """A named engine: a checkpoint, a speculative config, and optionally another checkout of
    the plugin to import (`pythonpath`: a folder holding its `vllm_idlm`)."""

    name: str
    model: Path
    spec: dict | None = None
    pythonpath: str | None = None
    engine: dict = field(default_factory=dict)


def parse_method(text: str, models: Path, lora: Path | None, max_k: int) -> Method:
    """`plain`; `isd` (the default policy: adaptive, lookup on); `K=<k>` (fixed K); `mask`
    (adaptive, no lookup); `K=<k>-mask` (fixed K, no lookup); `idlm{...}` (those speculative-
    config keys over the default); `ngram`, `suffix` (vLLM's own, K=3; `ngram=5`: K=5); any of them followed
    by `@<tag>` (a second engine of the same method: the A/A spread) and/or `@old=<dir>` (the
    plugin imported from another checkout, e.g. a git worktree of an earlier commit)."""
    name, *tags = text.split("@")
    pythonpath = next((t.removeprefix("old=") for t in tags if t.startswith("old=")), None)
    base = models / "base"
    isd_model = base if lora else models / "idlm"  # plain and ngram decode the same model
    isd = {"method": "idlm", "num_speculative_tokens": max_k}
    if lora:
        isd["draft_lora"] = str(lora)
    if name == "plain":
        return Method(text, isd_model)
    vllm_method, _, k = name.partition("=")
    if vllm_method in ("ngram", "suffix"):
        spec = {"method": vllm_method, "num_speculative_tokens": int(k or 3)}
        if vllm_method == "ngram":
            spec.update(prompt_lookup_max=4, prompt_lookup_min=2)
        return Method(text, isd_model, spec)
    if name == "isd":
        return Method(text, isd_model, isd, pythonpath)
    if name == "mask":
        return Method(text, isd_model, {**isd, "lookup": False}, pythonpath)
    if name.startswith("K="):
        k, _, rest = name[2:].partition("-")
        spec = {**isd, "num_speculative_tokens": int(k), "adaptive": False}
        if rest == "mask":
            spec["lookup"] = False
        return Method(text, isd_model, spec, pythonpath)
    if name.startswith("idlm{"):
        return Method(text, isd_model, {**isd, **json.loads(name[4:])}, pythonpath)
    raise SystemExit(f"unknown method {text!r} ({parse_method.__doc__})")


# ---- one engine per process ----------------------------------------------------------------


@dataclass
class Run:
    """One timed run of an engine: the outputs, the seconds, the forwards the requests took (a
    request's step that emitted tokens counts once: tokens per forward for every method alike,
    clock-free) and vLLM's metrics before and after (read into `IsdMetrics` by the driver, with
    this checkout's reader, whichever plugin the engine imported)."""

    outputs: list[list[int]]
    seconds: float
    forwards: int
    metrics_before: list
    metrics_after: list

    @property
    def num_tokens(self) -> int:
        return sum(map(len, self.outputs))

    @property
    def tokens_per_second(self) -> float:
        return self.num_tokens / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.num_tokens / self.forwards if self.forwards else 0.0

    @property
    def metrics(self):
        from vllm_idlm.metrics import read_isd_metrics

        return read_isd_metrics(self.metrics_after).minus(read_isd_metrics(self.metrics_before))


def closed_loop(llm, prompts, params, concurrency: int) -> Run:
    """Keep exactly `concurrency` requests in flight (a finished one is replaced at once, as c
    clients would do) over token-id `prompts`; `params` one SamplingParams per prompt."""
    engine = llm.llm_engine
    tag = f"run{time.monotonic_ns()}"
    before = llm.get_metrics()
    start = time.perf_counter()
    waiting = list(range(len(prompts)))
    in_flight: set[str] = set()
    outputs: list[list[int]] = [[] for _ in prompts]
    emitted = dict.fromkeys(range(len(prompts)), 0)
    forwards = 0
    while waiting or in_flight:
        while waiting and len(in_flight) < concurrency:
            i = waiting.pop(0)
            engine.add_request(f"{tag}-{i}", {"prompt_token_ids": list(prompts[i])}, params[i])
            in_flight.add(f"{tag}-{i}")
        for out in engine.step():
            if out.request_id not in in_flight:
                continue
            i = int(out.request_id.rsplit("-", 1)[1])
            count = len(out.outputs[0].token_ids)
            forwards += count > emitted[i]
            emitted[i] = count
            if out.finished:
                in_flight.discard(out.request_id)
                outputs[i] = list(out.outputs[0].token_ids)
    seconds = time.perf_counter() - start
    return Run(outputs, seconds, forwards, before, llm.get_metrics())


def _serve(conn, method: Method, max_num_seqs: int) -> None:
    """The engine process: builds the LLM, then runs what the driver sends until it closes.
    Another checkout's plugin goes first on the path (spawned processes take the parent's)."""
    import sys

    if method.pythonpath:
        sys.path.insert(0, method.pythonpath)
    from vllm import LLM

    llm = LLM(
        model=str(method.model),
        speculative_config=method.spec,
        max_num_seqs=max_num_seqs,
        **{**ENGINE, **method.engine},
    )
    conn.send(("ready", _state(llm)))
    while True:
        message = conn.recv()
        if message is None:
            break
        conn.send(("done", closed_loop(llm, *message), _state(llm)))
    llm.llm_engine.engine_core.shutdown()


def _state(llm) -> dict | None:
    try:
        (state,) = llm.collective_rpc("idlm_state")
    except Exception:  # an engine without the plugin's RPC (another build, no ISD)
        return None
    return state


class Engine:
    """A method's engine in a process of its own (spawned with the method's PYTHONPATH)."""

    def __init__(self, method: Method, max_num_seqs: int) -> None:
        self.method = method
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        saved = os.environ.get("PYTHONPATH")
        if method.pythonpath:
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [method.pythonpath, saved]))
        try:
            self.process = ctx.Process(target=_serve, args=(child, method, max_num_seqs))
            self.process.start()
        finally:
            if saved is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved
        kind, self.state = self._recv()

    def _recv(self):
        while not self.conn.poll(5):
            if not self.process.is_alive():
                raise RuntimeError(f"{self.method.name}: the engine process died")
        return self.conn.recv()

    def run(self, prompts, params, concurrency: int) -> Run:
        """A closed-loop run; the engine's idlm_state after it is kept in `state`."""
        self.conn.send((prompts, params, concurrency))
        _, result, self.state = self._recv()
        return result

    def close(self) -> None:
        if self.process.is_alive():
            self.conn.send(None)
            self.process.join(timeout=60)
        if self.process.is_alive():
            self.process.kill()


# ---- the interleaved harness ---------------------------------------------------------------


@dataclass
class Tally:
    """One method at one point (concurrency, temperature): every round's figures."""

    tokens: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    outputs: list[list[list[int]]] = field(default_factory=list)
    metrics: Any = None  # IsdMetrics summed over the rounds
    forwards: int = 0  # forwards the requests took (`Run.forwards`)
    requests: int = 0

    @property
    def rate(self) -> float:
        return sum(self.tokens) / sum(self.seconds)

    def rates(self) -> list[float]:
        return [t / s for t, s in zip(self.tokens, self.seconds, strict=True)]


def ratio_range(tally: Tally, plain: Tally) -> tuple[float, float, float]:
    """The whole run's ratio to plain decoding, and the least and the largest of the rounds'
    own ratios (the rounds are paired: the same prompts, back to back)."""
    ratios = [a / b for a, b in zip(tally.rates(), plain.rates(), strict=True)]
    return tally.rate / plain.rate, min(ratios), max(ratios)


def interleave(
    engines: dict[str, Engine], batches: list[tuple[list, list]], concurrency: int
) -> dict[str, Tally]:
    """Every engine runs every batch (prompts, params) at `concurrency`, round after round,
    the order rotating from round to round."""
    names = list(engines)
    tallies = {n: Tally() for n in names}
    for r, (prompts, params) in enumerate(batches):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            time.sleep(QUIET_S)
            result = engines[name].run(prompts, params, concurrency)
            tally = tallies[name]
            tally.tokens.append(result.num_tokens)
            tally.seconds.append(result.seconds)
            tally.outputs.append(result.outputs)
            tally.requests += len(prompts)
            tally.forwards += result.forwards
            m = result.metrics
            tally.metrics = m if tally.metrics is None else _plus(tally.metrics, m)
    return tallies


def _plus(a, b):
    from dataclasses import fields, replace

    out = {}
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "num_positions":
            out[f.name] = max(x, y)
        elif isinstance(x, tuple):
            width = max(len(x), len(y))
            x, y = x + (0,) * (width - len(x)), y + (0,) * (width - len(y))
            out[f.name] = tuple(p + q for p, q in zip(x, y, strict=True))
        else:
            out[f.name] = x + y
    return replace(a, **out)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


# ---- output --------------------------------------------------------------------------------


def write_table(table: list[dict], path: Path) -> None:
    """The rows as a CSV, and beside it a PNG of tokens/s and the ratio to plain decoding
    against concurrency, per temperature (when matplotlib is installed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = list(dict.fromkeys(k for r in table for k in r))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(table)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    temps = sorted({r["temperature"] for r in table})
    fig, axes = plt.subplots(2, len(temps), figsize=(6 * len(temps), 8), squeeze=False)
    for j, t in enumerate(temps):
        for name in dict.fromkeys(r["method"] for r in table):
            rows = [r for r in table if r["method"] == name and r["temperature"] == t]
            c = [r["concurrency"] for r in rows]
            axes[0][j].plot(c, [r["tok_s"] for r in rows], marker="o", label=name)
            if all("vs_plain" in r for r in rows):
                axes[1][j].plot(c, [r["vs_plain"] for r in rows], marker="o", label=name)
        for i, label in enumerate(("output tokens/s", "ratio to plain decoding")):
            axes[i][j].set_xscale("log", base=2)
            axes[i][j].set_xlabel("concurrency")
            axes[i][j].set_ylabel(label)
            axes[i][j].set_title(f"T={t}")
            axes[i][j].grid(True, alpha=0.3)
        axes[1][j].axhline(1.0, color="k", lw=0.8)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=110)
    plt.close(fig)
