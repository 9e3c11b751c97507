"""Multi-GPU under torchrun: process group setup and FSDP2 sharding of a Qwen3 model.

One process per GPU; each rank draws its own micro-batches (rank-offset steps of the shared
sampler). Single-process runs (CPU, tests) never touch torch.distributed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

_OWNED_GROUP = False  # whether setup() created the process group (torchrun), not Ray Train


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(device: str = "auto") -> DistInfo:
    """Read torchrun's environment; pick the device (cuda when present unless told otherwise)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    use_cuda = torch.cuda.is_available() if device == "auto" else device.startswith("cuda")
    if world > 1:
        import torch.distributed as dist

        local = int(os.environ.get("LOCAL_RANK", "0"))
        if use_cuda:
            torch.cuda.set_device(local)
        if not dist.is_initialized():
            global _OWNED_GROUP
            dist.init_process_group("nccl" if use_cuda else "gloo")
            _OWNED_GROUP = True
        return DistInfo(
            rank, world, torch.device("cuda", local) if use_cuda else torch.device("cpu")
        )
    return DistInfo(0, 1, torch.device("cuda") if use_cuda else torch.device("cpu"))


def teardown(ok: bool) -> None:
    """End of a torchrun stage: wait for every rank (rank 0 may still be writing the export),
    then destroy the process group this process created.

    Exiting with a live gloo group aborted one rank at interpreter shutdown ("terminate called
    without an active exception", SIGABRT) while rank 0 was still writing shards. A process group
    that Ray Train created is Ray's to tear down. After a failure no barrier: the other ranks may
    never reach it.
    """
    global _OWNED_GROUP
    if not _OWNED_GROUP:
        return
    import torch.distributed as dist

    if dist.is_initialized():
        if ok:
            dist.barrier()
        dist.destroy_process_group()
    _OWNED_GROUP = False


def shard(model, info: DistInfo, bf16: bool):
    """FSDP2: shard every decoder layer, then the trunk and the head, as separate units.

    The trainer calls the trunk and the head separately, so each is its own unit.
    """
    if info.world_size == 1:
        return model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if bf16
        else MixedPrecisionPolicy()
    )
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy)
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    if tied:
        # One unit for the shared matrix, gathered whenever either module runs: as separate
        # units the head kept the plain (unsharded) parameter and the tie broke.
        fully_shard([model.model.embed_tokens, model.lm_head], mp_policy=policy)
    fully_shard(model.model, mp_policy=policy)
    if not tied:
        fully_shard(model.lm_head, mp_policy=policy)
    return model


def all_reduce_mean(value: float, info: DistInfo) -> float:
    if info.world_size == 1:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], device=info.device)
    dist.all_reduce(t)
    return float(t) / info.world_size


def full_state_dict(model, info: DistInfo) -> dict | None:
    """The unsharded state dict on CPU (a collective: every rank calls it); None single-process."""
    if info.world_size == 1:
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)
