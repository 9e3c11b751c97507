"""The model's own continuations as conversion data (self-distillation at the sequence level).

A draft is accepted when it agrees with what the verifying model itself would write next, so
the MASK rows are best taught on that model's writing: corpus prefixes continued by the base,
part greedily (what greedy ISD will verify) and part sampled at T = 1 (what sampled ISD will
verify). These windows train the MASK rows only; the clean rows keep learning from the corpus,
so the converted model's own distribution is still fitted to real text.
"""

from __future__ import annotations

import torch

from .packing import PackedData


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
