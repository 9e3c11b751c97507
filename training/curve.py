"""`idlm-train curve`: acceptance against training minutes for a chat recipe's build.

The trainer keeps the trainable state every `snapshot_every` steps (WORK/snapshots); each
snapshot is loaded over the base and measured with the reference ISD decoder on the recipe's
held-out chat prompts (TPF and per-depth acceptance, greedy and sampled, N = 2, 3, 4).
Results are cached per snapshot in DIR/<recipe>/curve.json, so a rerun measures only new
points; the table gives training minutes and build minutes (rollouts included) per point,
which is what a longer run (or a GPU) is planned from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .chat_build import stage_hashes
from .chat_recipe import ChatRecipe
from .evaluate import chat_prompts, measure
from .gated_lora import attach_gated_lora
from .modeling import load_base


def snapshots(work: Path) -> list[Path]:
    return sorted((work / "snapshots").glob("step*.pt"))


def load_snapshot(recipe: ChatRecipe, kind: str, base: Path, snapshot: Path):
    """(model, tokenizer, mask_id) with the snapshot's trainable state over the base."""
    model, tokenizer = load_base(base)
    mask_id = tokenizer.convert_tokens_to_ids("<|mask|>")
    if kind == "lora":
        attach_gated_lora(model, recipe.lora, mask_id)
    state = torch.load(snapshot, map_location="cpu", weights_only=True)
    named = dict(model.named_parameters())
    missing = sorted(set(state["params"]) - set(named))
    if missing:
        raise ValueError(f"{snapshot}: parameters {missing[:3]} are not in the model")
    with torch.no_grad():
        for name, value in state["params"].items():
            named[name].copy_(value)
    return model.eval(), tokenizer, mask_id


def measure_point(model, tokenizer, mask_id: int, recipe: ChatRecipe, args) -> dict[str, Any]:
    prompts = chat_prompts(tokenizer, recipe, args.prompts)
    result = measure(
        model,
        prompts,
        mask_id,
        args.strides,
        args.max_new,
        args.seed,
        tokenizer,
        tuple(args.temperatures),
        tokenizer.eos_token_id,
        check_plain=False,
    )
    return {
        f"N={r['stride']} T={r['temperature']}": {
            "tpf": r["tokens_per_forward"],
            "acceptance_by_depth": r["acceptance_by_depth"],
        }
        for r in result["isd"]
    }


def run_curve(recipe: ChatRecipe, out: Path, args) -> dict[str, Any]:
    out = Path(out).expanduser()
    hashes = stage_hashes(recipe)
    models = out / recipe.name
    record_path = models / "build.json"
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    # The rollouts of a reused pool were timed by the build that generated them.
    pool = out / f"rollouts-{hashes['pool']}.done.json"
    pool_seconds = json.loads(pool.read_text()).get("seconds", 0.0) if pool.is_file() else 0.0
    rollout_seconds = record.get("rollouts", {}).get("seconds", pool_seconds)
    path = models / "curve.json"
    curve = json.loads(path.read_text()) if path.is_file() else {}
    settings = {k: getattr(args, k) for k in ("prompts", "max_new", "seed")}
    settings["temperatures"] = list(args.temperatures)
    settings["strides"] = list(args.strides)
    for kind in recipe.outputs:
        points = curve.setdefault(kind, {})
        work = out / ".work" / f"{kind}-{hashes[kind]}"
        for snap in snapshots(work):
            key = snap.stem
            if key in points and points[key].get("settings") == settings:
                continue
            model, tokenizer, mask_id = load_snapshot(recipe, kind, out / "base", snap)
            meta = torch.load(snap, map_location="cpu", weights_only=True)
            points[key] = {
                "step": meta["step"],
                "train_minutes": round(meta["seconds"] / 60, 1),
                "build_minutes": round((meta["seconds"] + rollout_seconds) / 60, 1),
                "settings": settings,
                "results": measure_point(model, tokenizer, mask_id, recipe, args),
            }
            path.write_text(json.dumps(curve, indent=2) + "\n")
            print(format_curve(curve), flush=True)
    return curve


def format_curve(curve: dict[str, Any]) -> str:
    """A markdown table per output: one row per point, TPF per (N, T)."""
    lines = []
    for kind, points in curve.items():
        rows = sorted(points.values(), key=lambda p: p["step"])
        if not rows:
            continue
        keys = list(rows[0]["results"])
        lines.append(f"\n{kind}: TPF on held-out chat prompts (reference decoder)\n")
        lines.append("| step | train min | build min | " + " | ".join(keys) + " |")
        lines.append("|---" * (3 + len(keys)) + "|")
        for p in rows:
            tpf = " | ".join(f"{p['results'][k]['tpf']:.3f}" for k in keys)
            lines.append(f"| {p['step']} | {p['train_minutes']} | {p['build_minutes']} | {tpf} |")
    return "\n".join(lines)
