"""Local-run adaptations of vLLM's NIXL path to a small shared CPU; never part of a rendered pod.

`dev.local.plan` puts this directory on the PYTHONPATH of the local vLLM processes that run the
rendered NixlConnector, so Python imports this file at start-up in the API server and in every
engine process it spawns. Kubernetes pods never see it: the rendered manifests are unchanged.

Two behaviours of vLLM 0.32's NIXL worker on a CPU-only host starve a machine of 2 cores shared
by several instances (decode falls behind, prefill's KV lease expires, and decode may read blocks
prefill has already released). Each is undone here, selected by an environment variable:

* ``EPD_LOCAL_NIXL_NO_CORE_RESERVATION=1``: on the CPU platform the NIXL worker reserves "the last
  core of each NUMA node" for KV transfer and pins the model thread to it with
  ``os.sched_setaffinity``, whatever ``VLLM_CPU_OMP_THREADS_BIND`` says, so every instance on the
  host lands on the same core. ``CpuPlatform.discover_numa_topology`` (whose only caller is that
  reservation) then reports no cores to reserve, and nothing is pinned.
* ``EPD_LOCAL_NIXL_PROGRESS_DELAY_US=<µs>``: NIXL's Python API creates every agent with a
  progress-thread delay of 0, so each agent's UCX progress thread busy-polls most of a core. The
  delay is set to the given value on the agent config just before the agent is created.

Each adaptation is applied when its module is first imported (an import hook), so a process that
never loads NIXL is unaffected, and each logs one line to stderr when it takes effect.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

NO_CORE_RESERVATION = "EPD_LOCAL_NIXL_NO_CORE_RESERVATION"
PROGRESS_DELAY_US = "EPD_LOCAL_NIXL_PROGRESS_DELAY_US"


def _say(message: str) -> None:
    print(f"[epd-operator local run] {message}", file=sys.stderr, flush=True)


def _no_core_reservation(module: ModuleType) -> None:
    def discover_numa_topology(cls: type) -> list[list[int]]:
        return []

    module.CpuPlatform.discover_numa_topology = classmethod(discover_numa_topology)
    _say("NIXL KV-transfer core reservation off: the model thread is not pinned (CPU adaptation)")


def _progress_delay(delay_us: int) -> Callable[[ModuleType], None]:
    def patch(module: ModuleType) -> None:
        bindings = module.nixlBind

        class Bindings:
            """NIXL's compiled bindings, except that agents get the progress-thread delay."""

            def __getattr__(self, name: str) -> Any:
                return getattr(bindings, name)

            @staticmethod
            def nixlAgent(name: str, config: Any) -> Any:
                config.pthrDelay = delay_us
                return bindings.nixlAgent(name, config)

        setattr(module, "nixlBind", Bindings())  # noqa: B010 (a module attribute mypy cannot know)
        _say(f"NIXL progress-thread delay {delay_us} us in {module.__name__} (CPU adaptation)")

    return patch


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a patch on a module right after its code has run, the first time it is imported."""

    def __init__(self, patches: dict[str, Callable[[ModuleType], None]]) -> None:
        self.patches = patches

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        patch = self.patches.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader: Any = spec.loader  # a source loader, one per module: its exec_module is wrapped
        if loader is None:
            return None
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            patch(module)

        loader.exec_module = exec_module
        return spec


def _install() -> None:
    patches: dict[str, Callable[[ModuleType], None]] = {}
    if os.environ.get(NO_CORE_RESERVATION) == "1":
        patches["vllm.platforms.cpu"] = _no_core_reservation
    delay = os.environ.get(PROGRESS_DELAY_US, "")
    if delay.isdigit():
        for backend in ("nixl_cu13", "nixl_cu12"):  # the per-CUDA wheels the `nixl` meta-package loads
            patches[f"{backend}._api"] = _progress_delay(int(delay))
    if patches:
        sys.meta_path.insert(0, _AfterImport(patches))


_install()
