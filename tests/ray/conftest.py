"""A local Ray cluster per test module, started from the environment this session began with.

vLLM's CPU platform edits os.environ of a process that starts an engine in-process (LD_PRELOAD,
OpenMP thread settings); earlier tests of the same session do that, and Ray's processes would
inherit it. The snapshot below is taken when pytest loads this file, before any test runs."""

from __future__ import annotations

import contextlib
import os

import pytest

PRISTINE_ENV = dict(os.environ)


@contextlib.contextmanager
def pristine_env():
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(PRISTINE_ENV)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def session_env() -> dict[str, str]:
    """A copy of the environment as it was before any test ran (for subprocesses)."""
    return dict(PRISTINE_ENV)


@pytest.fixture(scope="session")
def start_ray():
    """start_ray(**ray_init_kwargs): ray.init(num_cpus=2, ...) in the pristine environment."""
    import ray

    def start(**kwargs):
        with pristine_env():
            ray.init(**{"num_cpus": 2, "include_dashboard": False, **kwargs})

    return start
