"""Real-vLLM e2e tests need the cached vLLM CPU venv and the tiny model.

On a fresh machine building them takes minutes; `vllm_ready` does it once per session with
pytest's output capture suspended, so `make test` shows pip's progress instead of seeming stuck.
"""

from __future__ import annotations

import pytest

from dev.builds import tiny_model, venv


@pytest.fixture(scope="session")
def vllm_ready(pytestconfig) -> None:
    if venv.is_ready() and tiny_model.is_ready():
        return
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\n[e2e] preparing the vLLM CPU venv and the tiny model (one time; cached for later runs)", flush=True)
        venv.ensure()
        tiny_model.ensure()
