"""`make bench-autoscale`'s plot from recorded runs: matplotlib starts fc-list for its fonts, so this
lives beside the tests that may start processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import autoscale
from tests.unit.bench.test_autoscale import big_record, keda_record, record


def test_the_plot_draws_a_column_per_run(tmp_path: Path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "autoscale.png"
    autoscale.plot([record(False), record(True)], path)
    autoscale.plot([big_record(False), big_record(True)], tmp_path / "big.png")  # marks the decision and the spill
    from matplotlib import image

    height, width = image.imread(path).shape[:2]
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert width > 1.5 * height  # two columns of 7 inches side by side, 8 inches tall


def test_the_keda_plot_draws_encoders_load_and_latency(tmp_path: Path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "autoscale-keda.png"
    autoscale.keda_plot(keda_record(), path)
    from matplotlib import image

    height, width = image.imread(path).shape[:2]
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert width == pytest.approx(9 / 8 * height, rel=0.05)  # three panels 9 inches wide, 8 inches tall in all
