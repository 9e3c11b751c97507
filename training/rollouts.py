"""The model's own continuations as conversion data (self-distillation at the sequence level).

A draft is accepted when it agrees with what the verifying model itself would write next, so
the MASK rows are best taught on that model's writing: corpus prefixes continued by the base,
part greedily (what greedy ISD will verify) and part sampled at T = 1 (what sampled ISD will
verify). These windows train the MASK rows only; the clean rows keep learning from the corpus,
so the converted model's own distribution is still fitted to real text.

Two sources: `mix_in_rollouts` continues corpus prefixes in process (the demo's tiny models),
`rollout_windows` packs answers to chat prompts that vLLM wrote (`python -m vllm_idlm.rollouts`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .packing import PackedData, concat


@torch.no_grad()
def continue_prompts(
    model,
    prompts: torch.Tensor,
    new_tokens: int,
    greedy: torch.Tensor,
    banned: list[int],
    generator: torch.Generator,
    batch_size: int = 64,
) -> torch.Tensor:
    """[n, P + new_tokens] ids: each prompt continued greedily (`greedy` True) or at T = 1.

    `banned` ids (the MASK token) are never produced. Runs with a KV cache, in batches.
    """
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = []
    for start in range(0, prompts.shape[0], batch_size):
        ids = prompts[start : start + batch_size].to(device)
        pick_max = greedy[start : start + batch_size].to(device)
        step = model(input_ids=ids, use_cache=True)
        pieces = [ids]
        for _ in range(new_tokens):
            logits = step.logits[:, -1].float()
            logits[:, banned] = -float("inf")
            sampled = torch.multinomial(logits.softmax(-1).cpu(), 1, generator=generator)
            nxt = torch.where(pick_max, logits.argmax(-1), sampled[:, 0].to(device))
            pieces.append(nxt[:, None])
            step = model(
                input_ids=nxt[:, None], past_key_values=step.past_key_values, use_cache=True
            )
        out.append(torch.cat(pieces, dim=1).cpu())
    model.train(was_training)
    return torch.cat(out)


def mix_in_rollouts(
    model,
    data: PackedData,
    share: float,
    greedy_share: float,
    prompt_len: int,
    draws: int,
    mask_token_id: int,
    seed: int,
) -> PackedData:
    """Corpus windows + rollouts, sized so that `share` of the `draws` windows a run will draw
    are rollouts (one epoch over the mix). share == 0 returns `data` unchanged.

    Each rollout starts from the first `prompt_len` tokens of a corpus window (keeping that
    window's loss flags there) and is continued to the window length by `model`.
    """
    count = round(share * draws)
    if count == 0:
        return data
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(data), generator=gen)
    sources = order[torch.arange(count) % len(data)]
    keep = order[count:][: max(0, draws - count)]
    seq_len = data.input_ids.shape[1]
    greedy = torch.arange(count) < round(greedy_share * count)
    ids = continue_prompts(
        model,
        data.input_ids[sources, :prompt_len],
        seq_len - prompt_len,
        greedy,
        [mask_token_id],
        gen,
    )
    flags = torch.ones_like(ids, dtype=torch.bool)
    flags[:, :prompt_len] = data.loss_mask[sources, :prompt_len]
    clean = torch.cat([data.clean_rows(keep), torch.zeros(count, dtype=torch.bool)])
    return PackedData(
        torch.cat([data.input_ids[keep], ids]), torch.cat([data.loss_mask[keep], flags]), clean
    )


def read_rollout_file(path: str | Path) -> list[dict[str, Any]]:
    """Records of a rollout JSONL written by `python -m vllm_idlm.rollouts`, in index order
    (a torn last line of an interrupted run is skipped)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"rollout file {str(path)!r} does not exist")
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    if not records:
        raise ValueError(f"rollout file {str(path)!r} holds no records")
    return sorted(records, key=lambda r: r.get("index", 0))


def rollout_windows(
    records: list[dict[str, Any]],
    seq_len: int,
    pad_id: int,
    mask_token_id: int,
    clean_temperatures: tuple[float, ...] = (),
    seed: int = 0,
) -> PackedData:
    """Prompt + answer of each record as one document (prompt: no loss), packed whole into
    windows of `seq_len` (first fit, seeded order; a longer one is cut); documents sharing
    a window never attend to each other (`doc_ids`).

    Windows train the MASK rows only (`clean_loss` False), except those packed from records
    sampled at a temperature in `clean_temperatures` (kept in windows of their own).
    """
    groups: dict[bool, list[tuple[list[int], list[bool]]]] = {False: [], True: []}
    for rec in records:
        prompt, answer = list(rec["prompt_ids"]), list(rec["completion_ids"])
        if not answer:
            continue
        if not prompt:
            raise ValueError(f"rollout {rec.get('index')} has an empty prompt")
        if mask_token_id in prompt or mask_token_id in answer:
            raise ValueError(f"rollout {rec.get('index')} contains the MASK token {mask_token_id}")
        ids = (prompt + answer)[:seq_len]
        flags = ([False] * len(prompt) + [True] * len(answer))[:seq_len]
        if any(flags[1:]):
            groups[float(rec["temperature"]) in clean_temperatures].append((ids, flags))
    gen = torch.Generator().manual_seed(seed)
    parts = [
        _pack_whole(
            [docs[i] for i in torch.randperm(len(docs), generator=gen)], seq_len, pad_id, clean
        )
        for clean, docs in groups.items()
        if docs
    ]
    if not parts:
        raise ValueError("no rollout has an answer to train on")
    return concat(parts)


def _pack_whole(docs, seq_len: int, pad_id: int, clean: bool) -> PackedData:
    windows: list[list[tuple[list[int], list[bool]]]] = []
    free: list[int] = []
    for doc in docs:
        slot = next((w for w, room in enumerate(free) if room >= len(doc[0])), None)
        if slot is None:
            windows.append([])
            free.append(seq_len)
            slot = len(windows) - 1
        windows[slot].append(doc)
        free[slot] -= len(doc[0])
    n = len(windows)
    input_ids = torch.full((n, seq_len), pad_id, dtype=torch.long)
    loss_mask = torch.zeros(n, seq_len, dtype=torch.bool)
    doc_ids = torch.full((n, seq_len), -1, dtype=torch.long)
    for w, members in enumerate(windows):
        at = 0
        for d, (ids, flags) in enumerate(members):
            input_ids[w, at : at + len(ids)] = torch.tensor(ids)
            loss_mask[w, at : at + len(ids)] = torch.tensor(flags)
            doc_ids[w, at : at + len(ids)] = d
            at += len(ids)
    return PackedData(input_ids, loss_mask, torch.full((n,), clean), doc_ids)


def mix_windows(
    corpus: PackedData | None, rollouts: PackedData, share: float, draws: int, seed: int
) -> PackedData:
    """`share` of the `draws` windows a run draws come from `rollouts`, the rest from `corpus`
    (one epoch over the mix); share 1 (or no corpus) = the rollout windows alone."""
    if corpus is None or share >= 1:
        return rollouts
    gen = torch.Generator().manual_seed(seed)
    count = round(share * draws)
    picks = torch.randperm(len(rollouts), generator=gen)[torch.arange(count) % len(rollouts)]
    keep = torch.randperm(len(corpus), generator=gen)[: max(0, draws - count)]
    return concat([corpus.select(keep), rollouts.select(picks)])
