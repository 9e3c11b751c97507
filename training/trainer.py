"""The optimisation loop shared by `base`, `convert` and `lora`.

AdamW with warmup + cosine, gradient accumulation, bf16 autocast on GPU, gradient clipping,
a tqdm bar, a JSONL log, and checkpoints of the trainable state that a rerun resumes from.
Batches are a pure function of (seed, step), so a resumed run matches an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from .config import TrainConfig
from .distributed import DistInfo, all_reduce_mean
from .packing import PackedData, batch_indices

# step_fn(step, input_ids, loss_mask, clean_loss, doc_ids) -> (loss to backprop, metrics);
# clean_loss [B] bool: may the window's clean (AR) rows carry a loss (PackedData.clean_loss);
# doc_ids [B, L] or None: documents packed in a window never attend to each other
StepFn = Callable[
    [int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None],
    tuple[torch.Tensor, dict[str, float]],
]
# hook(step, ckpt_dir, dist), after each resume checkpoint.
CheckpointHook = Callable[[int, Path, DistInfo], None]


def lr_factor(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine


def make_optimizer(model, cfg: TrainConfig) -> torch.optim.Optimizer:
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not params:
        raise ValueError("model has no trainable parameters")
    decay = [p for n, p in params if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in params if not (p.ndim >= 2 and "embed" not in n)]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


def _trainable_state(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _local(value):
    """This rank's shard of an FSDP2 (DTensor) tensor; a plain tensor as it is."""
    return value.to_local() if hasattr(value, "to_local") else value


