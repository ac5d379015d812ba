"""Every generated file of the repository and the one generator of each: `make generate` writes them all.

| file | generator |
|---|---|
| `crds/serving.epd.dev_epddeployments.yaml` and the epd-operator chart's copy | `build_crd()` as `epdctl crd` prints it |
| `operator/epd_operator/api/kube_schemas.json` | `dev/generate/kube_schemas.py` (Kubernetes' OpenAPI definitions) |
| `charts/epd-deployment/values.schema.json` | `dev/generate/values_schema.py` (from the generated CRD) |
| `charts/epd-operator/dashboards/epd.json` | `dev/generate/dashboard.py` |
| the field reference in `docs/api.md`, between its markers | `reference()` as `epdctl docs --output docs/api.md` writes it |
| the router's metric table in `docs/router.md`, between its markers | `dev/generate/router_metrics.py` |
| the router's flag table in `docs/router.md`, between its markers | `dev/generate/router_flags.py` |
| the operator's metric table in `docs/operator.md`, between its markers | `dev/generate/operator_metrics.py` |
| `tests/golden/render/*.yaml`: what `render()` makes of every example | `dev/generate/render_golden.py` |
| measured figures in `docs/benchmarks.md`, `docs/faults.md`, `docs/autoscaling.md` and `docs/development.md`, between their markers | `dev/generate/bench_figures.py` (from the reports in `bench/results/`) |

`files(root)` computes every file's text from the code and, for pages with a generated part, the page under
`root` (and, for the figures, the reports in `bench/results/`); it reads nothing else and writes nothing. `python -m dev.generate` writes them into the repository,
`--out DIR` into DIR instead (the freshness test, tests/unit/dev/test_generate.py, compares those with the
committed files).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from epd_operator.api.crd import build_crd
from epd_operator.api.docs import with_reference
from epd_operator.cli import dump_yaml

from . import (
    bench_figures,
    dashboard,
    kube_schemas,
    operator_metrics,
    render_golden,
    router_flags,
    router_metrics,
    values_schema,
)

REPO = Path(__file__).resolve().parents[2]
CRD = "crds/serving.epd.dev_epddeployments.yaml"
CHART_CRD = "charts/epd-operator/crds/serving.epd.dev_epddeployments.yaml"
API_PAGE = "docs/api.md"


def files(root: Path = REPO) -> dict[str, str]:
    """Every generated file, by its path relative to the repository root."""
    crd = build_crd()
    crd_text = dump_yaml([crd])
    return {
        CRD: crd_text,
        CHART_CRD: crd_text,
        kube_schemas.PATH: kube_schemas.render(),
        values_schema.PATH: values_schema.render(crd),
        dashboard.PATH: dashboard.render(),
        API_PAGE: with_reference((root / API_PAGE).read_text(encoding="utf-8")),
        router_metrics.PAGE: router_flags.with_table(
            router_metrics.with_table((root / router_metrics.PAGE).read_text(encoding="utf-8"))
        ),
        operator_metrics.PAGE: operator_metrics.with_table((root / operator_metrics.PAGE).read_text(encoding="utf-8")),
        **bench_figures.pages(root),
        **render_golden.files(root),
    }


def write(out: Path, root: Path = REPO) -> list[str]:
    """Write every generated file under `out`; the paths written, relative to `out`."""
    generated = files(root)
    for path, text in generated.items():
        target = out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return list(generated)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.generate", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO, help="write under this folder (default: the repository)")
    args = parser.parse_args(argv)
    for path in write(args.out):
        print(f"wrote {path}", file=sys.stderr)
    return 0
