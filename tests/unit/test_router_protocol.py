"""The EPD wire protocol as pure functions: what vLLM 0.32's own EPD proxy (`disagg_epd_proxy.py`) sends and expects."""

import hashlib
import json

import pytest

from epd_operator.router.protocol import (
    BadRequest,
    EncodedItem,
    EncoderReplyError,
    encoder_request,
    extract_media,
    group_for_encoders,
    match_encoder_reply,
    parse_json_object,
    prefill_request,
    prompt_prefix,
    rewrite_for_decode,
    validate_chat,
)

IMG_A = {"type": "image_url", "image_url": {"url": "https://img/a.png"}}
IMG_B = {"type": "image_url", "image_url": {"url": "https://img/b.png"}}
AUDIO = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
VIDEO = {"type": "video_url", "video_url": {"url": "https://vid/v.mp4"}}


def chat(*parts, **extra):
    return {
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "describe"}, *parts]}],
        **extra,
    }


def media(body):
    return extract_media(validate_chat(body))


def test_uuid_is_the_clients_else_a_hash_of_the_url_else_of_the_sorted_part():
    given = {**IMG_A, "uuid": "client-id"}
    items = extract_media(validate_chat(chat(given, IMG_B, AUDIO)), trust_uuids=True)
    assert items[0].uuid == "client-id"
    assert items[1].uuid == hashlib.sha256(b"https://img/b.png").hexdigest()
    assert items[2].uuid == hashlib.sha256(json.dumps(AUDIO, sort_keys=True).encode()).hexdigest()
    assert [i.index for i in items] == [0, 1, 2]


def test_an_untrusted_client_uuid_is_removed_and_the_item_keyed_by_its_url():
    body = chat({**IMG_A, "uuid": "someone-elses-image"})
    stripped = []
    items = extract_media(validate_chat(body), stripped=stripped)
    assert items[0].uuid == hashlib.sha256(b"https://img/a.png").hexdigest()
    assert "uuid" not in body["messages"][0]["content"][1] and stripped == [body["messages"][0]["content"][1]]


def test_only_content_named_items_are_reusable_unless_urls_are_declared_immutable():
    data_url = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    assert [i.content_addressed for i in media(chat(IMG_A, data_url, AUDIO))] == [False, True, True]
    assert [i.content_addressed for i in extract_media(validate_chat(chat(IMG_A)), immutable_urls=True)] == [True]
    trusted = extract_media(validate_chat(chat({**IMG_A, "uuid": "u"})), trust_uuids=True)
    assert [i.content_addressed for i in trusted] == [True]


def test_client_embeds_parts_are_refused_unless_allowed():
    embeds = {"type": "image_embeds", "image_embeds": {"image_grid_thw": [1, 2, 2]}}
    with pytest.raises(BadRequest, match="image_embeds parts are not accepted"):
        media(chat(embeds))
    assert extract_media(validate_chat(chat(embeds)), allow_embeds=True) == []


def test_plain_string_content_and_text_parts_carry_no_media():
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ],
    }
    assert media(body) == []


def test_images_on_the_same_encoder_are_batched_audio_and_video_go_alone():
    items = media(chat(IMG_A, IMG_B, AUDIO, VIDEO, {**IMG_A, "uuid": "x"}))
    e1, e2 = object(), object()
    groups = group_for_encoders(items, [e1, e2, e1, e1, e1])
    assert [(t, [i.index for i in g]) for t, g in groups] == [(e1, [0, 4]), (e2, [1]), (e1, [2]), (e1, [3])]
    capped = group_for_encoders(items[:2] + items[4:], [e1, e1, e1], max_batch=2)
    assert [[i.index for i in g] for _, g in capped] == [[0, 1], [4]]


def test_encoder_request_is_text_stripped_uuid_tagged_and_keeps_processing_options():
    body = chat(IMG_A, IMG_B, mm_processor_kwargs={"fps": 1}, priority=3, max_tokens=50, stream=True)
    items = media(body)
    req = encoder_request(body, items)
    assert req == {
        "model": "m",
        "messages": [{"role": "user", "content": [{**IMG_A, "uuid": items[0].uuid}, {**IMG_B, "uuid": items[1].uuid}]}],
        "stream": False,
        "mm_processor_kwargs": {"fps": 1},
        "priority": 3,
    }
    mooncake = encoder_request(body, items, "tcp://10.0.0.7:14579", ["t0", "t1"])
    assert mooncake["ec_transfer_params"] == {
        "consumer_zmq": "tcp://10.0.0.7:14579",
        "ec_items": [{"transfer_id": "t0"}, {"transfer_id": "t1"}],
    }


def test_reply_matching_uses_item_indices_for_batches_then_uuid_then_the_only_entry():
    items = media(chat(IMG_A, IMG_B))
    batch_reply = {
        "h-b": {"metadata": {"g": [1]}, "item_indices": [1]},
        "h-a": {"metadata": {"g": [2]}, "item_indices": [0]},
    }
    assert {i: h for i, (h, _) in match_encoder_reply(batch_reply, items).items()} == {0: "h-a", 1: "h-b"}
    single = items[:1]
    assert match_encoder_reply({items[0].uuid: {"metadata": {}}}, single)[0][0] == items[0].uuid
    assert match_encoder_reply({"engine-hash": {"metadata": {}}}, single)[0][0] == "engine-hash"
    assert match_encoder_reply(None, items) == {}


