"""The collectors behind the router's multiprocess /metrics, and two backend helpers, pinned exactly:

- ProcessGroupCollector: `process_*` of every recorded process combined into one unlabelled sample each
  (CPU seconds, memory and open descriptors summed, start time the earliest, descriptor limit the largest).
  The processes are a fake procfs tree, so every value is known in advance.
- multiprocess_registry: reads the worker files and the pids file of the directory it is given (one pid a
  line; its own pid when that file is missing or unreadable), whatever PROMETHEUS_MULTIPROC_DIR says.
- MultiProcessView: reads the directory it is given, also without PROMETHEUS_MULTIPROC_DIR.
- scraped_queue_depth: running + waiting summed over every label set; None without either series.
- HealthChecker.run: a failed round is logged and the next round still comes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import resource
import typing
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Counter, values
from prometheus_client.process_collector import ProcessCollector

from epd_operator import __version__
from epd_operator.router import metrics
from epd_operator.router.backends import HealthChecker, scraped_queue_depth
from epd_operator.router.metrics import PIDS_FILE, MultiProcessView, ProcessGroupCollector, multiprocess_registry

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = resource.getpagesize()
BOOT = 1_700_000_000  # `btime` of the fake procfs: start times count from it


class Proc(typing.NamedTuple):
    """What a fake process reports, in whole seconds, bytes and pages."""

    user: int
    system: int
    started: int  # seconds after boot
    vsize: int
    rss_pages: int
    max_fds: int
    open_fds: int


# The earliest start and the largest limit sit in different processes, neither first nor last.
A = Proc(user=1, system=2, started=300, vsize=1000, rss_pages=10, max_fds=2048, open_fds=3)
B = Proc(user=4, system=8, started=100, vsize=2000, rss_pages=20, max_fds=1024, open_fds=5)
C = Proc(user=16, system=32, started=200, vsize=4000, rss_pages=40, max_fds=4096, open_fds=7)
C_FIRST = Proc(user=5, system=6, started=50, vsize=8000, rss_pages=80, max_fds=512, open_fds=2)


def combined(*procs: Proc) -> dict[tuple[str, str], list[tuple[str, dict[str, str], float]]]:
    """What ProcessGroupCollector must report for `procs`: per family (name, type), its samples."""
    return {
        ("process_virtual_memory_bytes", "gauge"): [
            ("process_virtual_memory_bytes", {}, float(sum(p.vsize for p in procs)))
        ],
        ("process_resident_memory_bytes", "gauge"): [
            ("process_resident_memory_bytes", {}, float(sum(p.rss_pages for p in procs) * PAGE))
        ],
        ("process_start_time_seconds", "gauge"): [
            ("process_start_time_seconds", {}, float(BOOT + min(p.started for p in procs)))
        ],
        ("process_cpu_seconds", "counter"): [
            ("process_cpu_seconds_total", {}, float(sum(p.user + p.system for p in procs)))
        ],
        ("process_open_fds", "gauge"): [("process_open_fds", {}, float(sum(p.open_fds for p in procs)))],
        ("process_max_fds", "gauge"): [("process_max_fds", {}, float(max(p.max_fds for p in procs)))],
    }


def reported(collector: ProcessGroupCollector) -> dict[tuple[str, str], list[tuple[str, dict[str, str], float]]]:
    return {(m.name, m.type): [(s.name, s.labels, s.value) for s in m.samples] for m in collector.collect()}


FakeProc = Callable[[int, Proc], None]


@pytest.fixture
def fake_proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeProc:
    """The router's ProcessCollector reads a procfs tree under tmp_path; `fake_proc(pid, proc)` adds a process."""
    root = tmp_path / "proc"
    root.mkdir()
    (root / "stat").write_text(f"cpu  1 2 3 4\nbtime {BOOT}\n")
    monkeypatch.setattr(metrics, "ProcessCollector", functools.partial(ProcessCollector, proc=str(root)))

    def add(pid: int, p: Proc) -> None:
        d = root / str(pid)
        (d / "fd").mkdir(parents=True)
        # /proc/<pid>/stat: fields after the command name, from the state (field 3) on
        fields = ["S"] + ["0"] * 21
        fields[11] = str(p.user * TICKS)
        fields[12] = str(p.system * TICKS)
        fields[19] = str(p.started * TICKS)
        fields[20] = str(p.vsize)
        fields[21] = str(p.rss_pages)
        (d / "stat").write_text(f"{pid} (epd-router) {' '.join(fields)}\n")
        (d / "limits").write_text(
            "Limit                     Soft Limit           Hard Limit           Units     \n"
            f"Max open files            {p.max_fds}                 {p.max_fds * 2}                 files     \n"
        )
        for fd in range(p.open_fds):
            (d / "fd" / str(fd)).touch()

    return add


def test_process_metrics_add_up_over_the_processes_with_the_earliest_start_and_the_largest_limit(fake_proc):
    for pid, p in ((101, A), (102, B), (103, C)):
        fake_proc(pid, p)
    assert reported(ProcessGroupCollector(lambda: [101, 102, 103])) == combined(A, B, C)


def test_process_metrics_of_one_process_are_its_own(fake_proc):
    fake_proc(101, A)
    assert reported(ProcessGroupCollector(lambda: [101])) == combined(A)


