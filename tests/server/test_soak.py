"""Soak: `benchmarks/soak.py` against real `vllm serve` processes, ISD and lossless.

64 concurrent clients, random prompt lengths with repeats (prefix-cache hits), random
sampling options, streams aborted mid-way, bad requests interleaved. Bounded: four rounds
of a 300-request mix per mode, the first three warm-up (about 5 minutes on 2 cores).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_soak_isd_and_lossless_servers(demo_models, tmp_path):
    report_path = tmp_path / "soak.json"
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "soak.py"),
        "--models",
        str(demo_models["idlm"].parent),
        "--requests",
        "300",
        "--concurrency",
        "64",
        "--json",
        str(report_path),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    print(run.stdout)
    assert report_path.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    reports = json.loads(report_path.read_text())
    assert [r["mode"] for r in reports] == ["isd", "lossless"]
    for r in reports:
        assert r["engine_alive"] and r["engine_errors"] == 0, r["problems"]
        assert r["failed_5xx"] == 0 and r["incomplete"] == 0, r["problems"]
        assert r["bad_not_refused"] == 0, r["problems"]
        assert r["greedy_mismatches"] == 0 and r["greedy_checked"] >= 60, r["problems"]
        assert r["aborted"] >= 20 and r["refused_4xx"] >= 15
        assert r["served"] + r["aborted"] + r["refused_4xx"] == r["requests"]
        # Memory flat after warm-up: growth within 5% of the warmed-up footprint.
        assert r["rss_end_mb"] <= r["rss_after_warmup_mb"] * 1.05, r
    assert run.returncode == 0, run.stdout[-3000:]