@pytest.mark.parametrize(
    "reply",
    [
        {"h": {"item_indices": [0, 5]}},  # index out of range
        {"h": {"item_indices": [0]}, "k": {"item_indices": [0]}},  # duplicate
        {"h": {"item_indices": [0]}},  # item 1 unmatched
        ["not", "a", "dict"],
    ],
)
def test_unmatchable_encoder_replies_are_errors(reply):
    with pytest.raises(EncoderReplyError):
        match_encoder_reply(reply, media(chat(IMG_A, IMG_B)))


def test_rewrite_replaces_media_by_metadata_only_embeds_and_carries_the_handles():
    body = chat(IMG_A, VIDEO, ec_transfer_params={"client": 1})
    items = media(body)
    encoded = {
        0: EncodedItem("h0", {"metadata": {"image_grid_thw": [1, 16, 16]}, "item_indices": [0]}, "t0"),
        1: EncodedItem("h1", {"metadata": {"video_grid_thw": [[2, 16, 16]]}, "peer_host": "10.0.0.1"}, "t1"),
    }
    out = rewrite_for_decode(body, items, encoded)
    content = out["messages"][0]["content"]
    assert content[0] == {"type": "text", "text": "describe"}
    assert content[1] == {
        "type": "image_embeds",
        "image_embeds": {"image_grid_thw": [1, 16, 16]},
        "uuid": items[0].uuid,
    }
    assert content[2] == {
        "type": "video_embeds",
        "video_embeds": {"video_grid_thw": [2, 16, 16]},
        "uuid": items[1].uuid,
    }
    assert out["ec_transfer_params"] == {
        "client": 1,
        "h0": encoded[0].report,
        "h1": encoded[1].report,
        "ec_items": [{"mm_hash": "h0", "transfer_id": "t0"}, {"mm_hash": "h1", "transfer_id": "t1"}],
    }
    assert body["messages"][0]["content"][1] == IMG_A  # the original is untouched for retries


def test_items_without_metadata_keep_their_raw_media():
    body = chat(IMG_A, IMG_B)
    items = media(body)
    out = rewrite_for_decode(body, items, {0: EncodedItem("h0", {"metadata": {"image_grid_thw": [1, 4, 4]}}, "t0")})
    assert out["messages"][0]["content"][1]["type"] == "image_embeds"
    assert out["messages"][0]["content"][2] == IMG_B


def test_an_audio_item_without_metadata_keeps_every_item_raw_but_pinned():
    body = chat(IMG_A, AUDIO)
    items = media(body)
    out = rewrite_for_decode(body, items, {0: EncodedItem("h0", {"metadata": {"image_grid_thw": [1, 4, 4]}}, "t0")})
    assert out["messages"][0]["content"][1:] == [{**IMG_A, "uuid": items[0].uuid}, {**AUDIO, "uuid": items[1].uuid}]
    assert out["ec_transfer_params"]["ec_items"] == [{"mm_hash": "h0", "transfer_id": "t0"}]


def test_pinning_tags_raw_media_parts_with_their_uuid():
    body = chat(IMG_A, IMG_B)
    items = media(body)
    out = rewrite_for_decode(body, items, {}, pin_raw=True)
    assert out["messages"][0]["content"] == [
        {"type": "text", "text": "describe"},
        {**IMG_A, "uuid": items[0].uuid},
        {**IMG_B, "uuid": items[1].uuid},
    ]
    assert "ec_transfer_params" not in out
    assert rewrite_for_decode(body, items, {}) is body  # vLLM proxy semantics: nothing reported, nothing changed


def test_prefill_request_asks_for_one_token_and_remote_decode():
    body = chat(stream=True, stream_options={"include_usage": True}, max_tokens=64, max_completion_tokens=64)
    req = prefill_request(body)
    assert req["kv_transfer_params"] == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    assert (req["stream"], req["max_tokens"], req["max_completion_tokens"]) == (False, 1, 1)
    assert "stream_options" not in req and body["stream"] is True


def test_prompt_prefix_covers_text_and_media_identity():
    body = chat(IMG_A)
    items = media(body)
    assert prompt_prefix(body, items, 1000) == "describe" + items[0].uuid
    assert prompt_prefix(body, items, 4) == "desc"
    assert prompt_prefix({"prompt": "hello world"}, [], 5) == "hello"


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
    ],
)
def test_unparseable_bodies_are_bad_requests(raw, message):
    with pytest.raises(BadRequest, match=message):
        parse_json_object(raw)


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m"},
        {"messages": []},
        {"messages": "hi"},
        {"messages": [{"content": "no role"}]},
        {"messages": [{"role": "user", "content": [{"no": "type"}]}]},
        {"messages": [{"role": "user", "content": 5}]},
    ],
)
def test_invalid_messages_are_bad_requests(body):
    with pytest.raises(BadRequest):
        validate_chat(body)


def test_file_urls_are_refused_unless_allowed():
    body = chat({"type": "image_url", "image_url": {"url": "file:///etc/passwd"}})
    with pytest.raises(BadRequest, match="file://"):
        media(body)
    assert len(extract_media(validate_chat(body), allow_file_urls=True)) == 1
