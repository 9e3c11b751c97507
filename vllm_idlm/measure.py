"""Timed generation runs for the demo and the benchmarks (vLLM-free: takes an `LLM`)."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

from vllm_idlm.metrics import IsdMetrics, read_isd_metrics

_RUNS = itertools.count()


@dataclass(frozen=True)
class RunResult:
    outputs: list[list[int]]
    seconds: float
    metrics: IsdMetrics
    # Forwards the requests took (a request's step that emitted tokens counts once): tokens
    # per forward, for every method alike and clock-free (0 without a closed loop).
    forwards: int = 0

    @property
    def tokens_per_forward(self) -> float:
        return self.num_tokens / self.forwards if self.forwards else 0.0

    @property
    def num_tokens(self) -> int:
        return sum(len(o) for o in self.outputs)

    @property
    def tokens_per_second(self) -> float:
        return self.num_tokens / self.seconds if self.seconds else 0.0


def timed_generate(
    llm: Any, prompts: list[list[int]], params: Any, concurrency: int | None = None
) -> RunResult:
    """Generate for token-id prompts. `concurrency=c` keeps exactly c requests in flight
    (a closed loop: a finished request is replaced at once, as c clients would do);
    None submits them all at once (the engine's max_num_seqs bounds the batch).
    `params` may be one SamplingParams or one per prompt."""
    before = read_isd_metrics(llm.get_metrics())
    per_prompt = params if isinstance(params, list) else [params] * len(prompts)
    start = time.perf_counter()
    forwards = 0
    if concurrency is None:
        results = llm.generate(
            [{"prompt_token_ids": list(p)} for p in prompts], per_prompt, use_tqdm=False
        )
        outputs = [list(r.outputs[0].token_ids) for r in results]
    else:
        outputs, forwards = _closed_loop(llm.llm_engine, prompts, per_prompt, concurrency)
    seconds = time.perf_counter() - start
    metrics = read_isd_metrics(llm.get_metrics()).minus(before)
    return RunResult(outputs, seconds, metrics, forwards)


def _closed_loop(engine: Any, prompts, params, concurrency: int) -> tuple[list[list[int]], int]:
    """The outputs, and the forwards that emitted tokens (one per request and step)."""
    tag = f"run{next(_RUNS)}"
    waiting = list(range(len(prompts)))
    in_flight: set[str] = set()
    outputs: list[list[int]] = [[] for _ in prompts]
    emitted = dict.fromkeys(range(len(prompts)), 0)
    forwards = 0
    while waiting or in_flight:
        while waiting and len(in_flight) < concurrency:
            i = waiting.pop(0)
            rid = f"{tag}-{i}"
            engine.add_request(rid, {"prompt_token_ids": list(prompts[i])}, params[i])
            in_flight.add(rid)
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
    return outputs, forwards
