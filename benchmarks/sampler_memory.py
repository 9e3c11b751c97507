"""Peak extra memory and time of one sampling step: the ISD sampler against vLLM's own.

    python benchmarks/sampler_memory.py [--vocab 151936] [--requests 256] [--k 3]

Each case runs in a fresh process (glibc's mmap threshold fixed at 1 MiB, so freed large
blocks go back to the kernel): its inputs are allocated first (logits, and the stored draft
probabilities a speculative method keeps between steps), then one warm-up call and one
measured call; "extra" is the peak resident memory during the measured call (VmHWM, reset
just before it) minus the resident memory before it. Cases, all requests random (T = 0.8, top-p 0.95) or
all greedy:

- vllm-ngram: vLLM's RejectionSampler, K drafts per request without draft probs
  (logits rows: K + 1 per request);
- vllm-eagle: the same with draft probs ([B K, V], as EAGLE / draft models keep them);
- isd: the ISD sampler (`IsdRejectionSampler`), K drafts + K MASK slots per request
  (2K + 1 rows), verifying K drafts with their stored probs and drafting K more.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from types import SimpleNamespace


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _reset_peak() -> None:
    """Linux: make the peak resident set size (VmHWM) restart from the current one."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _peak_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def run_case(case: str, vocab: int, num_reqs: int, k: int, greedy: bool) -> dict:
    import numpy as np
    import torch
    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    from vllm_idlm.config import IsdOptions
    from vllm_idlm.engine.sampler import IsdRejectionSampler
    from vllm_idlm.engine.state import IsdState, Proposal
    from vllm_idlm.plugin import register
    from vllm_idlm.seam.runner import RunnerView

    register()
    torch.manual_seed(0)
    mask = vocab - 1
    isd = case == "isd"
    slots = [[5] * k + ([mask] * k if isd else []) for _ in range(num_reqs)]
    num_slots = np.array([len(s) for s in slots])
    cu_sampled = np.cumsum(num_slots + 1)
    starts = cu_sampled - num_slots - 1
    target = np.concatenate([s + np.arange(n) for s, n in zip(starts, num_slots, strict=True)])
    as_i32 = lambda a: torch.tensor(a, dtype=torch.int32)  # noqa: E731
    metadata = SpecDecodeMetadata(
        draft_token_ids=as_i32([t for s in slots for t in s]),
        num_draft_tokens=num_slots.tolist(),
        cu_num_draft_tokens=as_i32(np.cumsum(num_slots)),
        cu_num_sampled_tokens=as_i32(cu_sampled),
        target_logits_indices=as_i32(target),
        bonus_logits_indices=as_i32(cu_sampled - 1),
        logits_indices=as_i32(np.arange(cu_sampled[-1])),
    )
    zeros = torch.zeros(num_reqs)
    sm = SamplingMetadata(
        temperature=None if greedy else torch.full((num_reqs,), 0.8),
        all_greedy=greedy,
        all_random=not greedy,
        top_p=None if greedy else torch.full((num_reqs,), 0.95),
        top_k=None,
        generators={},
        max_num_logprobs=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=zeros,
        presence_penalties=zeros,
        repetition_penalties=zeros + 1,
        output_token_ids=[[] for _ in range(num_reqs)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
        spec_token_ids=slots,
    )
    num_rows = int(cu_sampled[-1])
    logits = torch.empty(num_rows, vocab)
    sampler = Sampler()
    draft_probs = None
    if isd:
        req_ids = [f"r{i}" for i in range(num_reqs)]
        runner = SimpleNamespace(
            input_batch=SimpleNamespace(
                req_ids=req_ids, spec_token_ids=slots, greedy_reqs=set(req_ids) if greedy else set()
            ),
            requests={},
        )
        state = IsdState()
        options = IsdOptions(num_drafts=k, adaptive=False, mask_token_id=mask)
        rejection = IsdRejectionSampler(
            sampler, None, torch.device("cpu"), RunnerView(runner), options, state
        )

        def store_drafts():
            if greedy:
                return
            for r in req_ids:  # MASK-row drafts, each with its probs row (no lookup)
                probs = torch.empty(k, vocab).fill_(1.0 / vocab)
                state.proposed[r] = Proposal((5,) * k, 0, probs)

    else:
        rejection = RejectionSampler(sampler)
        if case == "vllm-eagle":
            draft_probs = torch.empty(num_reqs * k, vocab).fill_(1.0 / vocab)

        def store_drafts():
            pass

    def call():
        logits.normal_()
        logits[:, mask] = float("-inf")
        store_drafts()
        start = time.perf_counter()
        rejection(metadata, draft_probs, logits, sm)
        return time.perf_counter() - start

    call()  # warm-up
    store_drafts()
    _reset_peak()
    before = _rss_bytes()
    seconds = call()
    extra = max(0, _peak_bytes() - before)
    return {
        "case": case,
        "greedy": greedy,
        "logits_rows": num_rows,
        "extra_mb": extra / 2**20,
        "logits_mb": logits.numel() * 4 / 2**20,
        "ms": seconds * 1e3,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--child", nargs=2, metavar=("CASE", "GREEDY"))
    args = ap.parse_args()
    if args.child:
        case, greedy = args.child[0], args.child[1] == "1"
        print(json.dumps(run_case(case, args.vocab, args.requests, args.k, greedy)))
        return
    rows = []
    for greedy in (False, True):
        for case in ("vllm-ngram", "vllm-eagle", "isd"):
            if greedy and case == "vllm-eagle":
                continue
            cmd = [sys.executable, __file__, "--vocab", str(args.vocab)]
            cmd += ["--requests", str(args.requests), "--k", str(args.k)]
            cmd += ["--child", case, "1" if greedy else "0"]
            # A fixed mmap threshold: glibc hands every large block back to the kernel on
            # free, so the warm-up's buffers do not hide the measured call's peak.
            env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"vocab {args.vocab}, {args.requests} requests, K = {args.k}, CPU fp32")
    print("| case | sampling | logits rows | logits (MB) | extra peak (MB) | ms per step |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        mode = "greedy" if r["greedy"] else "T=0.8, top-p 0.95"
        print(
            f"| {r['case']} | {mode} | {r['logits_rows']} | {r['logits_mb']:.0f} "
            f"| {r['extra_mb']:.1f} | {r['ms']:.0f} |"
        )


if __name__ == "__main__":
    main()