def _to_local(tree):
    if isinstance(tree, torch.Tensor):
        return _local(tree).detach().clone()
    if isinstance(tree, dict):
        return {k: _to_local(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_to_local(v) for v in tree)
    return tree


def ckpt_file(ckpt_dir: Path, dist: DistInfo) -> Path:
    """One file per rank when sharded (each holds its own shards and optimizer state)."""
    return ckpt_dir / ("state.pt" if dist.world_size == 1 else f"state-rank{dist.rank}.pt")


def _barrier(dist: DistInfo) -> None:
    if dist.world_size > 1:
        import torch.distributed

        torch.distributed.barrier()


def _save_ckpt(ckpt_dir: Path, model, opt, step: int, dist: DistInfo) -> None:
    """Every rank writes its file into a fresh folder that then replaces the old one."""
    tmp = ckpt_dir.with_suffix(".tmp")
    if _renames(dist):
        shutil.rmtree(tmp, ignore_errors=True)
    _barrier(dist)
    tmp.mkdir(parents=True, exist_ok=True)
    params = {n: _local(p).detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    state = {"step": step, "params": params, "optim": _to_local(opt.state_dict())}
    torch.save(state, ckpt_file(tmp, dist))
    _barrier(dist)
    if _renames(dist):
        if ckpt_dir.exists():
            shutil.rmtree(ckpt_dir)
        tmp.rename(ckpt_dir)
    _barrier(dist)


def _renames(dist: DistInfo) -> bool:
    """The process that swaps the folder: one per machine (ranks of a machine share it)."""
    import os

    return int(os.environ.get("LOCAL_RANK", dist.rank)) == 0


def _load_ckpt(ckpt_dir: Path, model, opt, dist: DistInfo) -> int:
    state_file = ckpt_file(ckpt_dir, dist)
    if not state_file.is_file():
        return 0
    state = torch.load(state_file, map_location="cpu", weights_only=True)
    named = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state["params"].items():
            _local(named[name]).copy_(value)
    opt.load_state_dict(state["optim"])
    _reshard_optimizer_state(opt)
    return int(state["step"])


def _reshard_optimizer_state(opt) -> None:
    """Per-parameter optimizer tensors loaded as local shards become DTensors again, laid out
    like their (FSDP2-sharded) parameter."""
    for group in opt.param_groups:
        for param in group["params"]:
            if not hasattr(param, "to_local"):
                continue
            from torch.distributed.tensor import DTensor

            for key, value in opt.state.get(param, {}).items():
                plain = isinstance(value, torch.Tensor) and not isinstance(value, DTensor)
                if plain and value.ndim > 0 and value.shape == param.to_local().shape:
                    opt.state[param][key] = DTensor.from_local(
                        value,
                        param.device_mesh,
                        param.placements,
                        run_check=False,
                        shape=param.shape,
                        stride=param.stride(),
                    )


def _save_snapshot(folder: Path, model, step: int, seconds: float) -> None:
    """The trainable state at `step`, kept after the run (a point of a quality-vs-time curve)."""
    folder.mkdir(parents=True, exist_ok=True)
    state = {"step": step, "seconds": round(seconds, 3), "params": _trainable_state(model)}
    torch.save(state, folder / f"step{step:06d}.pt")


def _logged_seconds(path: Path, start: int) -> float:
    """Training seconds before a resume (from the log), so `seconds` counts the whole run."""
    if not start or not path.is_file():
        return 0.0
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    recs = [r for r in recs if r["step"] <= start and "seconds" in r]
    return float(recs[-1]["seconds"]) if recs else 0.0


def _open_log(path: Path, start: int):
    """Append after a resume, dropping records past the checkpoint (they will be redone)."""
    kept = []
    if start and path.is_file():
        kept = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= start]
    log = path.open("w")
    log.writelines(line + "\n" for line in kept)
    log.flush()  # read back at once for the seconds before the resume
    return log


def _autocast(cfg: TrainConfig, device: torch.device):
    if cfg.precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train(
    model,
    data: PackedData,
    step_fn: StepFn,
    cfg: TrainConfig,
    work_dir: Path,
    desc: str,
    dist: DistInfo | None = None,
    checkpoint_hooks: Sequence[CheckpointHook] = (),
) -> dict[str, float]:
    """Run `cfg.steps` optimizer steps over `data`; resumes from `work_dir/ckpt` if present.
    Each of `checkpoint_hooks` runs on every rank after each resume checkpoint (Ray Train's
    worker reports the checkpoint to Ray's storage through one)."""
    dist = dist or DistInfo()
    work_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    opt = make_optimizer(model, cfg)
    ckpt_dir = work_dir / "ckpt"
    start = _load_ckpt(ckpt_dir, model, opt, dist)
    log = _open_log(work_dir / "train_log.jsonl", start) if dist.is_main else None
    bar = tqdm(
        range(start, cfg.steps),
        desc=desc,
        initial=start,
        total=cfg.steps,
        disable=not dist.is_main,
        mininterval=2.0,
    )
    model.train()
    last: dict[str, float] = {}
    t0, tokens = time.time(), 0
    seconds_before = _logged_seconds(work_dir / "train_log.jsonl", start)
    for step in bar:
        lr = cfg.lr * lr_factor(step, cfg)
        for group in opt.param_groups:
            group["lr"] = lr
        metrics = _one_step(model, data, step_fn, cfg, step, opt, dist)
        tokens += cfg.batch_size * cfg.grad_accum * cfg.seq_len * dist.world_size
        last = {k: all_reduce_mean(v, dist) for k, v in metrics.items()}
        bar.set_postfix({k: f"{v:.3f}" for k, v in last.items()}, refresh=False)
        done = step + 1
        if log and (done % cfg.log_every == 0 or done == cfg.steps):
            elapsed = time.time() - t0
            rec = {
                "step": done,
                "lr": lr,
                "tok_per_s": tokens / elapsed,
                "seconds": round(seconds_before + elapsed, 1),
                **last,
            }
            log.write(json.dumps(rec) + "\n")
            log.flush()
        if cfg.ckpt_every and done % cfg.ckpt_every == 0 and done < cfg.steps:
            _save_ckpt(ckpt_dir, model, opt, done, dist)
            for hook in checkpoint_hooks:
                hook(done, ckpt_dir, dist)
        if dist.is_main and cfg.snapshot_every and done % cfg.snapshot_every == 0:
            _save_snapshot(work_dir / "snapshots", model, done, seconds_before + time.time() - t0)
    if log:
        log.close()
    model.eval()
    return last


def _one_step(model, data, step_fn, cfg, step, opt, dist) -> dict[str, float]:
    totals: dict[str, float] = {}
    for micro in range(cfg.grad_accum):
        draw = (step * cfg.grad_accum + micro) * dist.world_size + dist.rank
        idx = batch_indices(len(data), cfg.batch_size, draw, cfg.seed)
        ids = data.input_ids[idx].to(dist.device)
        mask = data.loss_mask[idx].to(dist.device)
        clean = data.clean_rows(idx).to(dist.device)
        docs = data.doc_rows(idx)
        docs = docs.to(dist.device) if docs is not None else None
        with _autocast(cfg, dist.device):
            loss, metrics = step_fn(step, ids, mask, clean, docs)
        (loss / cfg.grad_accum).backward()
        for k, v in metrics.items():
            totals[k] = totals.get(k, 0.0) + v / cfg.grad_accum
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.grad_clip:
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return totals


def finish(work_dir: Path) -> None:
    """Drop the resume checkpoint once the final model is exported."""
    shutil.rmtree(work_dir / "ckpt", ignore_errors=True)
