"""Video and audio items through the router in front of scripted backends: each video frame count and
audio clip encoded once then reused, cache-aware picking keyed by a video's options, and the video that
carries its audio track (vLLM 0.33's two-feature case) left to the consumer. Real vLLM serving a video
through the router: tests/e2e/test_epd_shared_storage.py."""

from epd_operator.router.protocol import MediaItem
from tests.support.prom import sample_values
from tests.support.router_stack import router_stack

CHAT = "/v1/chat/completions"

VIDEO = {"type": "video_url", "video_url": {"url": "data:video/jpeg;base64,AAAA,BBBB"}}

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}

AUDIO = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}


def video(uuid: str = "v1", index: int = 0) -> MediaItem:
    return MediaItem(index, "video_url", VIDEO, uuid)


def _chat(*parts, **extra) -> dict:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "what"}, *parts]}],
        **extra,
    }


def _parts(body: dict) -> list:
    return body["messages"][0]["content"]


async def test_each_video_frame_count_is_encoded_once_then_reused():
    async with router_stack(encoders=1, reuse_ttl=60) as s:
        four = {"media_io_kwargs": {"video": {"num_frames": 4}}}
        two = {"media_io_kwargs": {"video": {"num_frames": 2}}}
        for extra in (four, two, four, two, {}):
            assert (await s.post(CHAT, _chat(VIDEO, **extra))).status == 200
        # Encoded: 4 frames, 2 frames, the default; reused: the repeats of 4 and 2.
        sent = s.encoders[0].bodies()
        assert [b.get("media_io_kwargs") for b in sent] == [four["media_io_kwargs"], two["media_io_kwargs"], None]
        metrics = (await s.get("/metrics")).body
        assert sample_values(metrics, "epd_router_items_total", outcome="encoded") == [3]
        assert sample_values(metrics, "epd_router_items_total", outcome="reused") == [2]
        # Each consumer request carries its own options next to the embedding it names.
        assert [b.get("media_io_kwargs") for b in s.decodes[0].bodies()] == [
            four["media_io_kwargs"],
            two["media_io_kwargs"],
            four["media_io_kwargs"],
            two["media_io_kwargs"],
            None,
        ]


async def test_cache_aware_picking_keys_a_video_by_its_options_too():
    async with router_stack(encoders=4) as s:
        variants = [{"media_io_kwargs": {"video": {"num_frames": n}}} for n in (2, 4, 6, 8, 10, 12)]
        for _ in range(2):
            for extra in variants:
                assert (await s.post(CHAT, _chat(VIDEO, **extra))).status == 200
        homes: dict[int, set[int]] = {}
        for e, fake in enumerate(s.encoders):
            for b in fake.bodies():
                homes.setdefault(b["media_io_kwargs"]["video"]["num_frames"], set()).add(e)
        # Each (video, frame count) went to one encoder both times ...
        assert sorted(homes) == [2, 4, 6, 8, 10, 12] and all(len(e) == 1 for e in homes.values())
        # ... and six variants of one video did not all land on one of four encoders.
        assert len(set().union(*homes.values())) > 1


async def test_a_video_with_its_audio_track_skips_the_encoders():
    async with router_stack(encoders=1) as s:
        body = _chat(VIDEO, IMAGE, mm_processor_kwargs={"use_audio_in_video": True})
        assert (await s.post(CHAT, body)).status == 200
        [enc_req] = s.encoders[0].bodies()
        assert [p["type"] for p in _parts(enc_req)] == ["image_url"], "only the image went to the encoder"
        [pd_req] = s.decodes[0].bodies()
        image_uuid = _parts(enc_req)[0]["uuid"]
        assert _parts(pd_req)[1]["type"] == "video_url" and _parts(pd_req)[1]["video_url"] == VIDEO["video_url"]
        assert _parts(pd_req)[2] == {**IMAGE, "uuid": image_uuid}
        assert pd_req["ec_transfer_params"][image_uuid]["metadata"] == {"image_grid_thw": [1, 16, 16]}
        metrics = (await s.get("/metrics")).body
        assert sample_values(metrics, "epd_router_items_total", outcome="encoded") == [1]
        assert sample_values(metrics, "epd_router_items_total", outcome="fallback") == [1]


async def test_a_video_without_its_audio_track_is_encoded_like_an_image():
    async with router_stack(encoders=1) as s:
        assert (await s.post(CHAT, _chat(VIDEO, mm_processor_kwargs={"use_audio_in_video": False}))).status == 200
        [enc_req] = s.encoders[0].bodies()
        assert enc_req["mm_processor_kwargs"] == {"use_audio_in_video": False}
        [pd_req] = s.decodes[0].bodies()
        assert _parts(pd_req)[1]["type"] == "video_embeds"


async def test_audio_clips_are_encoded_one_per_call_and_reused_per_clip():
    other = {"type": "input_audio", "input_audio": {"data": "UklGRh==", "format": "wav"}}
    async with router_stack(encoders=1, reuse_ttl=60, reuse_mode="metadata") as s:
        assert (await s.post(CHAT, _chat(AUDIO, other))).status == 200
        assert (await s.post(CHAT, _chat(other, AUDIO))).status == 200
        sent = [_parts(b) for b in s.encoders[0].bodies()]
        assert [[p["input_audio"] for p in parts] for parts in sent] == [[AUDIO["input_audio"]], [other["input_audio"]]]
        first, second = s.decodes[0].bodies()
        assert [p["type"] for p in _parts(second)[1:]] == ["audio_embeds", "audio_embeds"]
        assert _parts(second)[1]["audio_embeds"] == {"audio_num_tokens": [50]}
        # The second request names the same clips in its own order.
        assert [p["uuid"] for p in _parts(second)[1:]] == [p["uuid"] for p in reversed(_parts(first)[1:])]
