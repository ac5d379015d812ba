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
    from epd_operator.api.transfer import SharedStorage
    from epd_operator.render.transfer import janitor_args

    storage = SharedStorage(claimName="ec", path="/ec-cache", maxSize="50Gi", ttlSeconds=900)
    args = janitor.build_parser().parse_args(janitor_args(storage))
    assert (args.path, args.ttl_seconds, args.max_size) == (Path("/ec-cache"), 900, 50 * 2**30)


def test_a_missing_path_is_an_error_not_a_silent_loop(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        janitor.main(["--path", str(tmp_path / "not-mounted"), "--ttl-seconds", "60", "--once"])
    assert exit_.value.code == 1


@pytest.mark.parametrize(
    "n, shown",
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536 * 1024, "1.5 MiB"),
        (2 * 2**30, "2.0 GiB"),
        (5 * 2**40, "5.0 TiB"),
        (2048 * 2**40, "2048.0 TiB"),
    ],
)
def test_sizes_in_the_log_are_binary_units(n, shown):
    assert janitor.sidecar._human(n) == shown


def test_the_sweep_line_says_how_many_entries_were_kept_because_written_meanwhile():
    result = janitor.SweepResult(
        entries=3, bytes=300, deleted_entries=1, deleted_bytes=100, over_limit=False, kept_fresh=2
    )
    assert result.summary() == (
        "sweep: deleted 1 entries (100 B); 3 entries (300 B) remain; kept 2 written to during the sweep"
    )


def test_a_failed_sweep_is_counted_and_logged_and_the_next_one_runs(tmp_path, caplog):
    metrics = janitor.Metrics()
    with caplog.at_level("INFO", logger="epd_operator.janitor"):
        assert janitor.run_once(tmp_path / "unmounted", Policy(TTL), metrics, now=NOW) is None
    assert metrics.registry.get_sample_value("epd_cache_janitor_sweep_errors_total") == 1
    assert metrics.registry.get_sample_value("epd_cache_janitor_sweeps_total") == 0
    (record,) = caplog.records
    assert record.levelname == "ERROR" and record.message.startswith("sweep failed: [Errno 2]")


def test_the_over_limit_warning_names_the_size_the_bound_and_the_ttl(tmp_path, caplog):
    put(tmp_path, "young", 10, size=3 * 1024)
    with caplog.at_level("WARNING", logger="epd_operator.janitor"):
        janitor.run_once(tmp_path, Policy(TTL, max_bytes=2048), janitor.Metrics(), now=NOW)
    (record,) = caplog.records
    assert record.message == (
        "cache holds 3.0 KiB, above --max-size 2.0 KiB, and everything left is younger than the TTL "
        f"({TTL}s): raise maxSize or lower ttlSeconds"
    )


def test_every_metric_is_described():
    from prometheus_client import generate_latest

    janitor.Metrics().record(janitor.SweepResult(1, 2, 3, 4, over_limit=True, kept_fresh=0))
    helps = {
        line.split(" ", 3)[2]: line.split(" ", 3)[3]
        for line in generate_latest(janitor.Metrics().registry).decode().splitlines()
        if line.startswith("# HELP ")
    }
    assert helps == {
        "epd_cache_janitor_entries": "Cache entries holding data after the last sweep",
        "epd_cache_janitor_bytes": "Bytes held by the cache after the last sweep",
        "epd_cache_janitor_sweeps_total": "Sweeps run",
        "epd_cache_janitor_sweeps_created": "Sweeps run",
        "epd_cache_janitor_sweep_errors_total": "Sweeps that failed",
        "epd_cache_janitor_sweep_errors_created": "Sweeps that failed",
        "epd_cache_janitor_deleted_entries_total": "Entries deleted",
        "epd_cache_janitor_deleted_entries_created": "Entries deleted",
        "epd_cache_janitor_deleted_bytes_total": "Bytes deleted",
        "epd_cache_janitor_deleted_bytes_created": "Bytes deleted",
        "epd_cache_janitor_over_limit_sweeps_total": (
            "Sweeps that ended above --max-size because the rest is younger than the TTL"
        ),
        "epd_cache_janitor_over_limit_sweeps_created": (
            "Sweeps that ended above --max-size because the rest is younger than the TTL"
        ),
    }


