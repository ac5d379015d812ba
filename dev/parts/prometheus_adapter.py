"""prometheus-adapter (sigs.k8s.io/prometheus-adapter), built once from the Go module proxy into
``~/.cache/epd-operator/prometheus-adapter/<version>/adapter``, for the tests that serve the custom
metrics API on the local control plane with the operator chart's adapter rules.

`go install module@version` needs the module's version list, which the proxy does not serve for this
module, so the pinned version's source is downloaded and built against its own go.mod and go.sum
(``dev/builds/go_module.py``). Cold: about 35 minutes on 2 busy cores, most of it compiling k8s.io/apiserver.

    python -m dev.parts.prometheus_adapter      # build (or find) it and print its path
"""

from __future__ import annotations

from pathlib import Path

from dev.builds import go_module

ADAPTER = go_module.GoBinary(
    "prometheus-adapter", "sigs.k8s.io/prometheus-adapter", "v0.12.0", "./cmd/adapter", "adapter"
)


def ensure() -> Path:
    """The adapter binary, built when absent."""
    return go_module.ensure(ADAPTER)


if __name__ == "__main__":
    print(ensure())
