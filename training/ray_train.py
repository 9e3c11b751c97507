"""`idlm-train` stages under Ray Train: N workers, the same FSDP loop, Ray's checkpoints.

    idlm-train ray --workers 2 --storage /shared/ray-runs --name conv1 -- \\
        convert --recipe demo --base BASE --out OUT

Ray Train's `TorchTrainer` starts one worker per rank and sets up the process group (gloo
without GPUs, NCCL with them) and torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, ...)
before our function runs, so each worker simply runs the stage's command line: the code path
is the one `torchrun -m idlm_training.cli ...` takes (`stages.run`, with the checkpoint hooks below passed in) (data-parallel FSDP2: the `convert` stage;
`base` and `lora` refuse more than one process with an error, nothing would sync their
gradients). What Ray adds here:

- every resume checkpoint of the trainer (each rank's shards and optimizer state) is reported
  to Ray's storage path, and a restarted or resumed run (same `--storage` and `--name`)
  restores it into the stage's work folder before training starts;
- the exported model (I-DLM checkpoint or gated adapter) is reported as the final checkpoint,
  so `result.checkpoint` holds it even when OUT is local to a worker.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from . import stages


def _stage_args(argv: list[str]) -> argparse.Namespace:
    """A stage's command line, parsed as the CLI parses it."""
    if not argv or argv[0] not in stages.STAGES:
        command = argv[0] if argv else None
        raise ValueError(f"idlm-train ray runs the training stages, not {command!r}")
    return stages.parser().parse_args(argv)


def _restore(work: Path, dist_rank: int) -> int | None:
    """Copy this rank's file of Ray's latest checkpoint into work/ckpt; the step, or None."""
    import ray.train
    import torch

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as folder:
        files = sorted(Path(folder).glob("state*.pt"))
        if not files:
            return None  # the final model: the stage is done, it will only re-export
        target = work / "ckpt"
        target.mkdir(parents=True, exist_ok=True)
        name = "state.pt" if (Path(folder) / "state.pt").is_file() else f"state-rank{dist_rank}.pt"
        shutil.copy2(Path(folder) / name, target / name)
        state = torch.load(target / name, map_location="cpu", weights_only=True)
        return int(state["step"])


def _report_checkpoint(step: int, ckpt_dir: Path, dist) -> None:
    """Trainer hook: each rank uploads its own file; Ray merges them into one checkpoint."""
    import ray.train
    from ray.train import Checkpoint

    from .trainer import ckpt_file

    with tempfile.TemporaryDirectory() as folder:
        own = ckpt_file(ckpt_dir, dist)
        shutil.copy2(own, Path(folder) / own.name)
        ray.train.report({"step": step}, checkpoint=Checkpoint.from_directory(folder))


# Failure drill: every worker of a run's first attempt dies right after reporting the
# checkpoint of this step; Ray restarts the group (FailureConfig) from that checkpoint.
FAIL_DRILL = "IDLM_RAY_FAIL_AFTER_STEP"


def _fail_drill(at: int, step: int, ckpt_dir: Path, dist) -> None:
    if step == at:
        raise RuntimeError(f"{FAIL_DRILL}={at}: this worker stops here (a failure drill)")


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """What each Ray Train worker runs: the stage's CLI, with the checkpoint hook."""
    import ray.train
    import torch.distributed as dist_mod
    from ray.train import Checkpoint

    context = ray.train.get_context()
    rank = context.get_world_rank()
    args = _stage_args(config["argv"])
    out, work = stages.paths(args)
    if config.get("threads"):
        import torch

        torch.set_num_threads(int(config["threads"]))
    step = _restore(work, rank)
    if dist_mod.is_initialized():
        dist_mod.barrier()
    if step is not None and rank == 0:
        print(f"idlm-train ray: resumed from Ray's checkpoint at step {step}", flush=True)
    hooks = [_report_checkpoint]
    drill = int(config.get("fail_after_step") or os.environ.get(FAIL_DRILL) or 0)
    if drill and step is None:
        hooks.append(functools.partial(_fail_drill, drill))
    code = stages.run_guarded(args.cmd, lambda: stages.run(args, hooks))
    if code:
        raise RuntimeError(f"idlm-train {' '.join(config['argv'])} exited with {code}")
    final = Checkpoint.from_directory(str(out)) if rank == 0 else None
    ray.train.report({"step": -1, "done": 1, "resumed_from": step or 0}, checkpoint=final)


def run_on_ray(
    argv: list[str],
    workers: int,
    storage: str,
    name: str,
    use_gpu: bool = False,
    cpus_per_worker: float = 1.0,
    threads: int | None = None,
    max_failures: int = 0,
    fail_after_step: int = 0,
):
    """Run `idlm-train ARGV` on `workers` Ray Train workers; returns Ray's `Result`.

    The same `storage` and `name` resume a run from its last reported checkpoint; within
    one call, Ray restarts failed workers up to `max_failures` times from it."""
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    _stage_args(argv)  # refuse a bad command line here, not in N workers
    if not ray.is_initialized():
        ray.init(include_dashboard=False)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "argv": list(argv),
            "threads": threads,
            "fail_after_step": fail_after_step,
        },
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=workers,
            use_gpu=use_gpu,
            resources_per_worker=None if use_gpu else {"CPU": cpus_per_worker},
        ),
        run_config=RunConfig(
            name=name,
            storage_path=str(Path(storage).expanduser().resolve())
            if "://" not in storage
            else storage,
            checkpoint_config=CheckpointConfig(num_to_keep=2),
            failure_config=FailureConfig(max_failures=max_failures),
        ),
    )
    return trainer.fit()


def add_parser(sub) -> None:
    p = sub.add_parser(
        "ray",
        help="run a training stage under Ray Train (N workers, checkpoints in Ray's storage)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--gpu", action="store_true", help="one GPU per worker (NCCL)")
    p.add_argument("--cpus-per-worker", type=float, default=1.0)
    p.add_argument("--threads", type=int, help="torch threads per worker")
    p.add_argument("--max-failures", type=int, default=0, help="worker-group restarts")
    p.add_argument("--storage", required=True, help="Ray Train storage path (shared for N nodes)")
    p.add_argument("--name", required=True, help="run name; the same name resumes")
    p.add_argument("stage", nargs=argparse.REMAINDER, help="-- base|convert|lora ...")


def run_cli(args) -> int:
    argv = args.stage[1:] if args.stage[:1] == ["--"] else args.stage
    result = run_on_ray(
        argv,
        args.workers,
        args.storage,
        args.name,
        args.gpu,
        args.cpus_per_worker,
        args.threads,
        args.max_failures,
    )
    if result.error:
        raise RuntimeError(f"Ray Train run failed: {result.error}")
    print(f"checkpoint: {result.checkpoint.path if result.checkpoint else None}")
    return 0
