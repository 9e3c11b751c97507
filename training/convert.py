"""AR -> I-DLM conversion (full fine-tune) and gated-LoRA training over a frozen base."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .config import ConvertConfig, LoraConfig, TrainConfig
from .corpus import Document
from .curriculum import make_idlm_step
from .distributed import full_state_dict, setup, shard
from .export import save_gated_lora, save_idlm_checkpoint, save_tokenizer
from .gated_lora import attach_gated_lora
from .modeling import cast_frozen_linears, load_base, set_attention
from .packing import PackedData, pack_documents
from .rollouts import mix_in_rollouts, mix_windows, read_rollout_file, rollout_windows
from .tokenizer import apply_mask_plan, ensure_mask_token
from .trainer import CheckpointHook, finish, train


def _prepare(base_path: Path, ccfg: ConvertConfig, tcfg: TrainConfig):
    """Validate cheap things first, then load the base and give it a MASK token."""
    ccfg.check_seq_len(tcfg.seq_len)
    model, tokenizer = load_base(base_path)
    plan = ensure_mask_token(tokenizer, model.get_input_embeddings().weight.shape[0])
    apply_mask_plan(model, plan)
    return model, tokenizer, plan.mask_token_id


def _training_data(model, tokenizer, docs, ccfg, tcfg, mask_id, dist) -> PackedData:
    """Corpus windows, with `ccfg.rollouts` of the drawn windows replaced by the model's own."""
    draws = tcfg.steps * tcfg.batch_size * tcfg.grad_accum * dist.world_size
    if ccfg.rollout_file:
        return _file_rollouts(tokenizer, docs, ccfg, tcfg, mask_id, draws, dist)
    data = pack_documents(tokenizer, docs, tcfg.seq_len, tcfg.max_tokens)
    if not ccfg.rollouts:
        return data
    t0 = time.time()
    mixed = mix_in_rollouts(
        model.to(dist.device),
        data,
        ccfg.rollouts,
        ccfg.rollout_greedy,
        ccfg.rollout_prompt,
        draws,
        mask_id,
        tcfg.seed,
    )
    if dist.is_main:
        count = int((~mixed.clean_loss).sum()) if mixed.clean_loss is not None else 0
        print(f"rollouts: {count} windows of {tcfg.seq_len} in {time.time() - t0:.0f}s", flush=True)
    return mixed


def _file_rollouts(tokenizer, docs, ccfg, tcfg, mask_id, draws, dist) -> PackedData:
    """Windows of the rollout file (vLLM's answers), mixed with corpus windows if rollouts < 1."""
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    records = read_rollout_file(ccfg.rollout_file)
    windows = rollout_windows(records, tcfg.seq_len, pad_id, mask_id, ccfg.rollout_clean, tcfg.seed)
    corpus = None
    if ccfg.rollouts < 1:
        if not docs:
            raise ValueError(f"rollouts={ccfg.rollouts} < 1 needs corpus documents for the rest")
        corpus = pack_documents(tokenizer, docs, tcfg.seq_len, tcfg.max_tokens)
    if dist.is_main:
        answer = int(windows.loss_mask.sum())
        epochs = draws * ccfg.rollouts / len(windows)
        print(
            f"rollout file: {len(records)} answers ({answer} tokens) in {len(windows)} windows "
            f"of {tcfg.seq_len}; {epochs:.1f} epochs over them",
            flush=True,
        )
    return mix_windows(corpus, windows, ccfg.rollouts, draws, tcfg.seed)


def _attn_for(ccfg: ConvertConfig, device) -> str:
    use_flex = ccfg.attention == "flex" or (ccfg.attention == "auto" and device.type == "cuda")
    return "flex_attention" if use_flex else "sdpa"


def convert(
    base_path: Path,
    train_docs: list[Document],
    ccfg: ConvertConfig,
    tcfg: TrainConfig,
    out: Path,
    work: Path,
    recipe: dict[str, Any] | None = None,
    checkpoint_hooks: Sequence[CheckpointHook] = (),
) -> Path:
    """Full fine-tune of the base with the I-DLM objective; exports an I-DLM checkpoint."""
    dist = setup()
    model, tokenizer, mask_id = _prepare(base_path, ccfg, tcfg)
    data = _training_data(model, tokenizer, train_docs, ccfg, tcfg, mask_id, dist)
    model = shard(model.to(dist.device), dist, bf16=tcfg.precision == "bf16")
    set_attention(model, _attn_for(ccfg, dist.device))
    step_fn = make_idlm_step(model, ccfg, mask_id, tcfg.seq_len, tcfg.steps, dist.device)
    train(model, data, step_fn, tcfg, work, "convert", dist, checkpoint_hooks)
    set_attention(model, "sdpa")
    full = full_state_dict(model, dist)  # collective under FSDP; None single-process
    if dist.is_main:
        recipe = {"convert": _asdict(ccfg), "train": _asdict(tcfg), **(recipe or {})}
        model = model if full is not None else model.cpu()
        save_idlm_checkpoint(model, tokenizer, out, mask_id, ccfg.strides, recipe, full)
        finish(work)
    return out


def train_lora(
    base_path: Path,
    train_docs: list[Document],
    lcfg: LoraConfig,
    ccfg: ConvertConfig,
    tcfg: TrainConfig,
    out: Path,
    work: Path,
    recipe: dict[str, Any] | None = None,
    checkpoint_hooks: Sequence[CheckpointHook] = (),
) -> Path:
    """Gated LoRA over the frozen base, MASK-row loss only; exports PEFT files + gate metadata."""
    dist = setup()
    if dist.world_size > 1:
        # Nothing would all-reduce the adapter's gradients: each rank would train its own.
        raise ValueError(
            f"the lora stage runs in one process (got WORLD_SIZE={dist.world_size}); "
            "data-parallel training is the convert / base stages' (FSDP)"
        )
    model, tokenizer, mask_id = _prepare(base_path, ccfg, tcfg)
    data = _training_data(model, tokenizer, train_docs, ccfg, tcfg, mask_id, dist)
    adapter = attach_gated_lora(model, lcfg, mask_id)
    model.to(dist.device)
    if tcfg.precision == "bf16":
        cast_frozen_linears(model, torch.bfloat16)
    step_fn = make_idlm_step(
        model, ccfg, mask_id, tcfg.seq_len, tcfg.steps, dist.device, alpha=0.0, clean_grad=False
    )
    train(model, data, step_fn, tcfg, work, "lora", dist, checkpoint_hooks)
    if dist.is_main:
        model.cpu()
        recipe = {
            "lora": _asdict(lcfg),
            "convert": _asdict(ccfg),
            "train": _asdict(tcfg),
            **(recipe or {}),
        }
        save_gated_lora(adapter, out, str(base_path), ccfg.strides, recipe)
        save_tokenizer(tokenizer, out)
        finish(work)
    return out


def _asdict(cfg) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(cfg)
