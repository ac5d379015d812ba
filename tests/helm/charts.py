"""Running helm against the repository's charts and reading what it renders."""

from __future__ import annotations

import functools
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dev.builds.k8s_binaries import NEWEST, minor

REPO = Path(__file__).resolve().parents[2]
OPERATOR_CHART = REPO / "charts" / "epd-operator"
DEPLOYMENT_CHART = REPO / "charts" / "epd-deployment"
CHARTS = {"epd-operator": OPERATOR_CHART, "epd-deployment": DEPLOYMENT_CHART}
# What `helm template`/`lint` assume of the cluster: a version the charts' kubeVersion accepts (helm
# 3's default, 1.32, is older than the charts claim).
KUBE_VERSION = f"{minor(NEWEST)}.0"


def ci_values(chart: Path) -> list[Path]:
    """Per-scenario values files (helm's `ci/` convention)."""
    return sorted((chart / "ci").glob("*-values.yaml"))


def values_cases() -> list[tuple[str, Path | None]]:
    """(chart name, values file or None for the defaults) for every chart and scenario."""
    return [(name, values) for name, chart in CHARTS.items() for values in [None, *ci_values(chart)]]


def case_id(case: tuple[str, Path | None]) -> str:
    name, values = case
    return f"{name}:{values.name.removesuffix('-values.yaml') if values else 'defaults'}"


@dataclass(frozen=True)
class HelmResult:
    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Helm:
    binary: Path

    @property
    def major(self) -> int:
        out = self.run("version", "--template", "{{.Version}}").stdout
        return int(out.lstrip("v").split(".")[0])

    def run(self, *args: str) -> HelmResult:
        # No kubeconfig: these tests must never reach whatever cluster the developer has.
        env = {**os.environ, "KUBECONFIG": os.devnull}
        proc = subprocess.run([str(self.binary), *args], capture_output=True, text=True, timeout=120, env=env)
        return HelmResult(proc.returncode, proc.stdout, proc.stderr)

    def notes(self, chart: Path, *sets: str, release: str = "epd", namespace: str = "epd-system") -> str:
        """NOTES.txt as `helm install` prints it (rendered client-side, nothing installed)."""
        if self.major < 4:
            pytest.skip("helm 3's `install --dry-run=client` still contacts a cluster; NOTES are checked with helm 4")
        result = self.run("install", release, str(chart), "-n", namespace, "--dry-run=client", *_value_args(None, sets))
        if result.returncode != 0:
            raise AssertionError(f"helm install --dry-run=client {chart.name} failed:\n{result.stderr}")
        return result.stdout.split("NOTES:", 1)[1]

    def lint(self, chart: Path, values: Path | None = None, *sets: str) -> HelmResult:
        return self.run("lint", "--strict", "--kube-version", KUBE_VERSION, str(chart), *_value_args(values, sets))

    # Rendering is deterministic; many tests read the same render. One Helm per binary lives for the
    # session, so the cache holding it alive costs nothing (B019).
    @functools.lru_cache(maxsize=256)  # noqa: B019
    def template_text(
        self, chart: Path, values: Path | None = None, *sets: str, release: str = "epd", namespace: str = "epd-system"
    ) -> HelmResult:
        return self.run(
            "template",
            release,
            str(chart),
            "--namespace",
            namespace,
            "--include-crds",
            "--kube-version",
            KUBE_VERSION,
            *_value_args(values, sets),
        )

    def template(
        self, chart: Path, values: Path | None = None, *sets: str, release: str = "epd", namespace: str = "epd-system"
    ) -> list[dict[str, Any]]:
        """The rendered objects; fails the test with helm's message when rendering fails."""
        result = self.template_text(chart, values, *sets, release=release, namespace=namespace)
        if result.returncode != 0:
            raise AssertionError(f"helm template {chart.name} failed:\n{result.stderr}")
        return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _value_args(values: Path | None, sets: tuple[str, ...]) -> list[str]:
    args = ["--values", str(values)] if values else []
    for item in sets:
        args += ["--set", item]
    return args


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, rendered {len(found)}"
    return found[0]
