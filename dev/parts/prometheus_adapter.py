"""prometheus-adapter (sigs.k8s.io/prometheus-adapter), which serves the custom metrics API from Prometheus
with the operator chart's adapter rules: built once from the Go module proxy into
``~/.cache/epd-operator/prometheus-adapter/<version>/adapter``.

`go install module@version` needs the module's version list, which the proxy does not serve for this
module, so the pinned version's source is downloaded and built against its own go.mod and go.sum
(``dev/builds/go_module.py``). Cold: about 35 minutes on 2 busy cores, most of it compiling k8s.io/apiserver.

The cluster does not start it by itself: it reads a Prometheus, which only a test that makes load has. The
tests that serve the custom metrics API run it beside their own Prometheus, registered as the
custom.metrics.k8s.io APIService (``tests/integration/test_autoscaling_adapter.py``, on the host;
``tests/support/autoscale_loop.py``, in the real node's network namespace), from :data:`ADAPTER`'s binary.

    python -m dev.parts build prometheus-adapter      # build (or find) it
"""

from __future__ import annotations

from dev.builds import go_module
from dev.cluster.components import ClusterComponents
from dev.parts.part import BY_TESTS, GoPart

ADAPTER = go_module.GoBinary(
    "prometheus-adapter", "sigs.k8s.io/prometheus-adapter", "v0.12.0", "./cmd/adapter", "adapter"
)


class PrometheusAdapter(GoPart):
    name = "prometheus-adapter"
    summary = "the custom metrics API from a Prometheus, with the operator chart's adapter rules"
    starts = BY_TESTS
    BINARIES = (ADAPTER,)

    def unavailable(self, cluster: ClusterComponents) -> str | None:
        return (
            "prometheus-adapter reads a Prometheus that only a test with load has: the tests that use it run it"
            " beside their own (dev/parts/prometheus_adapter.py says which)"
        )
