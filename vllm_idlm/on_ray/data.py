"""Offline batch ISD over a Ray Dataset: Ray Data's LLM processor with N vLLM engine replicas.

    import ray
    from vllm_idlm.on_ray.data import build_processor

    ray.init()
    proc = build_processor("CKPT", num_drafts=3, replicas=2)  # draft_lora=DIR: lossless mode
    ds = ray.data.from_items([{"prompt": "def fib(n):", "max_tokens": 64}])
    rows = proc(ds).take_all()  # each row: prompt, generated_text, generated_tokens, ...

Rows carry a `prompt` (text) or `prompt_ids` (token ids) and optionally `max_tokens`,
`temperature`, `seed`, or a whole `sampling_params` dict (vLLM's `SamplingParams` fields);
other columns pass through. Custom `preprocess` / `postprocess` functions replace the defaults
(Ray Data's own contract: preprocess returns `prompt` or `tokenized_prompt` plus
`sampling_params`). Nothing here runs the engine: Ray Data's `vLLMEngineStage` starts one
vLLM `AsyncLLM` per replica with our engine kwargs, and vLLM loads the plugin there.

On the CPU build each replica is a placement group of `cpus_per_replica` CPUs (Ray's default
asks for a GPU and would never schedule), replicas do not pin OpenMP threads to the same cores,
and the pre/post-processing tasks ask for a sliver of a CPU so that N replicas holding all N
CPUs do not starve them. On GPUs Ray's defaults apply (one GPU bundle per tensor-parallel rank;
pass `tensor_parallel_size` in `engine_kwargs`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_idlm.on_ray.common import isd_engine_kwargs, on_cpu

# Fields of a row that the default preprocess turns into SamplingParams.
SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "min_tokens", "stop")
# What the default postprocess keeps from the engine stage's output.
OUTPUT_KEYS = ("generated_text", "generated_tokens", "num_generated_tokens", "num_input_tokens")
# Ray Data map tasks (pre/post-processing): light, they must not wait for an engine's CPU.
MAP_CPUS = 0.1


def default_preprocess(row: dict[str, Any]) -> dict[str, Any]:
    """A row of `prompt` / `prompt_ids` (+ sampling fields) -> the engine stage's request."""
    params = dict(row.get("sampling_params") or {})
    for key in SAMPLING_KEYS:
        if row.get(key) is not None and key not in params:
            params[key] = row[key]
    params.setdefault("temperature", 0.0)
    params.setdefault("max_tokens", 64)
    rest = {k: v for k, v in row.items() if k not in ("sampling_params", *SAMPLING_KEYS)}
    if row.get("prompt_ids") is not None:
        rest.pop("prompt", None)
        rest["tokenized_prompt"] = [int(t) for t in rest.pop("prompt_ids")]
    elif row.get("prompt") is None:
        raise ValueError(f"a row needs 'prompt' or 'prompt_ids', got columns {sorted(row)}")
    return {**rest, "sampling_params": params}


def default_postprocess(row: dict[str, Any]) -> dict[str, Any]:
    """Keep the caller's columns and the generation; drop the engine stage's bookkeeping."""
    out = {k: v for k, v in row.items() if k in OUTPUT_KEYS}
    if "generated_tokens" in out:
        out["generated_tokens"] = [int(t) for t in out["generated_tokens"]]
    for key, value in row.items():
        if key in ("prompt", "tokenized_prompt", "prompt_token_ids") or key in OUTPUT_KEYS:
            continue
        if key in ("sampling_params", "request_id", "params", "metrics", "time_taken_llm"):
            continue
        if key.startswith("__") or key in ("batch_uuid", "embeddings", "logprobs"):
            continue
        out[key] = value
    prompt_ids = row.get("tokenized_prompt")
    if prompt_ids is None:
        prompt_ids = row.get("prompt_token_ids") if row.get("prompt") is None else None
    if prompt_ids is not None:
        out["prompt_ids"] = [int(t) for t in prompt_ids]
    elif row.get("prompt") is not None:
        out["prompt"] = row["prompt"]
    return out


def cpu_share(replicas: int, spare: float = 0.5) -> float:
    """Logical CPUs per engine replica: 1, or an equal share of the cluster's CPUs minus
    `spare` for Ray Data's map tasks (a vLLM CPU engine's threads do not follow it anyway)."""
    import ray

    total = ray.cluster_resources().get("CPU", 1.0) if ray.is_initialized() else 1.0
    return round(max(0.1, min(1.0, (total - spare) / replicas)), 3)


def engine_kwargs_for(
    num_drafts: int | None,
    draft_lora: str | None,
    engine_kwargs: dict[str, Any] | None,
) -> dict[str, Any]:
    return isd_engine_kwargs(num_drafts, draft_lora, **(engine_kwargs or {}))


def build_processor(
    model: str,
    *,
    num_drafts: int | None = 3,
    draft_lora: str | None = None,
    replicas: int = 1,
    cpus_per_replica: float | None = None,
    engine_kwargs: dict[str, Any] | None = None,
    batch_size: int = 16,
    max_concurrent_batches: int = 2,
    preprocess: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    postprocess: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    env_vars: dict[str, str] | None = None,
    log_engine_metrics: bool = True,
):
    """A Ray Data processor running `model` with ISD (`num_drafts=None`: plain decoding).

    `replicas` engines run side by side (a fixed pool, not an autoscaling one, so that N
    replicas are really N); `draft_lora` is the gated adapter of lossless mode over a base.
    `cpus_per_replica` is Ray's logical CPU count per engine on the CPU build (default: 1, less
    when N of them would hold every CPU of the cluster: the map tasks would then never run).
    With `log_engine_metrics` the engines' vLLM metrics (speculative counters included) go
    to Ray's Prometheus endpoint (`ray.init(_metrics_export_port=...)`).
    """
    from ray.data.llm import build_processor as ray_build_processor
    from ray.data.llm import vLLMEngineProcessorConfig

    if replicas < 1:
        raise ValueError(f"replicas={replicas} must be >= 1")
    kwargs = engine_kwargs_for(num_drafts, draft_lora, engine_kwargs)
    env = dict(env_vars or {})
    extra: dict[str, Any] = {}
    if on_cpu():
        if kwargs.get("tensor_parallel_size", 1) != 1:
            raise ValueError("the CPU build runs one engine per replica: tensor_parallel_size=1")
        cpus = cpu_share(replicas) if cpus_per_replica is None else float(cpus_per_replica)
        extra["placement_group_config"] = {"bundles": [{"CPU": cpus}]}
        if replicas > 1:
            # Each replica would pin its OpenMP threads to the same first cores.
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    config = vLLMEngineProcessorConfig(
        model_source=str(model),
        engine_kwargs=kwargs,
        runtime_env={"env_vars": env} if env else None,
        concurrency=(replicas, replicas),
        batch_size=batch_size,
        max_concurrent_batches=max_concurrent_batches,
        chat_template_stage=False,
        tokenize_stage=False,
        detokenize_stage=False,
        log_engine_metrics=log_engine_metrics,
        **extra,
    )
    light = {"num_cpus": MAP_CPUS}
    return ray_build_processor(
        config,
        preprocess=preprocess or default_preprocess,
        postprocess=postprocess or default_postprocess,
        preprocess_map_kwargs=light,
        postprocess_map_kwargs=light,
    )


def generate(ds, model: str, **processor_kwargs):
    """`build_processor(model, **processor_kwargs)(ds)`: the dataset of generations (lazy)."""
    return build_processor(model, **processor_kwargs)(ds)
