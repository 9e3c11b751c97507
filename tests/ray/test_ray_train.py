"""`idlm-train convert` under Ray Train (2 CPU workers, gloo, FSDP2) and under torchrun: the
same function, the same model; a worker failure resumes from Ray's checkpoint and still ends
at the uninterrupted weights; the result loads in vLLM as an I-DLM and decodes exactly."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray", reason="the `ray` extra is not installed")

STEPS = 4


def _argv(base: Path, out: Path) -> list[str]:
    """A few steps of the tiny recipe's conversion over the demo base (corpus windows only)."""
    return [
        "convert",
        "--recipe",
        "tiny",
        "--base",
        str(base),
        "--out",
        str(out),
        "--steps",
        str(STEPS),
        "--ckpt-every",
        "2",
        "--batch-size",
        "4",
        "--seq-len",
        "64",
        "--rollouts",
        "0",
        "--distill",
        "0",
    ]


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(file))
    assert out, f"no weights in {folder}"
    return out


@pytest.fixture(scope="module")
def torchrun_model(demo_models, tmp_path_factory, session_env) -> Path:
    """The reference: the stage under torchrun, 2 processes (gloo), started from the session's
    original environment (not the LD_PRELOAD / OpenMP settings an in-process engine left)."""
    out = tmp_path_factory.mktemp("torchrun") / "idlm"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "idlm_training.cli",
        *_argv(demo_models["base"], out),
    ]
    env = {**session_env, "IDLM_TRAIN_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def cluster(start_ray):
    start_ray()
    yield
    ray.shutdown()


@pytest.mark.timeout(900)
def test_ray_train_matches_torchrun_after_a_failure(cluster, demo_models, torchrun_model, tmp_path):
    from idlm_training.ray_train import run_on_ray

    out = tmp_path / "idlm"
    result = run_on_ray(
        _argv(demo_models["base"], out),
        workers=2,
        storage=str(tmp_path / "storage"),
        name="convert",
        threads=1,
        max_failures=1,
        fail_after_step=2,  # both workers die after Ray stored the step-2 checkpoint
    )
    assert result.error is None, result.error
    # The failure happened and the restarted group resumed from step 2, not from 0.
    assert result.metrics["resumed_from"] == 2, result.metrics
    shards = {p.name for p in (tmp_path / "storage").rglob("state-rank*.pt")}
    assert shards == {"state-rank0.pt", "state-rank1.pt"}, "each rank's shard is in Ray's storage"
    # Ray's final checkpoint is the exported model, and it is the uninterrupted model.
    with result.checkpoint.as_directory() as folder:
        folder = Path(folder)
        config = json.loads((folder / "config.json").read_text())
        ours, ref = _weights(folder), _weights(torchrun_model)
    assert (
        config["architectures"]
        == json.loads((torchrun_model / "config.json").read_text())["architectures"]
    )
    assert ours.keys() == ref.keys()
    for name in ref:
        torch.testing.assert_close(ours[name], ref[name], rtol=0, atol=0, msg=name)
    base = _weights(demo_models["base"])
    assert any(not torch.equal(ours[n], base[n]) for n in base if n in ours), "nothing trained"


def test_torchrun_result_is_an_idlm_that_decodes_exactly(torchrun_model, heldout_prompts):
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from vllm_idlm.formats.checkpoint import read_checkpoint_facts

    config = json.loads((torchrun_model / "config.json").read_text())
    facts = read_checkpoint_facts(config, str(torchrun_model))
    assert facts.mask_token_id is not None
    prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in heldout_prompts[:4]]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outs = {}
    for spec in (None, {"method": "idlm", "num_speculative_tokens": 3}):
        llm = LLM(
            model=str(torchrun_model),
            dtype="float32",
            max_model_len=256,
            enforce_eager=True,
            kv_cache_memory_bytes=128 << 20,
            speculative_config=spec,
        )
        try:
            gen = llm.generate(prompts, params, use_tqdm=False)
            outs[spec is None] = [list(o.outputs[0].token_ids) for o in gen]
        finally:
            llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()
    assert outs[True] == outs[False]


def test_stages_without_data_parallelism_refuse_two_processes(demo_models, tmp_path):
    """`lora` would train one adapter per rank (nothing syncs its gradients): a clear error."""
    argv = _argv(demo_models["base"], tmp_path / "lora")
    argv[0] = "lora"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "idlm_training.cli", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "the lora stage runs in one process (got WORLD_SIZE=2)" in proc.stderr