def test_a_recorded_process_that_is_gone_adds_nothing(fake_proc):
    fake_proc(101, A)
    fake_proc(103, C)
    assert reported(ProcessGroupCollector(lambda: [101, 999, 103])) == combined(A, C)


def test_the_pids_are_read_at_each_collection(fake_proc):
    fake_proc(101, A)
    fake_proc(102, B)
    pids = [101]
    collector = ProcessGroupCollector(lambda: list(pids))
    assert reported(collector) == combined(A)
    pids.append(102)
    assert reported(collector) == combined(A, B)


@pytest.fixture
def no_multiprocess_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reading side gets its directory as an argument: nothing in the environment points at it."""
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.delenv("prometheus_multiproc_dir", raising=False)


@pytest.fixture
def metrics_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A multiprocess directory in which workers 201 and 202 counted 2 and 3 `epd_test_writes`."""
    path = tmp_path / "metrics"
    path.mkdir()
    classes = []
    with monkeypatch.context() as m:
        m.setenv("PROMETHEUS_MULTIPROC_DIR", str(path))
        for pid, n in ((201, 2), (202, 3)):
            cls = values.MultiProcessValue(functools.partial(int, pid))
            classes.append(cls)
            m.setattr(values, "ValueClass", cls)
            Counter("epd_test_writes", "Writes", registry=CollectorRegistry()).inc(n)
    yield path
    for cls in classes:
        cls.close_all_files()


@pytest.mark.usefixtures("no_multiprocess_env")
def test_the_multiprocess_registry_reads_its_directory_and_the_pids_recorded_there(metrics_dir, fake_proc):
    fake_proc(101, A)
    fake_proc(102, B)
    fake_proc(os.getpid(), C)
    (metrics_dir / PIDS_FILE).write_text("101\n102\n")
    reg = multiprocess_registry(str(metrics_dir))
    assert reg.get_sample_value("epd_test_writes_total") == 5
    assert reg.get_sample_value("epd_router_build_info", {"version": __version__}) == 1
    assert reg.get_sample_value("process_open_fds") == A.open_fds + B.open_fds
    assert reg.get_sample_value("process_start_time_seconds") == BOOT + B.started
    assert reg.get_sample_value("process_max_fds") == A.max_fds


@pytest.mark.usefixtures("no_multiprocess_env")
@pytest.mark.parametrize(
    "pids_file",
    [None, "directory", "101\nrouter\n"],
    ids=["missing", "unreadable", "not-a-pid"],
)
def test_without_a_readable_pids_file_the_process_metrics_are_the_readers_own(
    tmp_path, fake_proc, pids_file: str | None
):
    fake_proc(101, A)
    fake_proc(os.getpid(), C_FIRST)
    path = tmp_path / "metrics"
    path.mkdir()
    if pids_file == "directory":
        (path / PIDS_FILE).mkdir()
    elif pids_file is not None:
        (path / PIDS_FILE).write_text(pids_file)
    reg = multiprocess_registry(str(path))
    assert reg.get_sample_value("process_open_fds") == C_FIRST.open_fds
    assert reg.get_sample_value("process_virtual_memory_bytes") == C_FIRST.vsize


@pytest.mark.parametrize("env", ["unset", "elsewhere"])
def test_the_view_reads_the_directory_it_is_given(metrics_dir, tmp_path, monkeypatch, env: str):
    monkeypatch.delenv("prometheus_multiproc_dir", raising=False)
    if env == "unset":
        monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    else:  # an empty directory: the view must not read it
        (tmp_path / "other").mkdir()
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "other"))
    view = MultiProcessView(str(metrics_dir))
    assert [(m.name, [(s.name, s.labels, s.value) for s in m.samples]) for m in view.collect()] == [
        ("epd_test_writes", [("epd_test_writes_total", {}, 5.0)])
    ]


def test_the_queue_depth_is_running_plus_waiting_over_every_engine():
    text = (
        b"# TYPE vllm:num_requests_running gauge\n"
        b'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        b'vllm:num_requests_waiting{engine="1",model_name="m"} 3.0\n'
        b"vllm:num_requests_swapped 7.0\n"
    )
    assert scraped_queue_depth(text) == 5


def test_an_idle_backend_has_queue_depth_zero_and_one_without_the_series_none():
    assert scraped_queue_depth(b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n") == 0
    assert scraped_queue_depth(b"# HELP up 1\nvllm:gpu_cache_usage_perc 0.5\n") is None
    assert scraped_queue_depth(b"") is None


async def test_a_failed_health_round_is_logged_and_the_next_round_comes(caplog):
    caplog.set_level(logging.ERROR, logger="epd_router.backends")
    # No round reaches a backend: the session is never used.
    checker = HealthChecker([], typing.cast("aiohttp.ClientSession", None), interval=0.001, timeout=1.0)
    rounds = 0

    async def check_all() -> None:
        nonlocal rounds
        rounds += 1
        if rounds == 1:
            raise RuntimeError("probe bug")
        raise asyncio.CancelledError  # ends run() after the second round

    checker.check_all = check_all  # type: ignore[method-assign]
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(checker.run(), timeout=5)
    assert rounds == 2
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("epd_router.backends", logging.ERROR, "health check round failed")
    ]
    exc_info = caplog.records[0].exc_info
    assert exc_info is not None and isinstance(exc_info[1], RuntimeError)
