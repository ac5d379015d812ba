"""The image recipes agree with the package and the charts (no Docker needed to check that)."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata

import yaml
from packaging.requirements import Requirement

from epd_operator.api import router as api_router
from epd_operator.api import spec as api_spec

from .charts import OPERATOR_CHART, REPO

OPERATOR_DOCKERFILE = REPO / "images" / "operator" / "Dockerfile"
OPERATOR_REQUIREMENTS = REPO / "images" / "operator" / "requirements.txt"
VLLM_DOCKERFILE = REPO / "images" / "vllm-epd" / "Dockerfile"


def pinned() -> dict[str, str]:
    pins = {}
    for line in OPERATOR_REQUIREMENTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"{OPERATOR_REQUIREMENTS.name}: {line!r} is not pinned with =="
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def test_operator_image_pins_every_runtime_dependency_compatibly():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = pinned()
    for spec in project["dependencies"]:
        req = Requirement(spec)
        if req.marker and not req.marker.evaluate():
            continue
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in pins, f"pyproject dependency {req.name} is not pinned in {OPERATOR_REQUIREMENTS.name}"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"{OPERATOR_REQUIREMENTS.name} pins {name}=={pins[name]}, outside pyproject's {req.specifier}"
        )


def runtime_closure(dist: str) -> set[str]:
    """Names of every distribution `dist` needs at runtime (no extras), from installed metadata."""
    seen: set[str] = set()
    pending = [dist]
    while pending:
        name = re.sub(r"[-_.]+", "-", pending.pop()).lower()
        if name in seen:
            continue
        seen.add(name)
        for spec in metadata.distribution(name).requires or []:
            req = Requirement(spec)
            if not req.marker or req.marker.evaluate({"extra": ""}):
                pending.append(req.name)
    return seen - {dist}


def test_operator_image_pins_the_whole_runtime_closure():
    needed = runtime_closure("epd-operator")  # `make install` put it there; missing is a failure
    missing = needed - set(pinned())
    assert not missing, f"{OPERATOR_REQUIREMENTS.name} lacks {sorted(missing)}: regenerate it (see its header)"


def test_operator_image_pins_the_tracing_extra_and_what_it_needs():
    """The router's traces ship in the image: the `tracing` extra and its whole closure are pinned."""
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["tracing"]
    pins = pinned()
    needed: set[str] = set()
    for spec in extra:
        req = Requirement(spec)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in pins, f"{OPERATOR_REQUIREMENTS.name} lacks {name} (the tracing extra)"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"{OPERATOR_REQUIREMENTS.name} pins {name}=={pins[name]}, outside pyproject's {req.specifier}"
        )
        needed |= {name} | runtime_closure(name)
    missing = needed - set(pins)
    assert not missing, f"{OPERATOR_REQUIREMENTS.name} lacks {sorted(missing)} (needed by the tracing extra)"
    assert "tracing_available" in OPERATOR_DOCKERFILE.read_text(), (
        "the image build does not check that the tracing extra is installed"
    )


def test_operator_image_runs_as_the_charts_non_root_user():
    dockerfile = OPERATOR_DOCKERFILE.read_text()
    values = yaml.safe_load((OPERATOR_CHART / "values.yaml").read_text())
    uid = values["podSecurityContext"]["runAsUser"]
    assert re.search(rf"^USER {uid}:{uid}$", dockerfile, re.M)
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11\.\d+-slim-\w+$", dockerfile, re.M), (
        "base must be a pinned slim tag"
    )
    assert "--no-deps" in dockerfile and "requirements.txt" in dockerfile


def test_chart_and_api_agree_on_the_operator_image():
    chart = yaml.safe_load((OPERATOR_CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((OPERATOR_CHART / "values.yaml").read_text())
    assert f"{values['image']['repository']}:{chart['appVersion']}" == api_router.DEFAULT_ROUTER_IMAGE


def test_vllm_image_extends_the_default_vllm_image_with_pinned_transfer_engines():
    api = api_spec
    dockerfile = VLLM_DOCKERFILE.read_text()
    assert f"ARG VLLM_IMAGE={api.DEFAULT_VLLM_IMAGE}\n" in dockerfile
    for arg in ("NIXL_VERSION", "MOONCAKE_VERSION"):
        assert re.search(rf"^ARG {arg}=\d+\.\d+\.\d+\S*$", dockerfile, re.M), f"{arg} must be pinned"
    # vLLM writes the shared encoder cache as the image user; the rendered janitor sidecar deletes it
    # as root with no capabilities, which only works while the two are the same uid.
    assert not re.search(r"^USER ", dockerfile, re.M), "vllm-epd must keep the upstream (root) user"
