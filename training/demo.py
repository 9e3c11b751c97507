"""`idlm-train demo`: build DIR/base, DIR/idlm and DIR/lora for the embedded demo.

Each output carries `idlm_build.json` with the hash of the recipe parts it depends on; a rerun
skips an output whose hash matches and rebuilds one that does not. Interrupted stages resume
from `DIR/.work/<stage>-<hash>/ckpt`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

from .base_train import corpus_summary, train_base
from .config import Recipe, hash_view
from .convert import convert, train_lora
from .corpus import load_corpus

STAMP = "idlm_build.json"
# Bump when a code change alters what a build produces, so cached demo dirs are rebuilt.
BUILD_VERSION = 2


def digest(*parts) -> str:
    """A short hash of configs and values (configs through `hash_view`)."""
    blob = json.dumps([hash_view(p) for p in parts], sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def stage_hashes(recipe: Recipe) -> dict[str, str]:
    base = digest("base", BUILD_VERSION, recipe.corpus, recipe.tokenizer, recipe.model, recipe.base)
    return {
        "base": base,
        "idlm": digest("idlm", base, recipe.convert, recipe.convert_train),
        "lora": digest("lora", base, recipe.convert, recipe.lora, recipe.lora_train),
    }


def is_built(path: Path, digest_: str) -> bool:
    stamp = path / STAMP
    return stamp.is_file() and json.loads(stamp.read_text()).get("hash") == digest_


def write_stamp(path: Path, digest_: str, recipe_name: str, seconds: float) -> None:
    (path / STAMP).write_text(
        json.dumps({"hash": digest_, "recipe": recipe_name, "seconds": round(seconds, 1)}, indent=2)
        + "\n"
    )


def build_demo(recipe: Recipe, out: Path, log=print) -> dict[str, Path]:
    """Build (or reuse) the three demo models under `out`; returns their paths."""
    recipe.convert.check_seq_len(recipe.convert_train.seq_len)
    recipe.convert.check_seq_len(recipe.lora_train.seq_len)
    out = Path(out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    hashes = stage_hashes(recipe)
    paths = {name: out / name for name in hashes}
    if all(is_built(paths[n], hashes[n]) for n in hashes):
        return paths
    train_docs, heldout = load_corpus(recipe.corpus)
    log(corpus_summary(recipe.corpus, train_docs, heldout))
    meta = {"recipe_name": recipe.name, "recipe_hash": recipe.hash()}
    builders = {
        "base": lambda p, w: train_base(
            train_docs, recipe.tokenizer, recipe.model, recipe.base, p, w
        ),
        "idlm": lambda p, w: convert(
            paths["base"], train_docs, recipe.convert, recipe.convert_train, p, w, meta
        ),
        "lora": lambda p, w: train_lora(
            paths["base"], train_docs, recipe.lora, recipe.convert, recipe.lora_train, p, w, meta
        ),
    }
    for name, build in builders.items():
        if is_built(paths[name], hashes[name]):
            log(f"{name}: up to date ({paths[name]})")
            continue
        shutil.rmtree(paths[name], ignore_errors=True)
        t0 = time.time()
        build(paths[name], out / ".work" / f"{name}-{hashes[name]}")
        write_stamp(paths[name], hashes[name], recipe.name, time.time() - t0)
        log(f"{name}: built in {time.time() - t0:.0f}s ({paths[name]})")
    return paths
