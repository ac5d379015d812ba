"""The cache janitor's policy (janitor/entries.py): TTL as a guaranteed minimum lifetime and the size bound,
on real directories. Time is controlled with os.utime."""

from __future__ import annotations

import os
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from epd_operator import janitor
from epd_operator.janitor import CACHE_FILE, TRASH_MARK, Entry, Policy, plan, sweep
from tests.support.janitor_cache import NOW, TTL, entries, holding, names, put


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
