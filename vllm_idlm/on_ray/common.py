"""What the Ray entry points share: engine kwargs for ISD, CPU placement, engine metrics."""

from __future__ import annotations

import re
import time
import urllib.request
from typing import Any

RAY_VERSION = "2.60.0"

# vLLM's engine metrics as Ray exports them (vLLM's RayPrometheusStatLogger, which Ray Data
# LLM and Ray Serve LLM install): counters of the speculative decoder.
SPEC_COUNTERS = (
    "ray_vllm_spec_decode_num_drafts_total",
    "ray_vllm_spec_decode_num_draft_tokens_total",
    "ray_vllm_spec_decode_num_accepted_tokens_total",
)


def isd_engine_kwargs(
    num_drafts: int | None = 3,
    draft_lora: str | None = None,
    adaptive: bool | dict | None = None,
    **engine_kwargs: Any,
) -> dict[str, Any]:
    """vLLM engine kwargs with `"method": "idlm"` (num_drafts=None: plain decoding).

    The speculative config is a plain dict: Ray ships it to the engine actor, where
    `EngineArgs` and the plugin (loaded there by vLLM) translate it like `vllm serve` does.
    """
    kwargs = dict(engine_kwargs)
    if num_drafts is not None:
        spec: dict[str, Any] = {"method": "idlm", "num_speculative_tokens": int(num_drafts)}
        if draft_lora:
            spec["draft_lora"] = str(draft_lora)
        if adaptive is not None:
            spec["adaptive"] = adaptive if isinstance(adaptive, dict) else bool(adaptive)
        kwargs["speculative_config"] = spec
    return kwargs


def on_cpu() -> bool:
    """True with the CPU build of vLLM (no accelerator bundles, mp executor only)."""
    from vllm_idlm.seam.vllm import current_platform

    return current_platform.is_cpu()


def scrape(port: int, host: str = "127.0.0.1", timeout: float = 10.0) -> str:
    """Ray's Prometheus endpoint (`ray.init(_metrics_export_port=port)`) as text."""
    url = f"http://{host}:{port}/metrics"
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()


def counter_total(text: str, name: str) -> float:
    """Sum of a counter over all its label sets (engines, replicas) in Prometheus text."""
    total = 0.0
    for match in re.finditer(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", text, re.M):
        total += float(match.group(1))
    return total


def spec_counters(text: str) -> dict[str, float]:
    return {name: counter_total(text, name) for name in SPEC_COUNTERS}


def wait_for_counters(
    port: int, minimum: dict[str, float], timeout: float = 60.0, poll: float = 2.0
) -> dict[str, float]:
    """Poll the metrics endpoint until every counter in `minimum` reaches its value.

    Ray's workers push metrics to the node's agent every few seconds; the endpoint lags.
    Returns the last counters seen (the caller asserts on them)."""
    deadline = time.monotonic() + timeout
    seen: dict[str, float] = {}
    while True:
        try:
            seen = spec_counters(scrape(port))
        except OSError:
            seen = {}
        if seen and all(seen.get(k, 0.0) >= v for k, v in minimum.items()):
            return seen
        if time.monotonic() > deadline:
            return seen
        time.sleep(poll)
