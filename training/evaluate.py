"""`idlm-train eval`: held-out CE and reference-ISD measurements, as a table and JSON.

Prompts are windows of held-out files (never trained on). For each stride N and for greedy and
T = 1 it reports tokens per forward, per-depth acceptance and introspective acceptance; greedy
ISD output is compared token for token with plain greedy decoding.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from vllm_idlm.formats.checkpoint import checkpoint_facts

from .block_mask import dense_mask
from .config import load_recipe
from .corpus import Document, load_corpus
from .export import load_gated_lora
from .isd_reference import DecodeStats, greedy_generate, isd_generate
from .modeling import hidden_states, load_base, trunk_and_head
from .objective import build_idlm_batch, idlm_loss
from .packing import pack_documents


def load_for_eval(model_dir: Path, lora_dir: Path | None):
    """(model, tokenizer, mask_token_id): an I-DLM checkpoint, or a base with a gated adapter."""
    model, tokenizer = load_base(model_dir)
    if lora_dir is not None:
        adapter = load_gated_lora(model, lora_dir)
        mask_id = adapter.gate.mask_token_id
    else:
        mask_id = checkpoint_facts(model_dir).mask_token_id
    model.eval()
    return model, tokenizer, mask_id


def make_prompts(
    tokenizer, docs: list[Document], count: int, length: int, seed: int
) -> list[list[int]]:
    """`count` prompts of `length` tokens at seeded offsets of held-out documents."""
    gen = torch.Generator().manual_seed(seed)
    encoded = [
        ids
        for ids in tokenizer([d.text for d in docs], add_special_tokens=False)["input_ids"]
        if len(ids) > 2 * length
    ]
    if not encoded:
        raise ValueError(f"no held-out document is longer than {2 * length} tokens")
    prompts = []
    for i in range(count):
        ids = encoded[i % len(encoded)]
        start = int(torch.randint(0, len(ids) - 2 * length, (1,), generator=gen))
        prompts.append(ids[start : start + length])
    return prompts


@torch.no_grad()
def heldout_ce(
    model,
    tokenizer,
    docs: list[Document],
    mask_id: int,
    stride: int,
    seq_len: int = 256,
    max_windows: int = 16,
) -> dict[str, float]:
    """MASK-row CE and clean CE of the conversion objective on held-out windows."""
    data = pack_documents(tokenizer, docs, seq_len)
    ids, loss_mask = data.input_ids[:max_windows], data.loss_mask[:max_windows]
    batch = build_idlm_batch(ids, loss_mask, mask_id)
    hidden = hidden_states(
        model, batch.input_ids, batch.position_ids, dense_mask(seq_len, stride - 1)
    )
    parts = idlm_loss(hidden, trunk_and_head(model)[1], batch, alpha=1.0, balance="fixed")
    return {"mask_ce": float(parts.mask_ce), "clean_ce": float(parts.clean_ce)}


def measure(
    model,
    prompts: list[list[int]],
    mask_id: int,
    strides: list[int],
    max_new: int,
    seed: int,
    tokenizer=None,
    temperatures: tuple[float, ...] = (0.0, 1.0),
    eos_token_id: int | None = None,
    check_plain: bool = True,
) -> dict[str, Any]:
    """ISD rows per (N, T); `chars_per_forward` (given a tokenizer) is TPF in characters,
    comparable across vocabulary sizes. With `eos_token_id` a generation stops at EOS."""
    results: dict[str, Any] = {"isd": []}
    plain = [
        greedy_generate(model, p, max_new, mask_id, eos_token_id) if check_plain else None
        for p in prompts
    ]
    for stride in strides:
        for temperature in temperatures:
            total = DecodeStats()
            matches, chars = 0, 0
            for i, prompt in enumerate(prompts):
                out, stats = isd_generate(
                    model, prompt, stride, max_new, mask_id, temperature, seed + i, eos_token_id
                )
                total.merge(stats)
                chars += len(tokenizer.decode(out)) if tokenizer is not None else 0
                matches += int(temperature == 0.0 and out == plain[i])
            row = {
                "stride": stride,
                "temperature": temperature,
                "tokens_per_forward": round(total.tokens_per_forward, 3),
                "acceptance_by_depth": [round(a, 3) for a in total.acceptance_by_depth],
                "introspective_acceptance": round(total.introspective_acceptance, 3),
                "chars_per_forward": round(chars / max(1, total.num_forwards), 2),
                "forwards": total.num_forwards,
                "tokens": total.num_tokens,
            }
            if temperature == 0.0 and check_plain:
                row["greedy_matches_plain"] = f"{matches}/{len(prompts)}"
            results["isd"].append(row)
    return results


def format_table(results: dict[str, Any]) -> str:
    lines = [
        f"{'N':>2} {'T':>3} {'TPF':>6} {'chars/F':>7} {'intro':>6}  acceptance by depth   greedy==AR"
    ]
    for r in results["isd"]:
        depths = " ".join(f"{a:.2f}" for a in r["acceptance_by_depth"])
        lines.append(
            f"{r['stride']:>2} {r['temperature']:>3.1f} {r['tokens_per_forward']:>6.3f} {r['chars_per_forward']:>7.2f} {r['introspective_acceptance']:>6.3f}  {depths:<20} {r.get('greedy_matches_plain', '')}"
        )
    return "\n".join(lines)


def chat_prompts(tokenizer, recipe, count: int) -> list[list[int]]:
    """The first `count` held-out chat prompts of a chat recipe (a `ChatRecipe`, or a preset
    name or JSON path), as template-rendered ids."""
    from .chat_recipe import load_chat_recipe
    from .instructions import chat_prompt_ids, heldout_chat_prompts

    if isinstance(recipe, str):
        recipe = load_chat_recipe(recipe)
    conversations = heldout_chat_prompts(count, recipe.instructions)
    return chat_prompt_ids(tokenizer, conversations)


def run_eval(args) -> dict[str, Any]:
    model, tokenizer, mask_id = load_for_eval(args.model, args.lora)
    results: dict[str, Any] = {
        "model": str(args.model),
        "lora": str(args.lora) if args.lora else None,
    }
    if args.chat:
        prompts = chat_prompts(tokenizer, args.recipe, args.prompts)
        eos = tokenizer.eos_token_id
        results.update(prompts=len(prompts), prompts_from="held-out chat", stop_at_eos=True)
    else:
        _, heldout = load_corpus(load_recipe(args.recipe).corpus)
        prompts = make_prompts(tokenizer, heldout, args.prompts, args.prompt_len, args.seed)
        eos = None
        results.update(prompts=len(prompts), prompt_len=args.prompt_len)
        results["heldout"] = {
            str(n): heldout_ce(model, tokenizer, heldout, mask_id, n) for n in args.strides
        }
    results["max_new"] = args.max_new
    results.update(
        measure(
            model,
            prompts,
            mask_id,
            args.strides,
            args.max_new,
            args.seed,
            tokenizer,
            tuple(args.temperatures),
            eos,
            not args.no_plain,
        )
    )
    print(
        f"{args.model}{' + ' + str(args.lora) if args.lora else ''}: {len(prompts)} held-out prompts x {args.max_new} tokens"
    )
    if "heldout" in results:
        print(
            "held-out CE (mask/clean): "
            + ", ".join(
                f"N={n}: {v['mask_ce']:.3f}/{v['clean_ce']:.3f}"
                for n, v in results["heldout"].items()
            )
        )
    print(format_table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return results
