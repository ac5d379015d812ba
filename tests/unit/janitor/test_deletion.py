"""The cache janitor's deletions (janitor/deletion.py): safe against vLLM writing and other janitors deleting
while a sweep runs. Time is controlled with os.utime."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from epd_operator import janitor
from epd_operator.janitor import CACHE_FILE, Policy, plan, sweep
from tests.support.janitor_cache import NOW, TTL, holding, names, put

# whole seconds on disk, so mtime rounding cannot move an entry across the TTL
disk_entries = st.lists(st.tuples(st.integers(0, TTL * 4), st.integers(0, 1000), st.booleans()), max_size=20)


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
