"""The shipped examples as parsed EPDDeployments and rendered objects, plus ways to look into them.

Shared by the renderer's tests (and any test that wants realistic specs): every spec here is one
of `examples/*.yaml`, or one of them with a few fields changed.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Optional

import yaml

from epd_operator.api import EPDDeployment, parse_epd
from epd_operator.render import render

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"

SHARED_STORAGE = "epd-shared-storage.yaml"
NIXL_AUTOSCALED = "epd-nixl-autoscaled.yaml"
MOONCAKE = "epd-mooncake.yaml"
CPU_CONNECTOR = "epd-cpu-connector.yaml"


def example_files() -> list[Path]:
    return sorted(EXAMPLES_DIR.glob("*.yaml"))


def example_document(name: str) -> dict[str, Any]:
    with open(EXAMPLES_DIR / name, encoding="utf-8") as f:
        return yaml.safe_load(f)


def example(name: str, **changes: Any) -> EPDDeployment:
    """An example with `changes` applied, keyed by dotted path into the document:
    `example(NIXL_AUTOSCALED, **{"spec.decode.replicas": 3})`. A value of `None` removes the field.
    """
    doc = copy.deepcopy(example_document(name))
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = doc
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return parse_epd(doc)


def find(objects: list[dict], kind: str, name: str) -> dict:
    for obj in objects:
        if obj["kind"] == kind and obj["metadata"]["name"] == name:
            return obj
    raise LookupError(f"no {kind} {name} among {[(o['kind'], o['metadata']['name']) for o in objects]}")


def maybe_find(objects: list[dict], kind: str, name: str) -> Optional[dict]:
    try:
        return find(objects, kind, name)
    except LookupError:
        return None


def container(deployment: dict, name: str) -> dict:
    for c in deployment["spec"]["template"]["spec"]["containers"]:
        if c["name"] == name:
            return c
    raise LookupError(f"no container {name} in {deployment['metadata']['name']}")


def pod_spec(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]


def env_of(c: dict) -> dict[str, Any]:
    """A container's env by name: the literal value, or the `valueFrom` mapping."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def flag(args: list[str], name: str) -> Optional[str]:
    """The value following `name` in an argv (the last occurrence wins, as in argparse)."""
    value = None
    for i, arg in enumerate(args[:-1]):
        if arg == name:
            value = args[i + 1]
    return value


def serve_argvs(objects: list[dict]) -> list[list[str]]:
    """Every `vllm serve` command line among the rendered Deployments."""
    return [c["command"] + c["args"]
            for obj in objects if obj["kind"] == "Deployment"
            for c in obj["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]


def rendered_examples() -> dict[str, list[dict]]:
    return {path.name: render(parse_epd(example_document(path.name))) for path in example_files()}
