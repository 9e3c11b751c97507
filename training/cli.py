"""`idlm-train`: base | convert | lora | eval | demo.

Recipes (`--recipe demo|tiny|qwen3_8b|path.json`) hold the defaults; flags override them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from .config import Recipe, load_recipe


def _train_overrides(cfg, args):
    keys = {
        "steps": args.steps,
        "seq_len": args.seq_len,
        "lr": args.lr,
        "batch_size": args.batch_size,
        "grad_accum": args.grad_accum,
        "precision": args.precision,
        "seed": args.seed,
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
    ):
        p.add_argument(f"--{name}", type=typ)
    p.add_argument("--precision", choices=["fp32", "bf16"])


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="idlm-train", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
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
        p.add_argument("--strides", nargs="+", type=int)
        p.add_argument("--alpha", type=float)
        p.add_argument("--balance", choices=["fixed", "auto"])
        p.add_argument(
            "--distill", type=float, help="share of the MASK loss against the clean rows (0-1)"
        )
        p.add_argument(
            "--rollouts", type=float, help="share of windows that are the base's own continuations"
        )
    p = sub.add_parser("eval", help="held-out CE and reference-ISD acceptance / tokens per forward")
    p.add_argument(
        "--model",
        required=True,
        type=Path,
        help="I-DLM checkpoint, or the base when --lora is given",
    )
    p.add_argument("--lora", type=Path, help="gated adapter directory over --model")
    p.add_argument("--recipe", default="demo")
    p.add_argument("--strides", nargs="+", type=int, default=[2, 3, 4])
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-new", type=int, default=96)
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("demo", help="build DIR/base, DIR/idlm, DIR/lora (cached by recipe)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument(
        "--preset", default="demo", help="recipe: demo (~12 min on 2 cores) or tiny (CI)"
    )
    return ap


def _set_threads(cmd: str) -> None:
    """IDLM_TRAIN_THREADS caps intra-op threads; eval defaults to 1 (one-row decode steps gain
    nothing from threads, and on a shared 2-core box 2 threads measured 3-10x slower)."""
    import os

    import torch

    threads = os.environ.get("IDLM_TRAIN_THREADS") or ("1" if cmd == "eval" else "")
    if threads:
        torch.set_num_threads(int(threads))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _set_threads(args.cmd)
    try:
        return _dispatch(args)
    except ValueError as exc:
        print(f"idlm-train {args.cmd}: error: {exc}", file=sys.stderr)
        return 2


def _dispatch(args) -> int:
    if args.cmd == "demo":
        from .demo import build_demo

        paths = build_demo(
            load_recipe(args.preset), args.out, log=lambda m: print(m, file=sys.stderr)
        )
        for name, path in paths.items():
            print(f"{name}: {path}")
        return 0
    if args.cmd == "eval":
        from .evaluate import run_eval

        run_eval(args)
        return 0
    recipe = load_recipe(args.recipe)
    work = args.work or args.out.with_name(args.out.name + ".work")
    if args.cmd == "base":
        from .base_train import train_base

        train_docs, _ = _corpus(recipe, args)
        train_base(
            train_docs,
            recipe.tokenizer,
            recipe.model,
            _train_overrides(recipe.base, args),
            args.out,
            work,
        )
    else:
        _convert_or_lora(recipe, args, work)
    print(args.out)
    return 0


def _convert_or_lora(recipe: Recipe, args, work: Path) -> None:
    from .convert import convert, train_lora

    keys = {
        "strides": tuple(args.strides) if args.strides else None,
        "alpha": args.alpha,
        "balance": args.balance,
        "distill": args.distill,
        "rollouts": args.rollouts,
    }
    ccfg = dataclasses.replace(recipe.convert, **{k: v for k, v in keys.items() if v is not None})
    tcfg = _train_overrides(
        recipe.convert_train if args.cmd == "convert" else recipe.lora_train, args
    )
    ccfg.check_seq_len(tcfg.seq_len)
    if not (args.base / "config.json").is_file():
        raise ValueError(f"--base {str(args.base)!r} has no config.json")
    train_docs, _ = _corpus(recipe, args)
    meta = {
        "recipe_name": recipe.name,
        "base": str(args.base),
        "cli": json.loads(json.dumps(vars(args), default=str)),
    }
    if args.cmd == "convert":
        convert(args.base, train_docs, ccfg, tcfg, args.out, work, meta)
    else:
        train_lora(args.base, train_docs, recipe.lora, ccfg, tcfg, args.out, work, meta)


if __name__ == "__main__":
    sys.exit(main())
