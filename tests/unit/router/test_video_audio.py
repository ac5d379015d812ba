"""Video and audio items in the router: keys per item and per encoding option, and the video that carries
its audio track (vLLM 0.33's two-feature case) left to the consumer. Expected values by hand. Through the
router in front of scripted backends: tests/loopback/router/test_video_audio.py; on real vLLM:
tests/e2e/test_epd_shared_storage.py."""

from epd_operator.router.protocol import EncodedItem, MediaItem, audio_in_video, carries_audio, rewrite_for_decode
from epd_operator.router.reuse import encoder_key, encoding_options, reuse_key

VIDEO = {"type": "video_url", "video_url": {"url": "data:video/jpeg;base64,AAAA,BBBB"}}

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}

AUDIO = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}

AUDIO_URL = {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64,UklGRg=="}}


def video(uuid: str = "v1", index: int = 0) -> MediaItem:
    return MediaItem(index, "video_url", VIDEO, uuid)


def image(uuid: str = "i1", index: int = 0) -> MediaItem:
    return MediaItem(index, "image_url", IMAGE, uuid)


def audio(uuid: str = "a1", kind: str = "input_audio", index: int = 0) -> MediaItem:
    return MediaItem(index, kind, AUDIO if kind == "input_audio" else AUDIO_URL, uuid)


def _chat(*parts, **extra) -> dict:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "what"}, *parts]}],
        **extra,
    }


def test_each_part_type_has_vllms_modality():
    assert [video().modality, image().modality, audio().modality, audio(kind="audio_url").modality] == [
        "video",
        "image",
        "audio",
        "audio",
    ]


def test_a_videos_media_io_options_are_part_of_its_keys_but_not_of_an_images():
    body = {"model": "m", "media_io_kwargs": {"video": {"num_frames": 8, "fps": 2}}}
    assert encoding_options(body, video()) == 'io={"fps":2,"num_frames":8}'
    assert reuse_key(body, video()) == 'm|v1|io={"fps":2,"num_frames":8}'
    assert encoder_key(body, video()) == 'v1|io={"fps":2,"num_frames":8}'
    # The video's loading options do not change how an image of the same request is encoded.
    assert encoding_options(body, image()) == ""
    assert reuse_key(body, image()) == "m|i1"
    assert encoder_key(body, image()) == "i1"


def test_audio_clips_take_the_audio_entry_of_media_io_options():
    body = {"model": "m", "media_io_kwargs": {"audio": {"audio_backend": "soundfile"}, "video": {"num_frames": 4}}}
    assert reuse_key(body, audio()) == 'm|a1|io={"audio_backend":"soundfile"}'
    assert reuse_key(body, audio("a2", "audio_url")) == 'm|a2|io={"audio_backend":"soundfile"}'
    assert reuse_key(body, video()) == 'm|v1|io={"num_frames":4}'


def test_processor_and_media_io_options_together_and_in_a_stable_order():
    body = {
        "model": "m",
        "mm_processor_kwargs": {"fps": 1, "max_pixels": 9},
        "media_io_kwargs": {"video": {"num_frames": 4}},
    }
    assert reuse_key(body, video()) == 'm|v1|{"fps":1,"max_pixels":9}|io={"num_frames":4}'
    assert encoder_key(body, video()) == 'v1|{"fps":1,"max_pixels":9}|io={"num_frames":4}'
    reordered = {
        "model": "m",
        "media_io_kwargs": {"video": {"num_frames": 4}},
        "mm_processor_kwargs": {"max_pixels": 9, "fps": 1},
    }
    assert reuse_key(reordered, video()) == reuse_key(body, video())


def test_empty_or_malformed_media_io_options():
    assert reuse_key({"model": "m", "media_io_kwargs": {"video": {}}}, video()) == "m|v1"
    assert reuse_key({"model": "m", "media_io_kwargs": {}}, video()) == "m|v1"
    # Not an object per modality: keyed whole, so it never shares an entry with a well-formed request.
    assert reuse_key({"model": "m", "media_io_kwargs": "x"}, video()) == 'm|v1|io="x"'
    assert reuse_key({"model": "m", "media_io_kwargs": [1]}, image()) == "m|i1|io=[1]"


def test_audio_in_video_is_the_processor_option_use_audio_in_video():
    assert audio_in_video({"mm_processor_kwargs": {"use_audio_in_video": True}}) is True
    assert audio_in_video({"mm_processor_kwargs": {"use_audio_in_video": False}}) is False
    assert audio_in_video({"mm_processor_kwargs": {"fps": 2}}) is False
    assert audio_in_video({"mm_processor_kwargs": "use_audio_in_video"}) is False
    assert audio_in_video({}) is False
    with_audio = {"mm_processor_kwargs": {"use_audio_in_video": True}}
    assert [carries_audio(with_audio, i) for i in (video(), image(), audio())] == [True, False, True]
    assert [carries_audio({}, i) for i in (video(), image(), audio())] == [False, False, True]


def test_a_video_with_its_audio_keeps_the_whole_request_raw_and_pinned():
    body = _chat(VIDEO, IMAGE, mm_processor_kwargs={"use_audio_in_video": True})
    image_done = EncodedItem("h-img", {"metadata": {"image_grid_thw": [1, 4, 4]}}, transfer_id="t-img")
    out = rewrite_for_decode(body, [video("v1", 0), image("i1", 1)], {1: image_done}, pin_raw=False)
    assert out["messages"][0]["content"] == [
        {"type": "text", "text": "what"},
        {**VIDEO, "uuid": "v1"},
        {**IMAGE, "uuid": "i1"},
    ]
    assert out["ec_transfer_params"] == {
        "h-img": {"metadata": {"image_grid_thw": [1, 4, 4]}},
        "ec_items": [{"mm_hash": "h-img", "transfer_id": "t-img"}],
    }
    assert out["mm_processor_kwargs"] == {"use_audio_in_video": True}


def test_without_audio_in_video_the_same_request_is_rewritten_to_embeds():
    body = _chat(VIDEO, IMAGE)
    done = {
        0: EncodedItem("h-vid", {"metadata": {"video_grid_thw": [[2, 4, 4]]}}),
        1: EncodedItem("h-img", {"metadata": {"image_grid_thw": [1, 4, 4]}}),
    }
    out = rewrite_for_decode(body, [video("v1", 0), image("i1", 1)], done)
    assert out["messages"][0]["content"][1:] == [
        {"type": "video_embeds", "video_embeds": {"video_grid_thw": [2, 4, 4]}, "uuid": "v1"},
        {"type": "image_embeds", "image_embeds": {"image_grid_thw": [1, 4, 4]}, "uuid": "i1"},
    ]
