"""The shared-storage cache janitor: TTL as a guaranteed minimum lifetime, the size bound, and safety
against vLLM writing and other janitors deleting while a sweep runs. Time is controlled with os.utime."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epd_operator import janitor
from epd_operator.janitor import CACHE_FILE, TRASH_MARK, Entry, Policy, plan, sweep
from tests.support.prom import sample_values

NOW = float(int(time.time()))  # near real time: the janitor's own deletions stamp directories with it
TTL = 600


def put(root: Path, mm_hash: str, age: float, size: int = 100, *, file: bool = True) -> Path:
    """A cache entry as vLLM leaves it, last written `age` seconds before NOW."""
    entry = root / mm_hash
    entry.mkdir()
    if file:
        data = entry / CACHE_FILE
        data.write_bytes(b"x" * size)
        os.utime(data, (NOW - age, NOW - age))
    os.utime(entry, (NOW - age, NOW - age))
    return entry


def names(root: Path) -> set[str]:
    return {p.name for p in root.iterdir()}


def holding(root: Path) -> set[str]:
    """Entries that still hold something (a deleted entry's directory stays, empty, for a TTL)."""
    return {p.name for p in root.iterdir() if p.is_dir() and any(p.iterdir())}


# ----------------------------------------------------------------------------- TTL only


def test_without_max_size_entries_older_than_the_ttl_go_and_younger_stay(tmp_path):
    put(tmp_path, "old", TTL + 1)
    put(tmp_path, "young", TTL - 1)
    put(tmp_path, "at-ttl", TTL)
    result = sweep(tmp_path, Policy(TTL), now=NOW)
    assert holding(tmp_path) == {"young", "at-ttl"}
    assert (result.entries, result.deleted_entries, result.deleted_bytes, result.bytes) == (2, 1, 100, 200)


def test_an_entry_goes_in_two_steps_its_files_then_its_directory_a_ttl_later(tmp_path):
    put(tmp_path, "old", TTL + 1)
    sweep(tmp_path, Policy(TTL), now=NOW)
    assert names(tmp_path) == {"old"} and holding(tmp_path) == set()  # vLLM may have just makedirs'd it
    sweep(tmp_path, Policy(TTL), now=NOW + TTL / 2)
    assert names(tmp_path) == {"old"}
    result = sweep(tmp_path, Policy(TTL), now=time.time() + TTL + 1)
    assert names(tmp_path) == set()
    assert (result.entries, result.deleted_entries, result.deleted_bytes) == (0, 1, 0)


def test_age_is_the_newest_mtime_in_the_entry(tmp_path):
    entry = put(tmp_path, "rewritten", TTL * 3)
    os.utime(entry / CACHE_FILE, (NOW - 5, NOW - 5))  # the encoder wrote the item again
    sweep(tmp_path, Policy(TTL), now=NOW)
    assert names(tmp_path) == {"rewritten"}


def test_empty_directories_from_consumer_misses_go_once_older_than_the_ttl(tmp_path):
    put(tmp_path, "miss-old", TTL + 1, file=False)
    put(tmp_path, "miss-young", 10, file=False)
    result = sweep(tmp_path, Policy(TTL, max_bytes=10**9), now=NOW)
    assert names(tmp_path) == {"miss-young"}
    assert result.deleted_entries == 1


def test_partial_entries_go_even_while_within_the_size_bound(tmp_path):
    entry = put(tmp_path, "crashed", TTL + 1, file=False)
    (entry / f"{CACHE_FILE}{TRASH_MARK}abc").write_bytes(b"x" * 10)  # an interrupted janitor's leftover
    os.utime(entry / f"{CACHE_FILE}{TRASH_MARK}abc", (NOW - TTL - 1,) * 2)
    os.utime(entry, (NOW - TTL - 1,) * 2)
    put(tmp_path, "complete", TTL * 10)
    sweep(tmp_path, Policy(TTL, max_bytes=10**9), now=NOW)
    assert holding(tmp_path) == {"complete"}


def test_hidden_names_lost_and_found_and_stray_files_are_not_entries(tmp_path):
    for name in (".snapshot", "lost+found"):
        put(tmp_path, name, TTL * 10)
    (tmp_path / "README").write_text("not a cache entry")
    os.utime(tmp_path / "README", (NOW - TTL * 10,) * 2)
    result = sweep(tmp_path, Policy(TTL), now=NOW)
    assert names(tmp_path) == {".snapshot", "lost+found", "README"}
    assert result.entries == 0


# ----------------------------------------------------------------------------- size bound


def test_with_max_size_old_entries_stay_while_the_store_fits(tmp_path):
    put(tmp_path, "a", TTL * 5)
    put(tmp_path, "b", TTL * 4)
    result = sweep(tmp_path, Policy(TTL, max_bytes=200), now=NOW)
    assert names(tmp_path) == {"a", "b"}
    assert not result.over_limit


def test_over_the_bound_the_oldest_expired_entries_go_first_until_it_fits(tmp_path):
    for name, age in (("oldest", TTL * 4), ("older", TTL * 3), ("old", TTL * 2), ("young", 1)):
        put(tmp_path, name, age)
    result = sweep(tmp_path, Policy(TTL, max_bytes=250), now=NOW)
    assert holding(tmp_path) == {"old", "young"}
    assert (result.bytes, result.deleted_entries, result.over_limit) == (200, 2, False)


def test_over_the_bound_with_only_young_entries_nothing_goes_and_it_says_so(tmp_path, caplog):
    put(tmp_path, "young-1", 10)
    put(tmp_path, "young-2", 20)
    put(tmp_path, "old", TTL + 1)
    metrics = janitor.Metrics()
    with caplog.at_level("INFO", logger="epd_operator.janitor"):
        result = janitor.run_once(tmp_path, Policy(TTL, max_bytes=50), metrics, now=NOW)
    assert holding(tmp_path) == {"young-1", "young-2"}
    assert result is not None and result.over_limit
    assert metrics.registry.get_sample_value("epd_cache_janitor_over_limit_sweeps_total") == 1
    assert any(r.levelname == "WARNING" and "younger than the TTL" in r.message for r in caplog.records)


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


def test_metrics_are_served_over_http():
    metrics = janitor.Metrics()
    metrics.sweeps.inc()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = metrics.serve(port, addr="127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            assert sample_values(response.read(), "epd_cache_janitor_sweeps_total") == [1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_stop_request_ends_a_sweep_between_deletions(tmp_path):
    for i in range(5):
        put(tmp_path, f"old-{i}", TTL + 1 + i)
    asked = iter([False, False, True])
    result = sweep(tmp_path, Policy(TTL), now=NOW, stopping=lambda: next(asked))
    assert result.deleted_entries == 2
    assert len(holding(tmp_path)) == 3


# ----------------------------------------------------------------------------- plan properties

ages = st.floats(min_value=0, max_value=TTL * 4, allow_nan=False)
entries = st.lists(st.tuples(ages, st.integers(0, 1000), st.booleans()), max_size=30)
# whole seconds on disk, so mtime rounding cannot move an entry across the TTL
disk_entries = st.lists(st.tuples(st.integers(0, TTL * 4), st.integers(0, 1000), st.booleans()), max_size=20)


@settings(max_examples=300, deadline=None)
@given(entries=entries, ttl=st.integers(1, TTL * 2), max_bytes=st.one_of(st.none(), st.integers(0, 20_000)))
def test_plan_never_deletes_an_entry_younger_than_the_ttl_and_meets_the_bound_when_it_can(entries, ttl, max_bytes):
    store = [
        Entry(Path(f"/c/{i}"), NOW - age, size, complete, empty=not complete and not size)
        for i, (age, size, complete) in enumerate(entries)
    ]
    policy = Policy(ttl, max_bytes)
    decided = plan(store, policy, NOW)
    victims = {e.path for e in decided.victims}
    assert all(e.age(NOW) > ttl for e in decided.victims)
    kept = [e for e in store if e.path not in victims]
    young_bytes = sum(e.size for e in store if e.age(NOW) <= ttl)
    if max_bytes is None:
        assert all(e.age(NOW) <= ttl for e in kept)
    else:
        kept_bytes = sum(e.size for e in kept)
        if young_bytes <= max_bytes:
            assert kept_bytes <= max_bytes and not decided.over_limit
        else:
            assert decided.over_limit
        # oldest first, and no further than needed: without the last one deleted the store would not fit
        complete_victims = [e for e in decided.victims if e.complete]
        if complete_victims:
            last = complete_victims[-1]
            assert kept_bytes + last.size > max_bytes
            assert all(e.newest_mtime >= last.newest_mtime for e in kept if e.complete and e.age(NOW) > ttl)


@settings(max_examples=60, deadline=None)
@given(entries=disk_entries, max_bytes=st.one_of(st.none(), st.integers(0, 10_000)))
def test_sweeping_a_real_directory_keeps_every_young_entry_and_the_bound_when_it_can(entries, max_bytes):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i, (age, size, complete) in enumerate(entries):
            put(root, f"h{i}", age, size, file=complete)
        young = {f"h{i}" for i, (age, _, _) in enumerate(entries) if age <= TTL}
        young_bytes = sum(size for age, size, complete in entries if age <= TTL and complete)
        result = sweep(root, Policy(TTL, max_bytes), now=NOW)
        assert young <= names(root)
        assert result.bytes == sum(f.stat().st_size for f in root.glob(f"*/{CACHE_FILE}"))
        if max_bytes is None:
            assert holding(root) <= young
        elif young_bytes <= max_bytes:
            assert result.bytes <= max_bytes and not result.over_limit


# ----------------------------------------------------------------------------- concurrency


def test_an_entry_written_after_the_scan_survives(tmp_path):
    entry = put(tmp_path, "reused", TTL * 2)
    victims = janitor.scan(tmp_path)
    os.utime(entry / CACHE_FILE, (NOW, NOW))  # vLLM rewrites the item between scan and delete
    deleted, _ = janitor.delete_entry(victims[0], cutoff=NOW - TTL)
    assert not deleted
    assert (entry / CACHE_FILE).exists()


def test_a_file_truncated_by_a_writer_just_before_the_rename_is_put_back(tmp_path, monkeypatch):
    entry = put(tmp_path, "racing", TTL * 2, size=64)
    real_rename = os.rename

    def rename_while_vllm_opens_it(src, dst):
        real_rename(src, dst)
        os.utime(dst, (NOW, NOW))  # the writer's O_TRUNC landed on the inode we just moved

    monkeypatch.setattr(os, "rename", rename_while_vllm_opens_it)
    result = sweep(tmp_path, Policy(TTL), now=NOW)
    assert sorted(p.name for p in entry.iterdir()) == [CACHE_FILE]
    assert (result.deleted_entries, result.kept_fresh) == (0, 1)


def test_a_file_added_after_listing_keeps_the_directory(tmp_path, monkeypatch):
    entry = put(tmp_path, "miss-then-write", TTL * 2, file=False)
    real_rmdir = os.rmdir

    def rmdir_after_vllm_wrote(path):
        (Path(path) / CACHE_FILE).write_bytes(b"fresh")
        real_rmdir(path)

    monkeypatch.setattr(os, "rmdir", rmdir_after_vllm_wrote)
    result = sweep(tmp_path, Policy(TTL), now=NOW)
    assert (entry / CACHE_FILE).read_bytes() == b"fresh"
    assert result.deleted_entries == 0


def test_another_janitor_deleting_first_is_tolerated(tmp_path):
    for i in range(20):
        put(tmp_path, f"old-{i}", TTL + 1 + i)
    put(tmp_path, "young", 1)
    policy = Policy(TTL)
    stale_view = janitor.scan(tmp_path)  # janitor B scanned, then janitor A swept everything
    sweep(tmp_path, policy, now=NOW)
    outcomes = [janitor.delete_entry(e, NOW - TTL) for e in plan(stale_view, policy, NOW).victims]
    assert outcomes == [(True, 0)] * 20
    assert holding(tmp_path) == {"young"}


def test_concurrent_janitors_on_one_volume(tmp_path):
    for i in range(200):
        put(tmp_path, f"old-{i:03}", TTL + 1 + i, size=10)
    for i in range(20):
        put(tmp_path, f"young-{i:02}", i, size=10)
    failures: list[BaseException] = []

    def janitor_pod():
        try:
            sweep(tmp_path, Policy(TTL), now=NOW)
        except BaseException as exc:  # pragma: no cover - the assertion below reports it
            failures.append(exc)

    pods = [threading.Thread(target=janitor_pod) for _ in range(4)]
    for pod in pods:
        pod.start()
    for pod in pods:
        pod.join()
    assert failures == []
    assert holding(tmp_path) == {f"young-{i:02}" for i in range(20)}


# ----------------------------------------------------------------------------- command line


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


def test_sigterm_ends_the_sidecar_cleanly(tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "epd_operator.janitor",
            "--path",
            str(tmp_path),
            "--ttl-seconds",
            "600",
            "--interval",
            "3600",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "watching" in proc.stderr.readline()
        assert "sweep:" in proc.stderr.readline()  # the first sweep ran; now it waits an hour
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert "stopping" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
