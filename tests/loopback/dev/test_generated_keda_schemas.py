"""The generated files are fresh even where KEDA's Go module was not fetched before: the unit tier's check
(tests/unit/dev/test_generate.py) skips without it, since fetching runs `go`; this one fetches it first."""

from __future__ import annotations

from pathlib import Path

from dev import generate
from dev.parts import keda

REPO = Path(__file__).resolve().parents[3]


def test_every_generated_file_is_committed_as_generated_with_keda_fetched(tmp_path):
    assert (keda.source() / keda.SCALED_OBJECTS_CRD).is_file()
    written = generate.write(tmp_path)
    stale = [path for path in written if (REPO / path).read_bytes() != (tmp_path / path).read_bytes()]
    assert stale == [], f"stale generated files: {stale}; run `make generate` and commit them"
