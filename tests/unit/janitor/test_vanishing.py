"""The janitor when the volume changes under it or refuses it (janitor/entries.py, janitor/deletion.py): whatever
vanishes is skipped, any other error surfaces (run_once counts it), and directories inside an entry are measured
and deleted with it. Each race is made to happen at one chosen call."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from epd_operator import janitor
from epd_operator.janitor import CACHE_FILE, TRASH_MARK, Policy, sweep
from tests.support.janitor_cache import NOW, TTL, holding, names, put

GONE = OSError(errno.ENOENT, "No such file or directory")
STALE = OSError(errno.ESTALE, "Stale file handle")  # NFS: another client removed it first
DENIED = OSError(errno.EACCES, "Permission denied")


def failing(monkeypatch, name: str, path: Path | str, error: OSError, *, times: int = 1) -> None:
    """os.<name> raises `error` for `path` (its first argument), `times` times; other calls are real."""
    real = getattr(os, name)
    left = [times]

    def call(first, *args, **kwargs):
        if os.fspath(first) == os.fspath(path) and left[0]:
            left[0] -= 1
            raise error
        return real(first, *args, **kwargs)

    monkeypatch.setattr(os, name, call)


def stamp(path: Path, age: float) -> None:
    os.utime(path, (NOW - age, NOW - age))


# ----------------------------------------------------------------------------- measuring


def test_a_directory_inside_an_entry_counts_with_its_size_and_newest_mtime(tmp_path):
    entry = put(tmp_path, "nested", TTL * 2, size=10)
    (entry / "sub").mkdir()
    (entry / "sub" / "part").write_bytes(b"x" * 7)
    stamp(entry / "sub" / "part", 5)
    stamp(entry / "sub", TTL * 2)
    stamp(entry, TTL * 2)
    (scanned,) = janitor.scan(tmp_path)
    assert (scanned.size, scanned.newest_mtime, scanned.complete, scanned.empty) == (17, NOW - 5, True, False)


@pytest.mark.parametrize("error", [GONE, STALE])
def test_an_entry_that_vanishes_before_it_is_measured_is_skipped(tmp_path, monkeypatch, error):
    put(tmp_path, "kept", TTL * 2)
    gone = put(tmp_path, "gone", TTL * 2)
    failing(monkeypatch, "lstat", gone, error)
    assert [e.path.name for e in janitor.scan(tmp_path)] == ["kept"]


def test_an_entry_that_cannot_be_read_fails_the_scan(tmp_path, monkeypatch):
    entry = put(tmp_path, "locked", TTL * 2)
    failing(monkeypatch, "lstat", entry, DENIED)
    with pytest.raises(OSError, match="Permission denied"):
        janitor.scan(tmp_path)
    failing(monkeypatch, "scandir", entry, DENIED)
    with pytest.raises(OSError, match="Permission denied"):
        janitor.scan(tmp_path)


def test_an_entry_emptied_while_listed_is_measured_as_its_directory(tmp_path, monkeypatch):
    entry = put(tmp_path, "emptied", TTL * 2, size=50)
    failing(monkeypatch, "scandir", entry, GONE)
    (scanned,) = janitor.scan(tmp_path)
    assert (scanned.size, scanned.newest_mtime, scanned.complete, scanned.empty) == (0, NOW - TTL * 2, False, True)


class Vanishing:
    """A directory entry whose stat finds it gone (or refused)."""

    def __init__(self, real: os.DirEntry, error: OSError):
        self.real, self.error = real, error
        self.name, self.path = real.name, real.path

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        return self.real.is_dir(follow_symlinks=follow_symlinks)

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        raise self.error


class Listing(list):
    """What os.scandir returns, as a list: iterable, and a context manager."""

    def __enter__(self) -> Listing:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def test_a_file_that_vanishes_mid_walk_is_not_counted(tmp_path, monkeypatch):
    entry = put(tmp_path, "racing", TTL * 2, size=10)
    (entry / "other").write_bytes(b"y" * 3)
    stamp(entry / "other", TTL * 2)
    stamp(entry, TTL * 2)
    real = os.scandir

    def scandir(path):
        listed = Listing(real(path))
        if os.fspath(path) != os.fspath(entry):
            return listed
        return Listing(Vanishing(e, GONE) if e.name == CACHE_FILE else e for e in listed)

    monkeypatch.setattr(os, "scandir", scandir)
    (scanned,) = janitor.scan(tmp_path)
    assert (scanned.size, scanned.complete, scanned.empty) == (3, False, False)
    monkeypatch.setattr(
        os, "scandir", lambda path: Listing(Vanishing(e, DENIED) if e.name == "other" else e for e in real(path))
    )
    with pytest.raises(OSError, match="Permission denied"):
        janitor.scan(tmp_path)


# ----------------------------------------------------------------------------- deleting


def test_a_directory_inside_an_expired_entry_is_deleted_with_it(tmp_path):
    entry = put(tmp_path, "nested", TTL * 2, size=10)
    (entry / "sub" / "deeper").mkdir(parents=True)
    (entry / "sub" / "deeper" / "part").write_bytes(b"x" * 7)
    for path in (entry / "sub" / "deeper" / "part", entry / "sub" / "deeper", entry / "sub", entry):
        stamp(path, TTL * 2)
    result = sweep(tmp_path, Policy(TTL), now=NOW)
    assert list(entry.iterdir()) == []
    assert (result.deleted_entries, result.deleted_bytes) == (1, 17)


def test_a_directory_inside_an_entry_written_to_meanwhile_keeps_the_entry(tmp_path):
    entry = put(tmp_path, "nested", TTL * 2, size=10)
    (entry / "sub").mkdir()
    (entry / "sub" / "part").write_bytes(b"x" * 7)
    stamp(entry / "sub" / "part", TTL * 2)
    stamp(entry / "sub", TTL * 2)
    stamp(entry, TTL * 2)
    (scanned,) = janitor.scan(tmp_path)
    stamp(entry / "sub" / "part", 1)  # rewritten after the scan
    assert janitor.delete_entry(scanned, NOW - TTL) == (False, 10)
    assert names(entry) == {"sub"} and (entry / "sub" / "part").exists()


def test_a_file_another_writer_replaced_during_the_check_is_left_to_it(tmp_path, monkeypatch):
    entry = put(tmp_path, "replaced", TTL * 2, size=10)
    real_rename = os.rename

    def rename_then_vllm_writes_anew(src, dst):
        real_rename(src, dst)
        stamp(Path(dst), 0)  # the writer truncated the inode we moved ...
        (Path(src)).write_bytes(b"new")  # ... and another wrote a new file under the name

    monkeypatch.setattr(os, "rename", rename_then_vllm_writes_anew)
    result = sweep(tmp_path, Policy(TTL), now=NOW)
    assert (entry / CACHE_FILE).read_bytes() == b"new"
    (trash,) = [p for p in entry.iterdir() if TRASH_MARK in p.name]  # ours ages out later
    assert trash.name.startswith(CACHE_FILE + TRASH_MARK) and trash.stat().st_size == 10
    assert (result.deleted_entries, result.kept_fresh) == (0, 1)


def test_a_file_another_janitor_moved_on_is_left_to_it(tmp_path, monkeypatch):
    entry = put(tmp_path, "moved", TTL * 2, size=10)
    real_rename = os.rename

    def rename_then_touched(src, dst):
        real_rename(src, dst)
        stamp(Path(dst), 0)

    monkeypatch.setattr(os, "rename", rename_then_touched)
    monkeypatch.setattr(os, "link", lambda src, dst: (_ for _ in ()).throw(GONE))
    result = sweep(tmp_path, Policy(TTL), now=NOW)
    assert [p.name.startswith(CACHE_FILE + TRASH_MARK) for p in entry.iterdir()] == [True]
    assert result.kept_fresh == 1


def test_without_hard_links_a_touched_file_is_renamed_back_unless_the_name_was_taken(tmp_path, monkeypatch):
    entry = put(tmp_path, "nolinks", TTL * 2, size=10)
    real_rename = os.rename
    renames: list[tuple[str, str]] = []

    def rename_then_touched(src, dst):
        renames.append((src, dst))
        real_rename(src, dst)
        if len(renames) == 1:
            stamp(Path(dst), 0)

    monkeypatch.setattr(os, "rename", rename_then_touched)
    monkeypatch.setattr(os, "link", lambda src, dst: (_ for _ in ()).throw(OSError(errno.EPERM, "no links")))
    sweep(tmp_path, Policy(TTL), now=NOW)
    assert names(entry) == {CACHE_FILE} and (entry / CACHE_FILE).stat().st_size == 10
    assert renames[1] == (renames[0][1], renames[0][0])

    other = put(tmp_path, "taken", TTL * 2, size=10)
    renames.clear()

    def rename_then_replaced(src, dst):
        renames.append((src, dst))
        real_rename(src, dst)
        stamp(Path(dst), 0)
        Path(src).write_bytes(b"new")

    monkeypatch.setattr(os, "rename", rename_then_replaced)
    sweep(tmp_path, Policy(TTL), now=NOW)
    assert len(renames) == 1 and (other / CACHE_FILE).read_bytes() == b"new"
    assert len(list(other.iterdir())) == 2  # the new file, and ours as trash


@pytest.mark.parametrize("error", [GONE, STALE])
def test_a_file_gone_before_its_deletion_frees_nothing_and_is_no_failure(tmp_path, monkeypatch, error):
    entry = put(tmp_path, "gone", TTL * 2, size=10)
    (scanned,) = janitor.scan(tmp_path)
    failing(monkeypatch, "lstat", entry / CACHE_FILE, error)
    assert janitor.delete_entry(scanned, NOW - TTL) == (True, 0)


def test_a_file_that_cannot_be_deleted_fails_the_sweep_and_run_once_counts_it(tmp_path, monkeypatch):
    entry = put(tmp_path, "locked", TTL * 2, size=10)
    failing(monkeypatch, "lstat", entry / CACHE_FILE, DENIED, times=2)  # scan, then delete
    metrics = janitor.Metrics()
    assert janitor.run_once(tmp_path, Policy(TTL), metrics, now=NOW) is None
    assert metrics.registry.get_sample_value("epd_cache_janitor_sweep_errors_total") == 1


def test_an_entry_gone_before_its_contents_are_listed_counts_as_deleted(tmp_path, monkeypatch):
    entry = put(tmp_path, "gone", TTL * 2, size=10)
    (scanned,) = janitor.scan(tmp_path)
    failing(monkeypatch, "scandir", entry, GONE)
    assert janitor.delete_entry(scanned, NOW - TTL) == (True, 0)
    failing(monkeypatch, "scandir", entry, DENIED)
    with pytest.raises(OSError, match="Permission denied"):
        janitor.delete_entry(scanned, NOW - TTL)


def test_an_empty_entry_gone_or_refused_at_rmdir(tmp_path, monkeypatch):
    entry = put(tmp_path, "miss", TTL * 2, file=False)
    (scanned,) = janitor.scan(tmp_path)
    failing(monkeypatch, "rmdir", entry, GONE)
    assert janitor.delete_entry(scanned, NOW - TTL) == (True, 0)
    failing(monkeypatch, "rmdir", entry, OSError(errno.EEXIST, "File exists"))  # POSIX's other "not empty"
    assert janitor.delete_entry(scanned, NOW - TTL) == (False, 0)
    failing(monkeypatch, "rmdir", entry, DENIED)
    with pytest.raises(OSError, match="Permission denied"):
        janitor.delete_entry(scanned, NOW - TTL)
    assert holding(tmp_path) == set() and names(tmp_path) == {"miss"}
