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
    if concurrency is None:
        results = llm.generate(
            [{"prompt_token_ids": list(p)} for p in prompts], per_prompt, use_tqdm=False
        )
        outputs = [list(r.outputs[0].token_ids) for r in results]
    else:
        outputs = _closed_loop(llm.llm_engine, prompts, per_prompt, concurrency)
    seconds = time.perf_counter() - start
    return RunResult(outputs, seconds, read_isd_metrics(llm.get_metrics()).minus(before))


def _closed_loop(engine: Any, prompts, params, concurrency: int) -> list[list[int]]:
    tag = f"run{next(_RUNS)}"
    waiting = list(range(len(prompts)))
    in_flight: set[str] = set()
    outputs: list[list[int]] = [[] for _ in prompts]
    while waiting or in_flight:
        while waiting and len(in_flight) < concurrency:
            i = waiting.pop(0)
            rid = f"{tag}-{i}"
            engine.add_request(rid, {"prompt_token_ids": list(prompts[i])}, params[i])
            in_flight.add(rid)
        for out in engine.step():
            if out.finished and out.request_id in in_flight:
                in_flight.discard(out.request_id)
                outputs[int(out.request_id.rsplit("-", 1)[1])] = list(out.outputs[0].token_ids)
    return outputs
