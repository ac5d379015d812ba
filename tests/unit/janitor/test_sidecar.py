"""The cache janitor sidecar (janitor/sidecar.py): one log line and the metrics per sweep, stop requests, its
command line as `epd-janitor`, `epdctl janitor` and the renderer give it."""

from __future__ import annotations

from pathlib import Path

import pytest

from epd_operator import janitor
from epd_operator.janitor import Policy, sweep
from tests.support.janitor_cache import NOW, TTL, holding, put


def test_one_log_line_per_sweep_names_entries_bytes_and_deletions(tmp_path, caplog):
    put(tmp_path, "old", TTL + 1, size=2048)
    put(tmp_path, "young", 1, size=1024)
    with caplog.at_level("INFO", logger="epd_operator.janitor"):
        janitor.run_once(tmp_path, Policy(TTL), janitor.Metrics(), now=NOW)
    (line,) = [r.message for r in caplog.records]
    assert line == "sweep: deleted 1 entries (2.0 KiB); 1 entries (1.0 KiB) remain"


def test_metrics_count_what_sweeps_did(tmp_path):
    metrics = janitor.Metrics()
    put(tmp_path, "old", TTL + 1, size=300)
    put(tmp_path, "young", 1, size=50)
    metrics.record(sweep(tmp_path, Policy(TTL), now=NOW))
    sample = metrics.registry.get_sample_value
    assert sample("epd_cache_janitor_sweeps_total") == 1
    assert sample("epd_cache_janitor_deleted_entries_total") == 1
    assert sample("epd_cache_janitor_deleted_bytes_total") == 300
    assert (sample("epd_cache_janitor_entries"), sample("epd_cache_janitor_bytes")) == (1, 50)


def test_a_stop_request_ends_a_sweep_between_deletions(tmp_path):
    for i in range(5):
        put(tmp_path, f"old-{i}", TTL + 1 + i)
    asked = iter([False, False, True])
    result = sweep(tmp_path, Policy(TTL), now=NOW, stopping=lambda: next(asked))
    assert result.deleted_entries == 2
    assert len(holding(tmp_path)) == 3


def test_once_sweeps_and_exits_zero(tmp_path):
    put(tmp_path, "ancient", NOW - 1)  # main() sweeps at wall-clock time: written in 1970
    with pytest.raises(SystemExit) as exit_:
        janitor.main(["--path", str(tmp_path), "--ttl-seconds", "60", "--once"])
    assert exit_.value.code == 0
    assert holding(tmp_path) == set()


def test_epdctl_janitor_passes_its_flags_through(tmp_path):
    from epd_operator.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["janitor", "--path", str(tmp_path), "--ttl-seconds", "60", "--once"])
    assert exit_.value.code == 0


@pytest.mark.parametrize(
    "argv, complaint",
    [
        (["--ttl-seconds", "60"], "--path"),
        (["--path", "{tmp}", "--ttl-seconds", "0"], "at least 1"),
        (["--path", "{tmp}", "--ttl-seconds", "60", "--max-size", "lots"], "not a Kubernetes quantity"),
    ],
)
def test_bad_flags_are_refused_with_a_reason(tmp_path, capsys, argv, complaint):
    with pytest.raises(SystemExit) as exit_:
        janitor.main([a.format(tmp=tmp_path) for a in argv])
    assert exit_.value.code == 2
    assert complaint in capsys.readouterr().err


def test_the_rendered_sidecar_arguments_are_ones_the_janitor_takes():
    from epd_operator.api.spec import SharedStorage
    from epd_operator.render.transfer import janitor_args

    storage = SharedStorage(claimName="ec", path="/ec-cache", maxSize="50Gi", ttlSeconds=900)
    args = janitor.build_parser().parse_args(janitor_args(storage))
    assert (args.path, args.ttl_seconds, args.max_size) == (Path("/ec-cache"), 900, 50 * 2**30)


def test_a_missing_path_is_an_error_not_a_silent_loop(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        janitor.main(["--path", str(tmp_path / "not-mounted"), "--ttl-seconds", "60", "--once"])
    assert exit_.value.code == 1
