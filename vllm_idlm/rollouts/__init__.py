"""Self-rollouts for training the MASK rows: generation (`generate.py`) and its command line
(`cli.py`, `python -m vllm_idlm.rollouts`)."""

from vllm_idlm.formats.checkpoint import MASK_TOKEN
from vllm_idlm.rollouts.cli import main, open_engine, read_prompts, read_records, run
from vllm_idlm.rollouts.generate import (
    BANNED_BIAS,
    RolloutSpec,
    generate_rollouts,
    generate_rollouts_ray,
    sampling_fields,
    sampling_params,
)

__all__ = [
    "BANNED_BIAS",
    "MASK_TOKEN",
    "RolloutSpec",
    "generate_rollouts",
    "generate_rollouts_ray",
    "main",
    "open_engine",
    "read_prompts",
    "read_records",
    "run",
    "sampling_fields",
    "sampling_params",
]
