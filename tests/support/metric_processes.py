"""The processes of a metrics pipeline that a test starts, stops and starts again (Prometheus, and
prometheus-adapter with the operator chart's rules): a metric source lost for a while, then back."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from dev.builds import go_module
from dev.lifetimes import kill_with_parent
from dev.parts import prometheus_adapter
from tests.support.cluster import CUSTOM_METRICS_GROUP as GROUP
from tests.support.cluster import end_process

ADAPTER_RULES = Path(__file__).resolve().parents[2] / "charts" / "epd-operator" / "prometheus-adapter" / "values.yaml"


@dataclass(kw_only=True)
class Processes:
    """Processes by name ("prometheus", "adapter"): how each starts (`argv`), its log, and the one running now."""

    logs: dict[str, Path]
    argv: dict[str, list[str]] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str) -> None:
        """Start one of them (again), appending to its log; it dies with this process."""
        assert name not in self.procs, f"{name} is running"
        with self.logs[name].open("ab") as out:  # the child keeps its own descriptor
            self.procs[name] = subprocess.Popen(
                self.argv[name], stdout=out, stderr=subprocess.STDOUT, preexec_fn=kill_with_parent
            )

    def stop(self, name: str) -> None:
        """SIGTERM one of them, SIGKILL if it is still there 20 s later."""
        end_process(self.procs.pop(name))

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)

    def tail(self, name: str) -> str:
        path = self.logs[name]
        return path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"

    def tails(self) -> str:
        return "\n".join(f"{name}:\n{self.tail(name)}" for name in self.logs)


def adapter_argv(tmp: Path, *, kubeconfig: Path, port: int, prometheus_url: str) -> list[str]:
    """prometheus-adapter (built when missing) serving custom.metrics.k8s.io on 127.0.0.1:`port` with the
    operator chart's rules, reading `prometheus_url`; its configuration and certificates under `tmp`."""
    adapter = go_module.ensure(prometheus_adapter.ADAPTER)
    rules = yaml.safe_load(ADAPTER_RULES.read_text())["rules"]
    config = tmp / "adapter.yaml"
    config.write_text(yaml.safe_dump({"rules": rules["custom"]}))  # what the adapter chart renders
    discovery = [f"/apis/{GROUP}", f"/apis/{GROUP}/v1beta1", f"/apis/{GROUP}/v1beta2", "/openapi/v2", "/openapi/v3"]
    return [
        str(adapter),
        f"--secure-port={port}",
        "--bind-address=127.0.0.1",
        f"--cert-dir={tmp / 'adapter-certs'}",
        f"--lister-kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--authentication-tolerate-lookup-failure",
        "--authorization-always-allow-paths=" + ",".join(["/healthz", "/readyz", "/livez", *discovery]),
        f"--prometheus-url={prometheus_url}",
        f"--config={config}",
        "--metrics-relist-interval=2s",
    ]
