"""Write charts/epd-deployment/ci/<example>-values.yaml for every examples/*.yaml.

Each values file is the example's spec (and its name as `fullnameOverride`) plus `null` for every
chart default the example leaves unset, because helm merges values over the chart's defaults and
null is how a values file removes one. test_deployment_chart.py renders each file and requires
the example's exact spec back.

    python -m tests.helm.ci_values
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from dev.local.runner import load_spec

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
CHART = REPO / "charts" / "epd-deployment"
CHART_ONLY_VALUES = {"fullnameOverride", "labels", "annotations"}


def defaults_to_clear(defaults: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """null for each default key the spec does not set, recursing where both have a mapping."""
    cleared: dict[str, Any] = {}
    for key, value in defaults.items():
        if key not in spec:
            cleared[key] = None
        elif isinstance(value, dict) and isinstance(spec[key], dict):
            nested = defaults_to_clear(value, spec[key])
            if nested:
                cleared[key] = nested
    return cleared


def overlay(spec: dict[str, Any], cleared: dict[str, Any]) -> dict[str, Any]:
    """The spec in its own key order, then the cleared defaults it lacks."""
    out = {
        key: overlay(value, cleared[key]) if isinstance(value, dict) and isinstance(cleared.get(key), dict) else value
        for key, value in spec.items()
    }
    out.update({key: value for key, value in cleared.items() if key not in out})
    return out


def values_for(example: Path, defaults: dict[str, Any]) -> str:
    doc = load_spec(example)
    spec_defaults = {k: v for k, v in defaults.items() if k not in CHART_ONLY_VALUES}
    values = {
        "fullnameOverride": doc["metadata"]["name"],
        **overlay(doc["spec"], defaults_to_clear(spec_defaults, doc["spec"])),
    }
    header = (
        f"# Mirrors examples/{example.name} (kept equal by tests/helm/test_deployment_chart.py;\n"
        "# regenerate with `python -m tests.helm.ci_values`): the example's spec, plus null for\n"
        "# each chart default the example leaves unset.\n"
    )
    return header + yaml.safe_dump(values, sort_keys=False, default_flow_style=None, width=100)


def main() -> None:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    for example in sorted(EXAMPLES.glob("*.yaml")):
        target = CHART / "ci" / f"{example.stem}-values.yaml"
        target.write_text(values_for(example, defaults))
        print(f"wrote {target.relative_to(REPO)}", file=sys.stderr)


if __name__ == "__main__":
    main()
