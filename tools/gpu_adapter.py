"""Train a chat recipe's gated adapter on a lent GPU in one prepared run (issue 54, item 3).

The device machine has torch, transformers and peft but no vLLM, no network and a 64 MiB
limit on what travels each call; files come back at most 16 MiB each. So:

  here      python tools/gpu_adapter.py pack --recipe smollm2_lora  (--cache: the build root)
            writes .gpu/ (ignored by git): the GGUF in parts of 56 MiB (.gpu/p0, .gpu/p1),
            the recipe's rollouts (built here first with `idlm-train build`) and the `gguf`
            reader's wheel.
  device    call 1 carries .gpu/p0 only and runs `true` (an ignored path stays there between
            calls on a warm machine); call 2 carries .gpu/p1 and .gpu/rest and runs
            python3 tools/gpu_adapter.py train --recipe smollm2_lora --steps 600 --out $OUT
            (the 8 files of $OUT come back: the adapter in 15 MiB parts, its metadata, the log)
  here      python tools/gpu_adapter.py unpack --parts FILES_AT --out DIR/lora
            then `idlm-train eval --chat --model DIR/base --lora DIR/lora` as for any adapter.

`train` imports the base from the GGUF exactly as `idlm-train import` does here, so the
adapter fits the base this machine serves. Nothing here needs a GPU: `train --steps 2` runs
the same path on this machine's CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACK = ROOT / ".gpu"
PART_BYTES = 56 * 2**20  # with the repo, under the 64 MiB a device call carries
BACK_BYTES = 15 * 2**20  # under the 16 MiB a returned file may hold
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def _import_path() -> None:
    """`idlm_training` from this checkout without installing it (the device has no pip index)."""
    alias = Path("/tmp/idlm_src")
    alias.mkdir(exist_ok=True)
    link = alias / "idlm_training"
    if not link.exists():
        link.symlink_to(ROOT / "training", target_is_directory=True)
    sys.path[:0] = [str(alias), str(ROOT)]
    site = Path("/tmp/idlm_site")
    wheels = sorted((PACK / "rest").glob("*.whl"))
    if wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--upgrade"]
            + ["--target", str(site), *map(str, wheels)],
            check=True,
        )
        sys.path.insert(0, str(site))


def _split(path: Path, size: int, out: Path, stem: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    with path.open("rb") as f:
        while chunk := f.read(size):
            part = out / f"{stem}.{len(parts):02d}"
            part.write_bytes(chunk)
            parts.append(part)
    return parts


def _join(parts: list[Path], path: Path) -> Path:
    with path.open("wb") as f:
        for part in sorted(parts):
            f.write(part.read_bytes())
    return path


def pack(args) -> None:
    from idlm_training.chat_recipe import load_chat_recipe
    from idlm_training.gguf_package import DEFAULT_CACHE, package_gguf

    recipe = load_chat_recipe(args.recipe)
    rollouts = Path(args.cache).expanduser() / recipe.name / "rollouts.jsonl"
    if not rollouts.is_file():
        raise SystemExit(
            f"{rollouts} is missing: run `idlm-train build --recipe {args.recipe}` first"
        )
    shutil.rmtree(PACK, ignore_errors=True)
    gguf = package_gguf(recipe.source, True, DEFAULT_CACHE, None)
    for i, part in enumerate(_split(gguf, PART_BYTES, PACK / "tmp", "gguf")):
        (PACK / f"p{i}").mkdir()
        part.rename(PACK / f"p{i}" / part.name)
    shutil.rmtree(PACK / "tmp")
    rest = PACK / "rest"
    rest.mkdir()
    shutil.copy(rollouts, rest / "rollouts.jsonl")
    (rest / "gguf_name").write_text(gguf.name)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
        + ["-d", str(rest), "gguf==0.19.0"],
        check=True,
    )
    for d in sorted(PACK.iterdir()):
        mib = sum(f.stat().st_size for f in d.iterdir()) / 2**20
        print(f"{d.relative_to(ROOT)}: {mib:.1f} MiB")


def train(args) -> None:
    import torch

    from idlm_training.chat_recipe import load_chat_recipe
    from idlm_training.convert import train_lora
    from idlm_training.importer import import_model

    recipe = load_chat_recipe(args.recipe)
    out = Path(args.out)
    work = Path("/tmp/idlm_gpu")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    name = (PACK / "rest" / "gguf_name").read_text().strip()
    gguf = _join(list(PACK.glob("p*/gguf.*")), work / name)
    t0 = time.time()
    base = import_model(str(gguf), work / "base")
    steps = args.steps or recipe.lora_train.steps
    warmup = min(recipe.lora_train.warmup_steps, steps // 4)
    tcfg = dataclasses.replace(recipe.lora_train, steps=steps, warmup_steps=warmup)
    ccfg = dataclasses.replace(recipe.convert, rollout_file=str(PACK / "rest" / "rollouts.jsonl"))
    print("device", torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
    t1 = time.time()
    lora = train_lora(base, [], recipe.lora, ccfg, tcfg, work / "lora", work / "run", {})
    seconds = time.time() - t1
    out.mkdir(parents=True, exist_ok=True)
    for f in sorted(lora.iterdir()):
        if f.name in TOKENIZER_FILES:  # at most 8 files come back: unpack takes these from the base
            continue
        if f.stat().st_size > BACK_BYTES:
            _split(f, BACK_BYTES, out, f.name)
        else:
            shutil.copy(f, out / f.name)
    log = work / "run" / "train_log.jsonl"
    if log.is_file():
        shutil.copy(log, out / "train_log.jsonl")
    facts = {"steps": tcfg.steps, "train_seconds": round(seconds, 1)}
    facts["import_seconds"] = round(t1 - t0, 1)
    (out / "gpu_run.json").write_text(json.dumps(facts, indent=1) + "\n")
    print(json.dumps(facts))


def unpack(args) -> None:
    src, out = Path(args.parts), Path(args.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        stem, _, suffix = f.name.rpartition(".")
        if suffix.isdigit() and len(suffix) == 2:
            if suffix == "00":
                _join(sorted(src.glob(f"{stem}.[0-9][0-9]")), out / stem)
        else:
            shutil.copy(f, out / f.name)
    base = Path(args.base).expanduser()
    for name in TOKENIZER_FILES:
        shutil.copy(base / name, out / name)
    print(f"adapter in {out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("pack")
    a.add_argument("--recipe", default="smollm2_lora")
    a.add_argument("--cache", default="~/.cache/vllm-idlm/smollm2")
    a = sub.add_parser("train")
    a.add_argument("--recipe", default="smollm2_lora")
    a.add_argument("--steps", type=int, default=0, help="0: the recipe's")
    a.add_argument("--out", required=True)
    a = sub.add_parser("unpack")
    a.add_argument("--parts", required=True, help="the folder the device's files came back to")
    a.add_argument("--base", default="~/.cache/vllm-idlm/smollm2/base", help="its tokenizer files")
    a.add_argument("--out", required=True)
    args = p.parse_args()
    _import_path()
    {"pack": pack, "train": train, "unpack": unpack}[args.cmd](args)


if __name__ == "__main__":
    main()
