"""The training stages (`idlm-train base | convert | lora`): their flags, and one run.

`cli.py` offers them beside the other commands (and imports `ray_train.py` for `idlm-train
ray`); `ray_train.py` runs one on each Ray Train worker through this module, passing its
checkpoint hooks in (`trainer.train` calls each on every rank after every resume checkpoint).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .config import Recipe, load_recipe

if TYPE_CHECKING:
    from .trainer import CheckpointHook

STAGES = ("base", "convert", "lora")


def add_stage_parsers(sub) -> None:
    p = sub.add_parser("base", help="train a tokenizer and a tiny Qwen3 AR model on a corpus")
    _add_train_flags(p)
    for name in ("convert", "lora"):
        p = sub.add_parser(
            name,
            help="AR -> I-DLM full conversion"
            if name == "convert"
            else "gated LoRA over a frozen base",
        )
        _add_train_flags(p)
        p.add_argument("--base", required=True, type=Path, help="base checkpoint directory")
        p.add_argument(
            "--strides", nargs="+", type=int, help="strides N to train for (K = N - 1 drafts)"
        )
        p.add_argument("--alpha", type=float)
        p.add_argument("--balance", choices=["fixed", "auto"])
        p.add_argument(
            "--distill", type=float, help="share of the MASK loss against the clean rows (0-1)"
        )
        p.add_argument(
            "--rollouts", type=float, help="share of windows that are the base's own continuations"
        )
        p.add_argument(
            "--rollout-file",
            help="rollout JSONL written by `python -m vllm_idlm.rollouts` (MASK-row windows)",
        )
        p.add_argument(
            "--split-pass",
            action="store_true",
            help="x_0 as a KV cache, then the MASK rows only (same gradients, less work)",
        )


def parser() -> argparse.ArgumentParser:
    """The stages alone (what a Ray Train worker parses)."""
    ap = argparse.ArgumentParser(prog="idlm-train")
    add_stage_parsers(ap.add_subparsers(dest="cmd", required=True))
    return ap


def paths(args) -> tuple[Path, Path]:
    """OUT and the work folder (checkpoints, log) of a stage's arguments."""
    return Path(args.out), Path(args.work or args.out.with_name(args.out.name + ".work"))


def run_guarded(cmd: str, run: Callable[[], int]) -> int:
    """A command's run as the process's job: its torch threads, a ValueError as exit status 2
    with the message, and the end of a torchrun stage's process group."""
    _set_threads(cmd)
    from .distributed import teardown

    ok = False
    try:
        code = run()
        ok = code == 0
        return code
    except ValueError as exc:
        print(f"idlm-train {cmd}: error: {exc}", file=sys.stderr)
        return 2
    finally:
        teardown(ok)


def run(args, checkpoint_hooks: Sequence[CheckpointHook] = ()) -> int:
    """Run the stage `args.cmd` (one of STAGES); prints OUT."""
    recipe = load_recipe(args.recipe)
    out, work = paths(args)
    if args.cmd == "base":
        from .base_train import train_base

        train_docs, _ = _corpus(recipe, args)
        train_base(
            train_docs,
            recipe.tokenizer,
            recipe.model,
            _train_overrides(recipe.base, args),
            out,
            work,
            checkpoint_hooks,
        )
    else:
        _convert_or_lora(recipe, args, work, checkpoint_hooks)
    print(args.out)
    return 0


def _set_threads(cmd: str) -> None:
    """IDLM_TRAIN_THREADS caps intra-op threads; eval defaults to 1 (one-row decode steps gain
    nothing from threads, and on a shared 2-core box 2 threads measured 3-10x slower)."""
    import os

    import torch

    threads = os.environ.get("IDLM_TRAIN_THREADS") or ("1" if cmd in ("eval", "curve") else "")
    if threads:
        torch.set_num_threads(int(threads))


def _train_overrides(cfg, args):
    keys = {
        "steps": args.steps,
        "seq_len": args.seq_len,
        "lr": args.lr,
        "batch_size": args.batch_size,
        "grad_accum": args.grad_accum,
        "precision": args.precision,
        "seed": args.seed,
        "ckpt_every": args.ckpt_every,
    }
    return dataclasses.replace(cfg, **{k: v for k, v in keys.items() if v is not None})


def _corpus(recipe: Recipe, args):
    from .corpus import load_corpus

    cfg = recipe.corpus
    if args.corpus:
        cfg = dataclasses.replace(
            cfg,
            paths=tuple(args.corpus),
            extensions=tuple(args.ext or cfg.extensions),
            exclude_dirs=(),
        )
    return load_corpus(cfg)


def _add_train_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--recipe", default="demo", help="preset name in training/configs or a JSON path"
    )
    p.add_argument(
        "--corpus", nargs="*", help="files, directories, globs or .jsonl (default: the recipe's)"
    )
    p.add_argument(
        "--ext", nargs="*", help="extensions searched in corpus directories, e.g. .py .md"
    )
    p.add_argument("--out", required=True, type=Path)
    p.add_argument(
        "--work", type=Path, help="checkpoint/log folder (default OUT.work); a rerun resumes"
    )
    for name, typ in (
        ("steps", int),
        ("seq-len", int),
        ("lr", float),
        ("batch-size", int),
        ("grad-accum", int),
        ("seed", int),
        ("ckpt-every", int),
    ):
        p.add_argument(f"--{name}", type=typ)
    p.add_argument("--precision", choices=["fp32", "bf16"])


def _convert_or_lora(
    recipe: Recipe, args, work: Path, checkpoint_hooks: Sequence[CheckpointHook]
) -> None:
    from .convert import convert, train_lora

    keys = {
        "strides": tuple(args.strides) if args.strides else None,
        "alpha": args.alpha,
        "balance": args.balance,
        "distill": args.distill,
        "rollouts": args.rollouts,
        "rollout_file": args.rollout_file,
        "split_pass": args.split_pass or None,
    }
    ccfg = dataclasses.replace(recipe.convert, **{k: v for k, v in keys.items() if v is not None})
    tcfg = _train_overrides(
        recipe.convert_train if args.cmd == "convert" else recipe.lora_train, args
    )
    ccfg.check_seq_len(tcfg.seq_len)
    if not (args.base / "config.json").is_file():
        raise ValueError(f"--base {str(args.base)!r} has no config.json")
    file_only = ccfg.rollout_file and ccfg.rollouts >= 1
    train_docs = [] if file_only else _corpus(recipe, args)[0]
    meta = {
        "recipe_name": recipe.name,
        "base": str(args.base),
        "cli": json.loads(json.dumps(vars(args), default=str)),
    }
    if args.cmd == "convert":
        convert(args.base, train_docs, ccfg, tcfg, args.out, work, meta, checkpoint_hooks)
    else:
        train_lora(
            args.base, train_docs, recipe.lora, ccfg, tcfg, args.out, work, meta, checkpoint_hooks
        )