def test_recorded_sweeps_add_up_and_over_limit_ones_are_counted(tmp_path):
    metrics = janitor.Metrics()
    metrics.record(janitor.SweepResult(4, 400, 2, 200, over_limit=False, kept_fresh=0))
    metrics.record(janitor.SweepResult(3, 300, 1, 50, over_limit=True, kept_fresh=0))
    sample = metrics.registry.get_sample_value
    assert (sample("epd_cache_janitor_entries"), sample("epd_cache_janitor_bytes")) == (3, 300)
    assert sample("epd_cache_janitor_deleted_entries_total") == 3
    assert sample("epd_cache_janitor_deleted_bytes_total") == 250
    assert sample("epd_cache_janitor_over_limit_sweeps_total") == 1
    assert sample("epd_cache_janitor_sweeps_total") == 2


# ----------------------------------------------------------------------------- the loop, without a process


def test_a_stop_request_wakes_the_sleep_and_is_kept():
    stop = janitor.StopRequest()
    assert not stop.requested()
    assert stop.sleep(0.01) is False
    stop._handle()
    assert stop.requested()
    assert stop.sleep(3600) is True  # at once


def test_stop_requests_never_block_even_when_the_wake_pipe_is_full():
    stop = janitor.StopRequest()
    for _ in range(70_000):  # a pipe holds 64 KiB
        stop._handle()
    assert stop.requested()


def test_sigterm_and_sigint_are_the_stop_requests(monkeypatch):
    import signal

    installed: dict = {}
    monkeypatch.setattr(signal, "signal", lambda sig, handler: installed.setdefault(sig, handler))
    stop = janitor.StopRequest()
    stop.install()
    assert set(installed) == {signal.SIGTERM, signal.SIGINT}
    installed[signal.SIGTERM](signal.SIGTERM, None)
    assert stop.requested()


class LoopStub:
    """main()'s loop without signals and sleeps: records each wait and stops after `rounds` sweeps."""

    def __init__(self, rounds: int):
        self.rounds, self.installed = rounds, False
        self.waits: list[float] = []

    def install(self):
        self.installed = True

    def requested(self):
        return False

    def sleep(self, seconds):
        self.waits.append(seconds)
        return len(self.waits) >= self.rounds


@pytest.mark.parametrize(
    "flags, interval",
    [([], 60), (["--ttl-seconds", "30"], 15), (["--ttl-seconds", "1"], 1), (["--interval", "7"], 7)],
)
def test_the_loop_sweeps_every_interval_until_stopped(tmp_path, monkeypatch, caplog, flags, interval):
    stub = LoopStub(rounds=2)
    monkeypatch.setattr(janitor.sidecar, "StopRequest", lambda: stub)
    sweeps = []
    monkeypatch.setattr(janitor.sidecar, "run_once", lambda root, policy, metrics, stopping: sweeps.append(policy))
    argv = ["--path", str(tmp_path), "--ttl-seconds", "600", *flags]
    with caplog.at_level("INFO", logger="epd_operator.janitor"):
        janitor.main(argv)  # returns: stopped
    assert stub.installed and stub.waits == [interval, interval] and len(sweeps) == 2
    ttl = int(argv[argv.index("--ttl-seconds", 3) + 1]) if "--ttl-seconds" in flags else 600
    assert sweeps[0] == Policy(ttl, None)
    assert [r.message for r in caplog.records] == [
        f"watching {tmp_path}: ttl {ttl}s, max size unbounded, every {interval}s",
        "stopping",
    ]


def test_the_loop_names_its_size_bound_and_serves_metrics_on_the_port(tmp_path, monkeypatch, caplog):
    stub = LoopStub(rounds=1)
    monkeypatch.setattr(janitor.sidecar, "StopRequest", lambda: stub)
    served = []
    monkeypatch.setattr(janitor.Metrics, "serve", lambda self, port: served.append(port))
    argv = ["--path", str(tmp_path), "--ttl-seconds", "600", "--max-size", "2Mi", "--metrics-port", "9100"]
    with caplog.at_level("INFO", logger="epd_operator.janitor"):
        janitor.main(argv)
    assert served == [9100]
    assert caplog.records[0].message == f"watching {tmp_path}: ttl 600s, max size 2.0 MiB, every 60s"


def test_once_exits_1_when_the_sweep_failed(tmp_path, monkeypatch):
    monkeypatch.setattr(janitor.sidecar, "run_once", lambda *args, **kwargs: None)
    stub = LoopStub(rounds=1)
    monkeypatch.setattr(janitor.sidecar, "StopRequest", lambda: stub)
    with pytest.raises(SystemExit) as exit_:
        janitor.main(["--path", str(tmp_path), "--ttl-seconds", "60", "--once"])
    assert exit_.value.code == 1
    assert not stub.installed  # a single sweep keeps the default signal handling


