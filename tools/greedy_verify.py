"""What an all-greedy ISD step's verification costs on CPU: the PyTorch reference pass
(`verify_and_draft`, ~100 small tensor operations) against the host path the sampler takes
for such a batch (one argmax over the rows, `verifier.verify_greedy` on the lists), and
PyTorch's argmax against the blocked one (`argmax_rows`) at the rows' shapes.

    python benchmarks/greedy_verify.py --vocab 1024 49152 --threads 1

Each batch: `--requests` requests at stride k (k drafts and k MASK rows each, random
logits). Microseconds per call, the best of `--repeats` means of `--calls` calls; vLLM's CPU
worker runs one OpenMP thread on this machine, hence `--threads 1`.
"""

from __future__ import annotations

import argparse
import functools
import time

import torch

from idlm_kernels.argmax import argmax_rows, argmax_without
from vllm_idlm.verifier import verify_and_draft, verify_greedy

MASK = 3


def best_us(fn, calls: int, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return min(times) * 1e6


def reference(logits, drafts, n, m, zeros) -> None:
    """The PyTorch pass, as the sampler ran it for every batch (its one host sync included)."""
    step = verify_and_draft(logits, drafts, None, n, m, zeros, None, None, None, MASK, True)
    torch.cat([step.num_accepted, step.next_draft_ids]).tolist()


def host(logits, per_request, m, k) -> None:
    """The sampler's all-greedy CPU path: one argmax, the rest on lists."""
    emitted, _, _ = verify_greedy(argmax_without(logits, MASK).tolist(), per_request, m)
    torch.tensor([e + [-1] * (k + 1 - len(e)) for e in emitted])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, nargs="+", default=[1024, 49152])
    ap.add_argument("--requests", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--strides", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    for vocab in args.vocab:
        for b in args.requests:
            for k in args.strides:
                n, m = [k] * b, [k] * b
                rows = b * (1 + 2 * k)
                logits = torch.randn(rows, vocab, generator=gen)
                drafts = torch.randint(MASK + 1, vocab, (b * k,), generator=gen)
                per_request = [tuple(drafts[i * k : (i + 1) * k].tolist()) for i in range(b)]
                zeros = torch.zeros(b)
                timings = [
                    best_us(f, args.calls, args.repeats)
                    for f in (
                        functools.partial(reference, logits, drafts, n, m, zeros),
                        functools.partial(host, logits, per_request, m, k),
                        functools.partial(torch.argmax, logits, dim=-1),
                        functools.partial(argmax_rows, logits),
                    )
                ]
                print(
                    f"vocab {vocab:6d}  requests {b:3d}  k {k}  rows {rows:4d}:  "
                    "verify reference {:8.0f} us, host {:8.0f} us;  "
                    "argmax torch {:8.0f} us, blocked {:8.0f} us".format(*timings),
                    flush=True,
                )


if __name__ == "__main__":
    main()
