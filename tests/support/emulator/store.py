"""In-memory object storage with a global resourceVersion counter, watch fan-out and history."""
from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Callable
from typing import Any

Key = tuple[str, str]  # (group, plural): all versions of a resource share storage
ObjKey = tuple[str | None, str]  # (namespace, name)

HISTORY_LIMIT = 5000  # watch-resume window per resource; older resumes get 410 Gone, as upstream


@dataclasses.dataclass(frozen=True)
class Change:
    rv: int
    type: str  # ADDED | MODIFIED | DELETED
    obj: dict[str, Any]
    old: dict[str, Any] | None


@dataclasses.dataclass(eq=False)
class Watcher:
    key: Key
    queue: asyncio.Queue[Change | None] = dataclasses.field(default_factory=asyncio.Queue)


class Store:
    """Objects are stored as immutable snapshots: every write stores a new dict, so snapshots can
    be handed to watchers and serialised later without copying."""

    def __init__(self) -> None:
        self.rv = 0
        self.objects: dict[Key, dict[ObjKey, dict[str, Any]]] = collections.defaultdict(dict)
        self.history: dict[Key, collections.deque[Change]] = collections.defaultdict(
            lambda: collections.deque(maxlen=HISTORY_LIMIT))
        self.dropped_upto: dict[Key, int] = collections.defaultdict(int)
        self.watchers: dict[Key, set[Watcher]] = collections.defaultdict(set)
        self.by_uid: dict[str, tuple[Key, ObjKey]] = {}

    def next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def get(self, key: Key, namespace: str | None, name: str) -> dict[str, Any] | None:
        return self.objects[key].get((namespace, name))

    def put(self, key: Key, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        meta = obj['metadata']
        self.objects[key][(meta.get('namespace'), meta['name'])] = obj
        self.by_uid[meta['uid']] = (key, (meta.get('namespace'), meta['name']))
        self._publish(key, Change(int(meta['resourceVersion']), 'MODIFIED' if old else 'ADDED', obj, old))

    def remove(self, key: Key, obj: dict[str, Any]) -> None:
        meta = obj['metadata']
        self.objects[key].pop((meta.get('namespace'), meta['name']), None)
        self.by_uid.pop(meta['uid'], None)
        self._publish(key, Change(int(meta['resourceVersion']), 'DELETED', obj, obj))

    def drop_resource(self, key: Key) -> list[dict[str, Any]]:
        objs = list(self.objects.pop(key, {}).values())
        for obj in objs:
            self.by_uid.pop(obj['metadata']['uid'], None)
        return objs

    def _publish(self, key: Key, change: Change) -> None:
        history = self.history[key]
        if len(history) == history.maxlen:
            self.dropped_upto[key] = history[0].rv
        history.append(change)
        for watcher in self.watchers[key]:
            watcher.queue.put_nowait(change)

    def subscribe(self, key: Key) -> Watcher:
        watcher = Watcher(key)
        self.watchers[key].add(watcher)
        return watcher

    def unsubscribe(self, watcher: Watcher) -> None:
        self.watchers[watcher.key].discard(watcher)

    def close_all_watches(self) -> None:
        for watchers in self.watchers.values():
            for watcher in watchers:
                watcher.queue.put_nowait(None)

    def replay_since(self, key: Key, rv: int) -> list[Change] | None:
        """Changes after ``rv``; None when the history no longer reaches back that far."""
        history = self.history[key]
        if self.dropped_upto[key] > rv:
            return None
        return [change for change in history if change.rv > rv]

    def iter_all(self, predicate: Callable[[dict[str, Any]], bool] = lambda o: True) -> list[tuple[Key, dict[str, Any]]]:
        return [(key, obj) for key, objs in self.objects.items() for obj in objs.values() if predicate(obj)]
