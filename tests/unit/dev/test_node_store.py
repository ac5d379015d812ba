"""The real node's image store (dev/node/store.py): slots taken by flock, one holder each, and a
clear that refuses while any is taken. Locks only: no process, no containerd."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dev.node.store import StoreInUse, clear, describe, holder, in_use, take


def test_each_node_takes_the_first_free_slot_and_none_when_all_are_taken(tmp_path: Path):
    store = tmp_path / "store"
    first = take(store, slots=2, owner="cluster one")
    second = take(store, slots=2, owner="cluster two")
    assert first is not None and second is not None
    assert (first.index, second.index) == (0, 1)
    assert first.root == store / "slot-0" and first.root.is_dir()
    assert second.root == store / "slot-1" and second.root != first.root
    assert take(store, slots=2) is None  # the caller falls back to a root of its own
    assert holder(first.lock) == "cluster one"
    assert in_use(first.lock) and in_use(second.lock)
    first.release()
    assert not in_use(first.lock)
    again = take(store, slots=2, owner="cluster three")
    assert again is not None and again.index == 0 and holder(again.lock) == "cluster three"
    again.release()
    second.release()


def test_a_slot_lock_opened_twice_in_one_process_is_still_exclusive(tmp_path: Path):
    # flock belongs to the open file description: the same process opening the file again is refused too.
    slot = take(tmp_path, slots=1)
    assert slot is not None
    assert take(tmp_path, slots=1) is None
    slot.release()


def test_the_lock_descriptor_is_not_inherited_by_programs_a_node_starts(tmp_path: Path):
    slot = take(tmp_path, slots=1)
    assert slot is not None
    assert not os.get_inheritable(slot.fd)
    slot.release()


def test_clearing_refuses_while_a_slot_is_taken_and_removes_nothing(tmp_path: Path):
    store = tmp_path / "store"
    first = take(store, slots=2, owner="pid 42, node cpu-node-1")
    second = take(store, slots=2)
    assert first is not None and second is not None
    image = first.root / "io.containerd.content.v1.content" / "blob"
    image.parent.mkdir(parents=True)
    image.write_text("an image")
    second.release()
    with pytest.raises(StoreInUse, match=r"slot-0 \(pid 42, node cpu-node-1\).*make cluster-down"):
        clear(store)
    assert image.exists() and (store / "slot-1").is_dir()
    assert any("in use by pid 42" in line for line in describe(store))
    first.release()


def test_clearing_a_free_store_removes_every_slots_root_and_keeps_the_locks(tmp_path: Path):
    store = tmp_path / "store"
    slots = [take(store, slots=3) for _ in range(3)]
    for slot in slots:
        assert slot is not None
        (slot.root / "meta.db").write_text("x")
        slot.release()
    removed = clear(store)
    assert sorted(removed) == [store / f"slot-{i}" for i in range(3)]
    assert sorted(p.name for p in store.iterdir()) == ["slot-0.lock", "slot-1.lock", "slot-2.lock"]
    assert clear(store) == []
    assert clear(tmp_path / "never-made") == []
    assert all(line.endswith("empty, free") for line in describe(store))
