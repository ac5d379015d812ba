"""PromQL syntax check with Prometheus' own grammar (`@prometheus-io/lezer-promql`, the parser of
the Prometheus UI), so a dashboard panel or recording rule that would not parse fails a test.

No promtool ships in any registry these machines reach; the lezer grammar does (npm), and node
runs it. The pinned package is installed once into a cache outside the repository.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGE = "@prometheus-io/lezer-promql@0.315.0"
CACHE = Path(os.environ.get("EPD_CACHE_DIR", Path.home() / ".cache" / "epd-operator")) / "node" / "lezer-promql-0.315.0"

# Reads a JSON list of expressions on stdin; prints the ones the grammar flags, with context.
CHECKER = r"""
const { parser } = require("@prometheus-io/lezer-promql");
const exprs = JSON.parse(require("fs").readFileSync(0, "utf8"));
const problems = [];
for (const expr of exprs) {
  let first = null;
  parser.parse(expr).iterate({ enter(node) { if (node.type.isError && first === null) first = node.from; } });
  if (first !== null) problems.push(`${expr}\n    ${" ".repeat(first)}^ syntax error at ${first}`);
}
process.stdout.write(JSON.stringify(problems));
"""

# What Grafana and prometheus-adapter substitute before Prometheus sees a query.
GRAFANA_SUBSTITUTIONS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
ADAPTER_SUBSTITUTIONS = {
    "<<.Series>>": "some_series",
    "<<.LabelMatchers>>": 'namespace="ml",pod=~"a|b"',
    "<<.GroupBy>>": "pod",
}


class PromqlUnavailable(RuntimeError):
    pass


def ensure_parser() -> Path:
    """The folder whose node_modules holds the pinned grammar (installed on first use)."""
    if (CACHE / "node_modules" / "@prometheus-io" / "lezer-promql").is_dir():
        return CACHE
    npm = shutil.which("npm")
    if not npm or not shutil.which("node"):
        raise PromqlUnavailable("node and npm are needed for the PromQL grammar check")
    print(f"[promql] installing {PACKAGE} into {CACHE}", file=sys.stderr, flush=True)
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".lezer-promql-", dir=CACHE.parent))
    try:
        result = subprocess.run(
            [npm, "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(staging), PACKAGE],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if result.returncode != 0:
            raise PromqlUnavailable(f"npm install {PACKAGE} failed: {result.stderr.strip()[-1000:]}")
        try:
            staging.rename(CACHE)  # atomic: a concurrent run sees all of it or none
        except OSError:
            if not CACHE.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return CACHE


def substituted(expr: str) -> str:
    for placeholder, value in {**GRAFANA_SUBSTITUTIONS, **ADAPTER_SUBSTITUTIONS}.items():
        expr = expr.replace(placeholder, value)
    return expr


def syntax_errors(exprs: list[str]) -> list[str]:
    """The expressions (after Grafana/adapter substitution) Prometheus' grammar cannot parse."""
    folder = ensure_parser()
    result = subprocess.run(
        ["node", "-e", CHECKER],
        input=json.dumps([substituted(e) for e in exprs]),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=folder,
    )
    if result.returncode != 0:
        raise PromqlUnavailable(f"the PromQL checker failed: {result.stderr.strip()[-1000:]}")
    return json.loads(result.stdout)