@pytest.mark.parametrize(
    "argv, complaint",
    [
        (["--ttl-seconds", "soon"], "argument --ttl-seconds: 'soon' is not a whole number"),
        (["--ttl-seconds", "-5"], "argument --ttl-seconds: -5 must be at least 1"),
        (["--ttl-seconds", "60", "--interval", "0"], "argument --interval: 0 must be at least 1"),
        (["--ttl-seconds", "60", "--max-size=-1Gi"], "argument --max-size: '-1Gi' is not a Kubernetes quantity"),
    ],
)
def test_flag_refusals_say_what_is_wrong(tmp_path, capsys, argv, complaint):
    with pytest.raises(SystemExit) as exit_:
        janitor.main(["--path", str(tmp_path), *argv])
    assert exit_.value.code == 2
    assert complaint in capsys.readouterr().err


def test_the_smallest_values_are_accepted(tmp_path):
    args = janitor.build_parser().parse_args(["--path", str(tmp_path), "--ttl-seconds", "1", "--max-size", "0"])
    assert (args.ttl_seconds, args.max_size, args.interval, args.once, args.metrics_port) == (1, 0, None, False, None)


def test_each_flag_says_what_it_does_in_the_help():
    parser = janitor.build_parser()
    assert (parser.prog, parser.description) == (
        "epdctl janitor",
        "Bound a SharedStorage encoder cache: delete entries older than the TTL, or (with --max-size) the oldest "
        "entries older than the TTL while the cache is over the size.",
    )
    flags = {a.option_strings[-1]: (a.help, a.required) for a in parser._actions}
    assert flags == {
        "--help": ("show this help message and exit", False),
        "--path": ("the connector's shared_storage_path", True),
        "--ttl-seconds": ("minimum lifetime of an entry: none younger is ever deleted", True),
        "--max-size": ("size bound as a Kubernetes quantity (e.g. 50Gi)", False),
        "--interval": ("seconds between sweeps (default: half the TTL, at most 60)", False),
        "--once": ("sweep once and exit", False),
        "--metrics-port": ("serve Prometheus metrics on this port", False),
    }


def test_the_sidecar_logs_timestamped_lines_to_stderr(tmp_path, monkeypatch):
    import logging
    import sys

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # as in a fresh process: basicConfig configures
    monkeypatch.setattr(root, "level", logging.WARNING)
    with pytest.raises(SystemExit):
        janitor.main(["--path", str(tmp_path), "--ttl-seconds", "60", "--once"])
    (handler,) = root.handlers
    assert isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr
    assert handler.formatter is not None
    assert handler.formatter._fmt == "%(asctime)s %(levelname)s janitor: %(message)s"
    assert root.level == logging.INFO


def test_run_once_sweeps_at_the_time_and_with_the_stop_request_it_is_given(tmp_path):
    put(tmp_path, "young", 1)
    later = NOW + TTL * 10  # a sweep at that time finds the entry expired
    result = janitor.run_once(tmp_path, Policy(TTL), janitor.Metrics(), now=later, stopping=lambda: True)
    assert result is not None and result.deleted_entries == 0  # stopped before its first deletion
    result = janitor.run_once(tmp_path, Policy(TTL), janitor.Metrics(), now=later)
    assert result is not None and result.deleted_entries == 1


def test_a_zero_size_bound_is_named_in_the_warning(tmp_path, caplog):
    put(tmp_path, "young", 10, size=10)
    with caplog.at_level("WARNING", logger="epd_operator.janitor"):
        janitor.run_once(tmp_path, Policy(TTL, max_bytes=0), janitor.Metrics(), now=NOW)
    assert "above --max-size 0 B" in caplog.records[0].message


def test_sleep_waits_the_interval_unless_a_stop_was_requested():
    import time

    stop = janitor.StopRequest()
    started = time.monotonic()
    assert stop.sleep(0.2) is False
    assert time.monotonic() - started >= 0.15


def test_a_missing_path_is_logged_naming_it(tmp_path, caplog):
    missing = tmp_path / "not-mounted"
    with caplog.at_level("ERROR", logger="epd_operator.janitor"), pytest.raises(SystemExit):
        janitor.main(["--path", str(missing), "--ttl-seconds", "60", "--once"])
    assert caplog.messages == [f"--path {missing} is not a directory (is the shared volume mounted?)"]
