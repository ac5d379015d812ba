"""The EPD wire protocol as pure functions: what vLLM 0.32's own EPD proxy (`disagg_epd_proxy.py`) sends and
expects; then worked examples: exact error messages and `param`s, uuids from sha256sum, whole rewritten bodies
written out, and inputs real traffic has (a text-only message before one with media, a prompt split over parts
longer than the prefix limit)."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from typing import Any

import orjson
import pytest

from epd_operator.router.protocol import (
    PREFILL_KV_REQUEST,
    BadRequest,
    EncodedItem,
    EncoderReplyError,
    MediaItem,
    audio_in_video,
    carries_audio,
    encoder_request,
    error_body,
    extract_media,
    flatten_one_level,
    group_for_encoders,
    item_uuid,
    match_encoder_reply,
    media_url,
    new_id,
    parse_json_object,
    prefill_request,
    prompt_prefix,
    refuse_router_fields,
    rewrite_for_decode,
    validate_chat,
    validate_completion,
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


SHA_A = "14844c5adfa9c3a0a1b84a5e776808694c8b665672cd089748bfed7ccdc339b0"  # printf '%s' https://img/a.png | sha256sum

# printf '%s' '{"input_audio": {"data": "AAAA", "format": "wav"}, "type": "input_audio"}' | sha256sum
SHA_AUDIO = "8535a3d3d925e8880764fdca4158870095b6f2d92ca3e5c48ed6f89a6515ea19"


def bad(call, *args, **kwargs) -> BadRequest:
    with pytest.raises(BadRequest) as caught:
        call(*args, **kwargs)
    return caught.value


def conversation(*contents: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content} for content in contents]


def item(index: int, kind: str = "image_url", uuid: str | None = None) -> MediaItem:
    part = {"type": kind, kind: {"url": f"https://m/{index}"}}
    return MediaItem(index, kind, part, uuid or f"u{index}")


def enc(mm_hash: str, metadata: dict | None, transfer_id: str | None = None) -> EncodedItem:
    report = {"metadata": metadata} if metadata is not None else {}
    return EncodedItem(mm_hash, report, transfer_id)


def test_uuid_is_the_clients_else_a_hash_of_the_url_else_of_the_sorted_part():
    given = {**IMG_A, "uuid": "client-id"}
    items = extract_media(validate_chat(chat(given, IMG_B, AUDIO)), trust_uuids=True)
    assert items[0].uuid == "client-id"
    assert items[1].uuid == hashlib.sha256(b"https://img/b.png").hexdigest()
    assert items[2].uuid == hashlib.sha256(json.dumps(AUDIO, sort_keys=True).encode()).hexdigest()
    assert [i.index for i in items] == [0, 1, 2]


def test_an_untrusted_client_uuid_is_removed_and_the_item_keyed_by_its_url():
    body = chat({**IMG_A, "uuid": "someone-elses-image"})
    stripped: list[str] = []
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


def test_ids_are_32_hex_digits_and_differ():
    ids = {new_id() for _ in range(100)}
    assert len(ids) == 100 and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)


def test_bad_request_defaults_to_400_without_param():
    err = BadRequest("no")
    assert (str(err), err.status, err.param) == ("no", 400, None)


def test_error_body_is_openai_shaped():
    assert orjson.loads(error_body("m", 413, param="p")) == {
        "error": {"message": "m", "type": "invalid_request_error", "param": "p", "code": 413}
    }
    assert orjson.loads(error_body("m", 503, "server_error")) == {
        "error": {"message": "m", "type": "server_error", "param": None, "code": 503}
    }


def test_parse_json_object_messages():
    assert parse_json_object(b'{"a": 1}') == {"a": 1}
    err = bad(parse_json_object, b"{oops")
    assert str(err).startswith("request body is not valid JSON: ") and (err.status, err.param) == (400, None)
    assert str(bad(parse_json_object, b"[1]")) == "request body must be a JSON object"


@pytest.mark.parametrize(
    "body,message,param",
    [
        ({}, "'messages' must be a non-empty list", "messages"),
        ({"messages": []}, "'messages' must be a non-empty list", "messages"),
        ({"messages": {"role": "user"}}, "'messages' must be a non-empty list", "messages"),
        ({"messages": [{"role": "user"}, "x"]}, "messages[1] must be an object with a string 'role'", "messages[1]"),
        ({"messages": [{"role": 1}]}, "messages[0] must be an object with a string 'role'", "messages[0]"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}, {"type": 3}]}]},
            "messages[0].content[1] must be an object with a string 'type'",
            "messages[0].content[1]",
        ),
        (
            {"messages": [{"role": "user", "content": ["text"]}]},
            "messages[0].content[0] must be an object with a string 'type'",
            "messages[0].content[0]",
        ),
        (
            {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": {"type": "text"}}]},
            "messages[1].content must be a string or a list of parts",
            "messages[1].content",
        ),
    ],
)
def test_validate_chat_names_the_offending_message(body, message, param):
    err = bad(validate_chat, body)
    assert (str(err), err.status, err.param) == (message, 400, param)


def test_validate_chat_accepts_string_missing_and_list_content():
    messages = [{"role": "system", "content": "s"}, {"role": "assistant"}, {"role": "user", "content": []}]
    assert validate_chat({"messages": messages}) is messages


@pytest.mark.parametrize("prompt", [None, "", [], 5])
def test_validate_completion_needs_a_prompt(prompt):
    err = bad(validate_completion, {} if prompt is None else {"prompt": prompt})
    assert (str(err), err.param) == ("'prompt' must be a non-empty string or list", "prompt")


def test_validate_completion_accepts_text_and_token_lists():
    for prompt in ("hi", [1, 2]):
        validate_completion({"prompt": prompt})  # raises BadRequest when refused


def test_media_url_reads_the_object_or_the_string_form():
    assert media_url(IMG_A) == "https://img/a.png"
    assert media_url({"type": "image_url", "image_url": "https://img/s.png"}) == "https://img/s.png"
    assert media_url({"type": "image_url", "image_url": {"url": 5}}) is None
    assert media_url({"type": "image_url", "image_url": 5}) is None
    assert media_url({"type": "image_url"}) is None


def test_item_uuid_by_hand():
    assert item_uuid(IMG_A) == SHA_A
    assert item_uuid(AUDIO) == SHA_AUDIO  # the sorted json.dumps of the part, spaces included
    assert item_uuid({**IMG_A, "uuid": "mine"}) == "mine"
    assert item_uuid({**IMG_A, "uuid": ""}) == SHA_A
    assert item_uuid({**IMG_A, "uuid": 7}) == SHA_A
    # an input_audio part is hashed whole even if it carries something url-like
    assert item_uuid({**AUDIO, "input_audio": "https://img/a.png"}) != SHA_A


def test_router_only_fields_are_refused_by_name():
    refuse_router_fields({"model": "m"})
    for key in ("kv_transfer_params", "ec_transfer_params"):
        err = bad(refuse_router_fields, {key: {}})
        assert (str(err), err.param) == (f"'{key}' is set by the router, not by clients", key)


def test_a_text_only_message_before_a_message_with_media():
    messages = conversation("just text", None, [{"type": "text", "text": "look"}, IMG_A, AUDIO])
    items = extract_media(messages)
    assert [(i.index, i.kind, i.uuid) for i in items] == [(0, "image_url", SHA_A), (1, "input_audio", SHA_AUDIO)]
    assert items[0].part is messages[2]["content"][1]
    assert [i.batchable for i in items] == [True, False]


@pytest.mark.parametrize(
    "part,message,param",
    [
        (
            {"type": "image_embeds", "image_embeds": {}},
            "image_embeds parts are not accepted from clients by this router",
            "image_embeds",
        ),
        ({"type": "image_url", "image_url": {}}, "image_url part needs a 'url'", "image_url"),
        ({"type": "video_url", "video_url": ""}, "video_url part needs a 'url'", "video_url"),
        (
            {"type": "audio_url", "audio_url": {"url": "FILE:///x"}},
            "file:// media URLs are not allowed by this router",
            "audio_url",
        ),
        (
            {"type": "input_audio", "input_audio": "AAAA"},
            "input_audio part needs an 'input_audio' object",
            "input_audio",
        ),
    ],
)
def test_extract_media_refusals(part, message, param):
    err = bad(extract_media, conversation([part]))
    assert (str(err), err.status, err.param) == (message, 400, param)


def test_allowed_embeds_and_file_urls_and_other_parts():
    embeds = {"type": "image_embeds", "image_embeds": {}}
    assert (
        extract_media(conversation([embeds, {"type": "text", "text": "x"}, {"type": "custom"}]), allow_embeds=True)
        == []
    )
    items = extract_media(
        conversation([{"type": "image_url", "image_url": {"url": "file:///m.png"}}]), allow_file_urls=True
    )
    assert items[0].content_addressed is False


def test_content_addressing_by_kind():
    data = {"type": "image_url", "image_url": {"url": "DATA:image/png;base64,AA"}}
    items = extract_media(conversation([IMG_A, data, AUDIO]))
    assert [i.content_addressed for i in items] == [False, True, True]
    assert [i.content_addressed for i in extract_media(conversation([IMG_A]), immutable_urls=True)] == [True]
    trusted = extract_media(conversation([{**IMG_A, "uuid": ""}]), trust_uuids=True)  # an empty name names nothing
    assert (trusted[0].uuid, trusted[0].content_addressed) == (SHA_A, False)
    named = extract_media(conversation([{**IMG_A, "uuid": "n"}]), trust_uuids=True)
    assert (named[0].uuid, named[0].content_addressed) == ("n", True)


def test_untrusted_uuids_are_stripped_from_every_part_even_text():
    text = {"type": "text", "text": "t", "uuid": "x"}
    img = {**IMG_A, "uuid": "y"}
    messages = conversation([text, img])
    assert [i.uuid for i in extract_media(messages)] == [SHA_A]
    assert text == {"type": "text", "text": "t"} and img == IMG_A
    assert extract_media(conversation([{**IMG_A, "uuid": "z"}]), stripped=None)[0].uuid == SHA_A
    kept = {**IMG_A, "uuid": "y"}
    stripped: list[str] = []
    extract_media(conversation([kept]), trust_uuids=True, stripped=stripped)
    assert kept["uuid"] == "y" and stripped == []


def test_grouping_batches_images_per_encoder_up_to_the_cap():
    e1, e2 = object(), object()
    items = [item(0), item(1), item(2, "audio_url"), item(3), item(4), item(5)]
    groups = group_for_encoders(items, [e1, e2, e1, e1, e1, e2], max_batch=2)
    assert [(t, [i.index for i in batch]) for t, batch in groups] == [(e1, [0, 3]), (e2, [1, 5]), (e1, [2]), (e1, [4])]
    unlimited = group_for_encoders(items, [e1] * 6)
    assert [(t, [i.index for i in batch]) for t, batch in unlimited] == [(e1, [0, 1, 3, 4, 5]), (e1, [2])]
    with pytest.raises(ValueError):
        group_for_encoders(items, [e1])


def test_encoder_request_by_hand():
    body = {
        "model": "m",
        "messages": [],
        "max_tokens": 9,
        "mm_processor_kwargs": {"a": 1},
        "priority": 2,
        "media_io_kwargs": {"b": 2},
        "session_id": "s",
        "stream": True,
    }
    items = [item(0), item(1)]
    assert encoder_request(body, items, "tcp://10.0.0.1:5", ["t0", "t1"]) == {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "https://m/0"}, "uuid": "u0"},
                    {"type": "image_url", "image_url": {"url": "https://m/1"}, "uuid": "u1"},
                ],
            }
        ],
        "stream": False,
        "mm_processor_kwargs": {"a": 1},
        "media_io_kwargs": {"b": 2},
        "priority": 2,
        "session_id": "s",
        "ec_transfer_params": {
            "consumer_zmq": "tcp://10.0.0.1:5",
            "ec_items": [{"transfer_id": "t0"}, {"transfer_id": "t1"}],
        },
    }
    plain = encoder_request({"model": "m"}, [item(0)])
    assert plain == {
        "model": "m",
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://m/0"}, "uuid": "u0"}]}
        ],
        "stream": False,
    }
    assert encoder_request({}, [item(0)], "z")["ec_transfer_params"] == {"consumer_zmq": "z", "ec_items": []}


@pytest.mark.parametrize(
    "params,items,message",
    [
        ([1], [item(0)], "ec_transfer_params is not an object"),
        ({"h": 1, "k": {}}, [item(0), item(1)], "entry 'h' is not an object"),
        ({"h": {"item_indices": [2]}}, [item(0), item(1)], "invalid item index 2"),
        ({"h": {"item_indices": [-1]}}, [item(0), item(1)], "invalid item index -1"),
        ({"h": {"item_indices": [True]}}, [item(0), item(1)], "invalid item index True"),
        ({"h": {"item_indices": [0]}, "g": {"item_indices": [0, 1]}}, [item(0), item(1)], "duplicate item index 0"),
        ({"h": {"item_indices": [0]}}, [item(0), item(1)], "no entry for item 1 (uuid u1)"),
        ({"a": {}, "b": {}}, [item(0)], "no entry for item 0 (uuid u0)"),
        ({"u0": 5}, [item(0)], "entry 'u0' is not an object"),
    ],
)
def test_unmatchable_replies_say_why(params, items, message):
    with pytest.raises(EncoderReplyError) as caught:
        match_encoder_reply(params, items)
    assert str(caught.value) == message


def test_matching_by_index_then_uuid_then_the_only_entry():
    assert match_encoder_reply(None, [item(0)]) == {} and match_encoder_reply({}, [item(0)]) == {}
    a: dict[str, Any] = {"item_indices": [1]}
    b: dict[str, Any] = {"metadata": {}}
    assert match_encoder_reply({"h": a, "u0": b}, [item(4, uuid="u0"), item(5)]) == {5: ("h", a), 4: ("u0", b)}
    assert match_encoder_reply({"x": b}, [item(3)]) == {3: ("x", b)}
    assert match_encoder_reply({"u3": b, "y": a}, [item(3)]) == {3: ("u3", b)}


def test_flatten_one_level():
    assert flatten_one_level([[1, 2], 3, [[4]]]) == [1, 2, 3, [4]]
    assert flatten_one_level(7) == [7]
    assert flatten_one_level([]) == []


def test_rewrite_across_a_text_message_and_two_media_messages():
    body: dict[str, Any] = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, IMG_A]},
            {"role": "user", "content": [AUDIO]},
        ],
    }
    original = copy.deepcopy(body)
    items = extract_media(copy.deepcopy(body["messages"]))
    encoded = {0: enc("hA", {"image_grid_thw": [[1, 2, 2]], "n": 3}, "t0"), 1: enc("hB", {"audio_len": [5]})}
    out = rewrite_for_decode(body, items, encoded)
    assert body == original
    assert out == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "a"},
                    {"type": "image_embeds", "image_embeds": {"image_grid_thw": [1, 2, 2], "n": [3]}, "uuid": SHA_A},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "audio_embeds", "audio_embeds": {"audio_len": [5]}, "uuid": SHA_AUDIO}],
            },
        ],
        "ec_transfer_params": {
            "hA": {"metadata": {"image_grid_thw": [[1, 2, 2]], "n": 3}},
            "hB": {"metadata": {"audio_len": [5]}},
            "ec_items": [{"mm_hash": "hA", "transfer_id": "t0"}],
        },
    }


def test_rewrite_keeps_client_params_and_leaves_unencoded_items_raw():
    body: dict[str, Any] = {"messages": [{"role": "user", "content": [IMG_A]}], "ec_transfer_params": {"keep": 1}}
    items = extract_media(copy.deepcopy(body["messages"]))
    out = rewrite_for_decode(body, items, {0: enc("h", {})})
    assert out["messages"][0]["content"] == [IMG_A]
    assert out["ec_transfer_params"] == {"keep": 1, "h": {"metadata": {}}}
    assert rewrite_for_decode(body, items, {}) is body
    pinned = rewrite_for_decode(body, items, {}, pin_raw=True)
    assert pinned["messages"][0]["content"] == [{**IMG_A, "uuid": SHA_A}]
    assert pinned["ec_transfer_params"] == {"keep": 1}  # nothing encoded: nothing added
    assert rewrite_for_decode(body, [], {}, pin_raw=True) is body


def test_rewrite_without_embeds_sends_raw_media_but_the_handles():
    body = {"messages": [{"role": "user", "content": [IMG_A]}]}
    items = extract_media(copy.deepcopy(body)["messages"])
    out = rewrite_for_decode(body, items, {0: enc("h", {"g": [1]}, "t")}, embeds=False)
    assert out["messages"][0]["content"] == [IMG_A]
    assert out["ec_transfer_params"] == {
        "h": {"metadata": {"g": [1]}},
        "ec_items": [{"mm_hash": "h", "transfer_id": "t"}],
    }


def test_an_audio_item_without_metadata_pins_every_item_raw():
    body = {"messages": [{"role": "user", "content": [IMG_A, AUDIO]}]}
    items = extract_media(copy.deepcopy(body)["messages"])
    out = rewrite_for_decode(body, items, {0: enc("h", {"g": [1]}), 1: enc("a", None)})
    assert out["messages"][0]["content"] == [{**IMG_A, "uuid": SHA_A}, {**AUDIO, "uuid": SHA_AUDIO}]
    missing = rewrite_for_decode(body, items, {0: enc("h", {"g": [1]})})  # no report at all for the audio
    assert missing["messages"][0]["content"] == [{**IMG_A, "uuid": SHA_A}, {**AUDIO, "uuid": SHA_AUDIO}]


def test_prefill_request_by_hand():
    body = {
        "model": "m",
        "stream": True,
        "max_tokens": 50,
        "max_completion_tokens": 50,
        "stream_options": {"include_usage": True},
    }
    req = prefill_request(body)
    assert req == {
        "model": "m",
        "stream": False,
        "max_tokens": 1,
        "max_completion_tokens": 1,
        "kv_transfer_params": {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        },
    }
    assert body["stream"] is True and "kv_transfer_params" not in body
    req["kv_transfer_params"]["remote_host"] = "changed"
    assert PREFILL_KV_REQUEST["remote_host"] is None
    assert prefill_request({"model": "m"}) == {
        "model": "m",
        "stream": False,
        "max_tokens": 1,
        "kv_transfer_params": dict(PREFILL_KV_REQUEST),
    }


def test_prompt_prefix_of_a_prompt_split_over_parts_longer_than_the_limit():
    messages = [
        {"role": "system", "content": "abc"},
        {"role": "user", "content": [{"type": "text", "text": "defg"}, IMG_A, {"type": "text", "text": "hij"}]},
        {"role": "user", "content": None},
        {"role": "user", "content": [{"type": "text", "text": 5}, {"type": "text", "text": "klm"}]},
    ]
    body = {"messages": messages}
    items = extract_media(copy.deepcopy(messages))
    assert prompt_prefix(body, items, 5) == "abcde"
    assert prompt_prefix(body, items, 7) == "abcdefg"
    assert prompt_prefix(body, items, 8) == "abcdefg" + SHA_A[:1]
    assert prompt_prefix(body, items, 9) == "abcdefg" + SHA_A[:2]
    full = "abcdefg" + SHA_A + "hijklm"
    assert prompt_prefix(body, items, 1000) == full
    assert prompt_prefix(body, items, len(full)) == full
    assert prompt_prefix(body, items, len(full) - 1) == full[:-1]


def test_prompt_prefix_of_completions():
    assert prompt_prefix({"prompt": "hello"}, [], 3) == "hel"
    assert prompt_prefix({"prompt": [1, 22, 333]}, [], 6) == "[1,22,"
    assert prompt_prefix({"prompt": ["ab", "cd"]}, [], 100) == '["ab","cd"]'


def test_rewrite_keeps_each_item_in_its_place_across_three_media_parts():
    img = [{"type": "image_url", "image_url": {"url": f"https://img/{i}.png"}} for i in range(3)]
    body = {
        "messages": [
            {"role": "user", "content": [img[0], {"type": "text", "text": "and"}, img[1]]},
            {"role": "user", "content": [img[2]]},
        ]
    }
    items = extract_media(copy.deepcopy(body)["messages"])
    encoded = {0: enc("h0", {"g": [0]}), 2: enc("h2", {"g": [2]})}
    out = rewrite_for_decode(body, items, encoded)
    assert out["messages"][0]["content"] == [
        {"type": "image_embeds", "image_embeds": {"g": [0]}, "uuid": items[0].uuid},
        {"type": "text", "text": "and"},
        img[1],
    ]
    assert out["messages"][1]["content"] == [
        {"type": "image_embeds", "image_embeds": {"g": [2]}, "uuid": items[2].uuid}
    ]


def test_which_items_carry_audio():
    vid = MediaItem(0, "video_url", {"type": "video_url", "video_url": {"url": "u"}}, "v")
    aud = MediaItem(1, "audio_url", {"type": "audio_url", "audio_url": {"url": "u"}}, "a")
    img = MediaItem(2, "image_url", {"type": "image_url", "image_url": {"url": "u"}}, "i")
    with_audio = {"mm_processor_kwargs": {"use_audio_in_video": True}}
    assert (audio_in_video(with_audio), audio_in_video({}), audio_in_video({"mm_processor_kwargs": "x"})) == (
        True,
        False,
        False,
    )
    assert audio_in_video({"mm_processor_kwargs": {"use_audio_in_video": False}}) is False
    assert [carries_audio({}, i) for i in (vid, aud, img)] == [False, True, False]
    assert [carries_audio(with_audio, i) for i in (vid, aud, img)] == [True, True, False]
