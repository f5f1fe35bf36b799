"""Session-wide runtime: one Ray runtime and one instance of each engine (vLLM loads once)."""

from __future__ import annotations

import pytest

from teola_plugin.runtime.runtime import Runtime, default_engine_specs


@pytest.fixture(scope="session")
def runtime():
    rt = Runtime(default_engine_specs(), hosting="ray")
    rt.run_sync(rt.start_engines(), timeout=900)
    yield rt
    rt.shutdown()


@pytest.fixture(scope="session")
def llm(runtime):
    """The vLLM engine pool inside its Ray actor."""
    return runtime.engines("llm")


@pytest.fixture
def call(runtime):
    """Run a coroutine on the runtime loop: ``call(pool.call("generate", ...))``."""
    return lambda coro, timeout=300: runtime.run_sync(coro, timeout=timeout)
