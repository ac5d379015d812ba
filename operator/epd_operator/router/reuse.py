"""Remembered encoder results, so a repeated media item is rewritten without an encoder call.

With the SharedStorage EC connector an encoded item stays on the shared volume until
the cache janitor deletes it (its TTL counts from when the file was written). The router
keeps what the encoder reported for the item for a TTL chosen safely below the janitor's,
counted from the encode and never extended by reuse, so an entry expires before its
file does. An entry whose file vanished earlier (the janitor's size bound) shows up as
a consumer failing the metadata-only request; the router then forgets it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

import orjson

from .protocol import EncodedItem, MediaItem


def reuse_key(body: dict, item: MediaItem) -> str:
    # The engine may derive the cache key from the uuid and the processing options, so an
    # item encoded with other options is a different entry.
    kwargs = body.get("mm_processor_kwargs")
    if kwargs:
        return f"{body.get('model')}|{item.uuid}|{orjson.dumps(kwargs, option=orjson.OPT_SORT_KEYS).decode()}"
    return f"{body.get('model')}|{item.uuid}"


class ReuseCache:
    def __init__(self, ttl_s: float, max_items: int = 100_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_items = max_items
        self.clock = clock
        self._entries: OrderedDict[str, tuple[float, str, dict]] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.ttl_s > 0

    def __len__(self) -> int:
        return len(self._entries)

    def remember(self, key: str, item: EncodedItem) -> None:
        if not self.enabled or not item.metadata:
            return
        self._entries[key] = (self.clock() + self.ttl_s, item.mm_hash, item.report)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_items:
            self._entries.popitem(last=False)

    def recall(self, key: str) -> EncodedItem | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires, mm_hash, report = entry
        if expires <= self.clock():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return EncodedItem(mm_hash, report)

    def forget(self, key: str) -> None:
        self._entries.pop(key, None)
