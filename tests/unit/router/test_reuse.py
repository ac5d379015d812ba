"""The reuse cache: keys, TTL counted from the encode, LRU bound, forgetting. Expected values by hand."""

from epd_operator.router.protocol import EncodedItem, MediaItem
from epd_operator.router.reuse import ReuseCache, encoder_key, encoding_options, reuse_key


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def item(uuid: str = "u1") -> MediaItem:
    return MediaItem(0, "image_url", {"type": "image_url", "image_url": {"url": "data:,x"}}, uuid)


def encoded(mm_hash: str = "h1", metadata: dict | None = None) -> EncodedItem:
    return EncodedItem(mm_hash, {"metadata": {"image_grid_thw": [1, 2, 2]} if metadata is None else metadata})


def recalled(cache: ReuseCache, key: str) -> EncodedItem:
    got = cache.recall(key)
    assert got is not None, f"{key} is not remembered"
    return got


def test_key_is_model_and_uuid_without_processor_options():
    assert reuse_key({"model": "m"}, item("abc")) == "m|abc"
    assert reuse_key({"model": "m", "mm_processor_kwargs": {}}, item("abc")) == "m|abc"
    assert reuse_key({}, item("abc")) == "None|abc"


def test_processor_options_are_part_of_the_key_in_a_stable_order():
    body = {"model": "m", "mm_processor_kwargs": {"max_pixels": 4, "min_pixels": 1}}
    assert reuse_key(body, item("abc")) == 'm|abc|{"max_pixels":4,"min_pixels":1}'
    reordered = {"model": "m", "mm_processor_kwargs": {"min_pixels": 1, "max_pixels": 4}}
    assert reuse_key(reordered, item("abc")) == reuse_key(body, item("abc"))
    other = {"model": "m", "mm_processor_kwargs": {"max_pixels": 8, "min_pixels": 1}}
    assert reuse_key(other, item("abc")) != reuse_key(body, item("abc"))


def test_recall_returns_what_was_remembered_until_the_ttl_from_the_encode():
    clock = Clock(100.0)
    cache = ReuseCache(ttl_s=10.0, clock=clock)
    report = {"metadata": {"image_grid_thw": [1, 2, 2]}, "item_indices": [0]}
    cache.remember("k", EncodedItem("h1", report, transfer_id="t-not-kept"))
    assert len(cache) == 1
    clock.now = 109.5
    got = cache.recall("k")
    assert got is not None and (got.mm_hash, got.report, got.transfer_id) == ("h1", report, None)
    # reuse does not extend the entry: it still expires 10 s after the encode
    clock.now = 110.0
    assert cache.recall("k") is None
    assert len(cache) == 0


def test_an_entry_is_live_just_before_its_expiry_and_gone_at_it():
    clock = Clock(0.0)
    cache = ReuseCache(ttl_s=5.0, clock=clock)
    cache.remember("k", encoded())
    clock.now = 4.999
    assert cache.recall("k") is not None
    clock.now = 5.0
    assert cache.recall("k") is None


def test_a_disabled_cache_remembers_nothing():
    for ttl in (0.0, -1.0):
        cache = ReuseCache(ttl_s=ttl, clock=Clock())
        assert cache.enabled is False
        cache.remember("k", encoded())
        assert len(cache) == 0 and cache.recall("k") is None
    assert ReuseCache(ttl_s=0.001).enabled is True


def test_an_item_without_metadata_is_not_remembered():
    cache = ReuseCache(ttl_s=10.0, clock=Clock())
    cache.remember("empty", encoded(metadata={}))
    cache.remember("none", EncodedItem("h", {}))
    assert len(cache) == 0


def test_the_least_recently_used_entry_goes_first_when_full():
    clock = Clock()
    cache = ReuseCache(ttl_s=100.0, max_items=2, clock=clock)
    cache.remember("a", encoded("ha"))
    cache.remember("b", encoded("hb"))
    assert recalled(cache, "a").mm_hash == "ha"  # a is now more recent than b
    cache.remember("c", encoded("hc"))
    assert len(cache) == 2
    assert cache.recall("b") is None
    assert [recalled(cache, k).mm_hash for k in ("a", "c")] == ["ha", "hc"]


def test_remembering_again_refreshes_recency_and_replaces_the_entry():
    clock = Clock(0.0)
    cache = ReuseCache(ttl_s=10.0, max_items=2, clock=clock)
    cache.remember("a", encoded("old"))
    cache.remember("b", encoded("hb"))
    clock.now = 5.0
    cache.remember("a", encoded("new"))  # a re-encode: new hash, new expiry, most recent
    cache.remember("c", encoded("hc"))
    assert cache.recall("b") is None
    clock.now = 14.0
    assert recalled(cache, "a").mm_hash == "new"


def test_forget_drops_one_entry_and_ignores_unknown_keys():
    cache = ReuseCache(ttl_s=10.0, clock=Clock())
    cache.remember("a", encoded("ha"))
    cache.remember("b", encoded("hb"))
    cache.forget("a")
    cache.forget("never-seen")
    assert cache.recall("a") is None
    assert recalled(cache, "b").mm_hash == "hb"
    assert len(cache) == 1


def test_default_bound_and_clock():
    cache = ReuseCache(ttl_s=10.0)
    assert cache.max_items == 100_000
    cache.remember("a", encoded())
    assert cache.recall("a") is not None


def video(uuid: str = "v1") -> MediaItem:
    return MediaItem(0, "video_url", {"type": "video_url", "video_url": {"url": "https://v/1.mp4"}}, uuid)


def test_encoding_options_by_hand():
    assert encoding_options({}, item()) == ""
    assert encoding_options({"mm_processor_kwargs": {"fps": 2, "a": 1}}, video()) == '{"a":1,"fps":2}'
    io = {"media_io_kwargs": {"video": {"num_frames": 8}, "image": {"x": 1}}}
    assert encoding_options(io, video()) == 'io={"num_frames":8}'
    assert encoding_options(io, item()) == 'io={"x":1}'
    assert encoding_options({"media_io_kwargs": {"audio": {"sr": 1}}}, item()) == ""  # another modality's
    assert encoding_options({"media_io_kwargs": "odd"}, item()) == 'io="odd"'  # malformed: keyed whole
    both = {"mm_processor_kwargs": {"fps": 2}, "media_io_kwargs": {"video": {"num_frames": 8}}}
    assert encoding_options(both, video()) == '{"fps":2}|io={"num_frames":8}'


def test_keys_with_media_io_options():
    body = {"model": "m", "media_io_kwargs": {"video": {"num_frames": 8}}}
    assert reuse_key(body, video("v")) == 'm|v|io={"num_frames":8}'
    assert encoder_key(body, video("v")) == 'v|io={"num_frames":8}'
    assert encoder_key({"model": "m"}, video("v")) == "v"
