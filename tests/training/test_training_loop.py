"""The training loop is deterministic for a seed and resumes exactly from its checkpoint."""

from __future__ import annotations

import dataclasses
import json

import torch

from idlm_training.config import ConvertConfig, TrainConfig
from idlm_training.corpus import Document
from idlm_training.curriculum import make_idlm_step, stage_ends, stride_at
from idlm_training.modeling import build_model
from idlm_training.packing import pack_documents
from idlm_training.trainer import train

from .conftest import TEXT, TINY_SHAPE


def _run(tok, mask_id, cfg, work, checkpoint_hooks=()):
    model = build_model(TINY_SHAPE, tok.eos_token_id, tok.pad_token_id, seed=0)
    data = pack_documents(tok, [Document(str(i), t) for i, t in enumerate(TEXT)], cfg.seq_len)
    step_fn = make_idlm_step(
        model, ConvertConfig(), mask_id, cfg.seq_len, cfg.steps, torch.device("cpu")
    )
    train(model, data, step_fn, cfg, work, "t", checkpoint_hooks=checkpoint_hooks)
    return model


def test_same_seed_same_weights(tmp_path, tiny_tokenizer, mask_id):
    cfg = TrainConfig(steps=4, batch_size=2, seq_len=16, warmup_steps=1, ckpt_every=0)
    a = _run(tiny_tokenizer, mask_id, cfg, tmp_path / "a")
    b = _run(tiny_tokenizer, mask_id, cfg, tmp_path / "b")
    assert all(
        torch.equal(x, y)
        for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


def test_resume_matches_uninterrupted(tmp_path, tiny_tokenizer, mask_id):
    cfg = TrainConfig(steps=4, batch_size=2, seq_len=16, warmup_steps=1, ckpt_every=2)
    full = _run(tiny_tokenizer, mask_id, dataclasses.replace(cfg, ckpt_every=0), tmp_path / "full")
    # A run that saved its step-2 checkpoint; a rerun with a fresh model resumes from it.
    work = tmp_path / "resume"
    _run(tiny_tokenizer, mask_id, cfg, work)
    assert (work / "ckpt" / "state.pt").is_file()
    resumed = _run(tiny_tokenizer, mask_id, cfg, work)
    assert all(
        torch.equal(x, y)
        for x, y in zip(full.state_dict().values(), resumed.state_dict().values(), strict=True)
    )


def test_the_checkpoint_hooks_passed_in_run_after_each_resume_checkpoint(
    tmp_path, tiny_tokenizer, mask_id
):
    """Ray Train reports checkpoints through hooks handed to this run (they were a module-level
    list that ray_train.py filled and emptied around the CLI's main)."""
    cfg = TrainConfig(steps=5, batch_size=2, seq_len=16, warmup_steps=1, ckpt_every=2)
    seen = []
    _run(tiny_tokenizer, mask_id, cfg, tmp_path / "w", [lambda step, d, dist: seen.append(step)])
    assert seen == [2, 4]
    _run(tiny_tokenizer, mask_id, cfg, tmp_path / "other")  # another run: no hook of the first
    assert seen == [2, 4]


def test_the_cli_and_ray_train_do_not_import_each_other():
    """`idlm-train ray` lives in ray_train.py, which ran the stages through cli.main (each
    imported the other); both now go through stages.py, which imports neither."""
    import ast
    from pathlib import Path

    import idlm_training

    root = Path(idlm_training.__file__).parent

    def imported(name):
        tree = ast.parse((root / f"{name}.py").read_text())
        return {
            node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
        }

    assert "cli" not in imported("ray_train") and "ray_train" in imported("cli")
    assert not {"cli", "ray_train"} & imported("stages")


def test_stride_curriculum_stages():
    cfg = ConvertConfig(strides=(2, 3, 4), stage_fractions=(1, 1, 2))
    assert stage_ends(cfg, 8) == [2, 4, 8]
    assert [stride_at(s, cfg, 8) for s in range(8)] == [2, 2, 3, 3, 4, 4, 4, 4]


def test_snapshots_keep_the_trainable_state_and_training_seconds(tmp_path, tiny_tokenizer, mask_id):
    """Points of an acceptance-vs-training-time curve: kept after the run, with the seconds."""
    cfg = TrainConfig(
        steps=4,
        batch_size=2,
        seq_len=16,
        warmup_steps=1,
        ckpt_every=0,
        snapshot_every=2,
        log_every=2,
    )
    model = _run(tiny_tokenizer, mask_id, cfg, tmp_path)
    snaps = sorted((tmp_path / "snapshots").glob("*.pt"))
    assert [p.name for p in snaps] == ["step000002.pt", "step000004.pt"]
    last = torch.load(snaps[-1], weights_only=True)
    assert last["step"] == 4 and last["seconds"] > 0
    assert all(torch.equal(last["params"][n], p) for n, p in model.named_parameters())
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [2, 4] and log[0]["seconds"] <= log[1]["seconds"]


def test_seconds_continue_across_a_resume(tmp_path, tiny_tokenizer, mask_id):
    """A resumed run counts the training time logged before it (the curve's minutes)."""
    cfg = TrainConfig(steps=4, batch_size=2, seq_len=16, warmup_steps=1, ckpt_every=2, log_every=2)
    _run(tiny_tokenizer, mask_id, cfg, tmp_path)
    path = tmp_path / "train_log.jsonl"
    log = [json.loads(line) for line in path.read_text().splitlines()]
    log[0]["seconds"] = 1000.0  # as if the first two steps had taken that long
    path.write_text("".join(json.dumps(r) + "\n" for r in log))
    _run(tiny_tokenizer, mask_id, cfg, tmp_path)  # resumes from the step-2 checkpoint
    log = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in log] == [2, 4]
    # (two tiny steps can take under the log's 0.1 s resolution)
    assert log[0]["seconds"] == 1000.0 and log[1]["seconds"] >= 1000.0
