"""Timed generation runs for the demo and the benchmarks (vLLM-free: takes an `LLM`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from vllm_idlm.metrics import IsdMetrics, read_isd_metrics


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
    """Generate for token-id prompts; `concurrency=1` submits them one at a time,
    otherwise all at once (the engine's max_num_seqs bounds the batch)."""
    before = read_isd_metrics(llm.get_metrics())
    batches = [[p] for p in prompts] if concurrency == 1 else [prompts]
    outputs: list[list[int]] = []
    start = time.perf_counter()
    for batch in batches:
        results = llm.generate(
            [{"prompt_token_ids": list(p)} for p in batch], params, use_tqdm=False
        )
        outputs += [list(r.outputs[0].token_ids) for r in results]
    seconds = time.perf_counter() - start
    return RunResult(outputs, seconds, read_isd_metrics(llm.get_metrics()).minus(before))
