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


def _sorted_json(value: object) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def encoding_options(body: dict, item: MediaItem) -> str:
    """The request's options that change how this item is encoded ('' when none), as vLLM
    hashes them into the item's cache key: `mm_processor_kwargs` (e.g. a video's fps) and the
    item's own modality's `media_io_kwargs` (e.g. `{"video": {"num_frames": 8}}`; the other
    modalities' entries do not change it)."""
    options = []
    kwargs = body.get("mm_processor_kwargs")
    if kwargs:
        options.append(_sorted_json(kwargs))
    io = body.get("media_io_kwargs")
    if isinstance(io, dict):
        io = io.get(item.modality)
    if io:  # a malformed (non-dict) value is keyed whole: never reused for another one
        options.append("io=" + _sorted_json(io))
    return "|".join(options)


def reuse_key(body: dict, item: MediaItem) -> str:
    # The engine derives the cache key from the uuid and the encoding options, so an item
    # encoded with other options is a different entry.
    options = encoding_options(body, item)
    return f"{body.get('model')}|{item.uuid}|{options}" if options else f"{body.get('model')}|{item.uuid}"


def encoder_key(body: dict, item: MediaItem) -> str:
    """What cache-aware encoder picking hashes: the item and its encoding options, so a repeat
    goes back to the encoder that encoded it with those options."""
    options = encoding_options(body, item)
    return f"{item.uuid}|{options}" if options else item.uuid


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
