"""An OpenAI-compatible Ray Serve LLM app that decodes with ISD (`"method": "idlm"`).

Ray Serve LLM (`ray.serve.llm`, Ray 2.60) runs vLLM's `AsyncLLM` in each `LLMServer` replica
and vLLM's own OpenAI handlers behind an `OpenAiIngress` router. The ISD speculative config
travels as plain engine kwargs; vLLM loads this plugin in the replica and in its engine
processes through the `vllm.general_plugins` entry point, so nothing here patches Ray:

    import ray
    from ray import serve
    from vllm_idlm.on_ray.serve import build_app, llm_config

    ray.init(_metrics_export_port=8080)
    serve.run(build_app(llm_config("path/to/idlm", model_id="idlm", num_drafts=3)))
    # POST http://127.0.0.1:8000/v1/completions {"model": "idlm", "prompt": ...}

The glue works with vLLM 0.32 as it stands (tests/ray/test_ray_serve.py, CPU): the replica
builds the engine config once and starts `AsyncLLM(vllm_config=...)` (Ray Data LLM builds
it twice from the same args, which the plugin's translation also supports); greedy answers equal plain greedy decoding token for token;
a prompt holding the MASK token gets vLLM's 400 from the ingress and the replica lives on;
the spec-decode counters reach Ray's Prometheus endpoint as `ray_vllm_spec_decode_*`.

Resources. On a GPU, Ray's defaults apply (one GPU bundle per tensor-parallel worker; pass
`tensor_parallel_size` in `engine_kwargs`). With the CPU build of vLLM (one engine process
per replica, no tensor parallelism here) the engine gets one CPU bundle of `cpus_per_replica`
(Ray adds one CPU for the replica actor itself) and the ingress, an I/O-bound router, asks
for no CPU: with Ray's default of one it would wait forever on a 2-core node whose two CPUs
the replica holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_idlm.on_ray.common import isd_engine_kwargs, on_cpu

if TYPE_CHECKING:
    from ray.serve import Application
    from ray.serve.llm import LLMConfig


def llm_config(
    model: str | Path,
    *,
    model_id: str | None = None,
    num_drafts: int | None = 3,
    draft_lora: str | Path | None = None,
    adaptive: bool | dict | None = None,
    replicas: int = 1,
    cpus_per_replica: int = 1,
    engine_kwargs: dict[str, Any] | None = None,
    runtime_env: dict[str, Any] | None = None,
) -> LLMConfig:
    """A `ray.serve.llm.LLMConfig` serving the I-DLM checkpoint `model` with ISD.

    `model_id` is the name clients put in `"model"` (default: the directory name);
    `num_drafts` is ISD's K (None: plain decoding, for comparisons); `draft_lora` the
    gated drafting adapter of a LoRA-trained I-DLM; `replicas` a fixed replica count (pass
    `deployment_config` through Ray yourself for autoscaling); `engine_kwargs` any other
    vLLM engine argument (`dtype`, `max_model_len`, `tensor_parallel_size`, ...).
    """
    from ray.serve.llm import LLMConfig

    if replicas < 1 or cpus_per_replica < 1:
        raise ValueError(
            f"replicas={replicas} and cpus_per_replica={cpus_per_replica} must be >= 1"
        )
    resources: dict[str, Any] = {}
    if on_cpu():
        resources = dict(
            accelerator_config={"kind": "cpu"},
            placement_group_config={"bundles": [{"CPU": cpus_per_replica}]},
        )
    return LLMConfig(
        model_loading_config=dict(model_id=model_id or Path(model).name, model_source=str(model)),
        engine_kwargs=isd_engine_kwargs(num_drafts, draft_lora, adaptive, **(engine_kwargs or {})),
        deployment_config=dict(
            autoscaling_config=dict(min_replicas=replicas, max_replicas=replicas)
        ),
        runtime_env=runtime_env,
        **resources,
    )


def build_app(*configs: LLMConfig) -> Application:
    """The OpenAI-compatible app (`/v1/completions`, `/v1/chat/completions`, `/v1/models`)
    serving each `LLMConfig` under its `model_id`; start it with `ray.serve.run(app)`."""
    from ray.serve.llm import build_openai_app

    if not configs:
        raise ValueError("build_app needs at least one LLMConfig")
    args: dict[str, Any] = {"llm_configs": list(configs)}
    if on_cpu():
        args["ingress_deployment_config"] = {"ray_actor_options": {"num_cpus": 0}}
    return build_openai_app(args)
