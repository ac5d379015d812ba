"""vLLM 0.32 EPD proxy wire protocol: pure functions over request/response bodies.

Everything here follows the wire protocol of vLLM's own EPD proxy (`disagg_epd_proxy.py` in vLLM
0.32's examples/disaggregated/disaggregated_encoder/: media extraction, the encoder fan-out, the
metadata-only rewrite, the prefill and decode bodies) so that encoders and consumers cannot tell this
router from it.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from typing import Any

import orjson

MEDIA_TYPES = frozenset({"image_url", "audio_url", "input_audio", "video_url"})
AUDIO_TYPES = frozenset({"audio_url", "input_audio"})
# vLLM's modality per part type: the key of `media_io_kwargs` that applies to the item.
MODALITIES = {"image_url": "image", "video_url": "video", "audio_url": "audio", "input_audio": "audio"}
EMBEDS_TYPES = {
    "image_url": "image_embeds",
    "audio_url": "audio_embeds",
    "input_audio": "audio_embeds",
    "video_url": "video_embeds",
}
# Client fields that change how an encoder processes media, so they travel with it.
ENCODER_PASSTHROUGH_KEYS = ("mm_processor_kwargs", "media_io_kwargs", "priority", "session_id")

# What the prefill stage sends so that P keeps the KV for a remote decode (NIXL shape).
PREFILL_KV_REQUEST = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


_ids = random.Random()  # seeded from os.urandom once; ids need uniqueness, not secrecy


def new_id() -> str:
    """A 128-bit random hex id (request and transfer ids) without a getrandom syscall per id."""
    return f"{_ids.getrandbits(128):032x}"


class BadRequest(Exception):
    """The client's request is malformed; answered with an OpenAI-style 4xx."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


class EncoderReplyError(Exception):
    """An encoder answered 200 but its ec_transfer_params cannot be matched to the items sent."""


@dataclass(slots=True)
class MediaItem:
    index: int  # position among all media parts of the request, in message order
    kind: str  # the part's type: image_url, audio_url, input_audio or video_url
    part: dict
    uuid: str
    # The uuid names this content and nothing else (inline bytes or a data: URL hashed, a
    # trusted client uuid, a URL the deployment declared immutable): safe to reuse an
    # encoder result under it.
    content_addressed: bool = True

    @property
    def batchable(self) -> bool:
        # vLLM's proxy batches only images; audio and video go one per request.
        return self.kind == "image_url"

    @property
    def modality(self) -> str:
        return MODALITIES[self.kind]


@dataclass(slots=True)
class EncodedItem:
    """What an encoder reported for one item, enough to rewrite it metadata-only."""

    mm_hash: str  # the engine's key in ec_transfer_params (may differ from the uuid)
    report: dict  # the encoder's entry: metadata, item_indices, connector handles
    transfer_id: str | None = None

    @property
    def metadata(self) -> dict:
        return self.report.get("metadata") or {}


def error_body(message: str, status: int, err_type: str = "invalid_request_error", param: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": err_type, "param": param, "code": status}})


def parse_json_object(raw: bytes) -> dict:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def validate_chat(body: dict) -> list:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list", param="messages")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string 'role'", param=f"messages[{i}]")
        content = msg.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                    raise BadRequest(
                        f"messages[{i}].content[{j}] must be an object with a string 'type'",
                        param=f"messages[{i}].content[{j}]",
                    )
        elif content is not None and not isinstance(content, str):
            raise BadRequest(
                f"messages[{i}].content must be a string or a list of parts", param=f"messages[{i}].content"
            )
    return messages


def validate_completion(body: dict) -> None:
    prompt = body.get("prompt")
    if not isinstance(prompt, (str, list)) or not prompt:
        raise BadRequest("'prompt' must be a non-empty string or list", param="prompt")


def media_url(part: dict) -> str | None:
    ref = part.get(part["type"])
    if isinstance(ref, dict):
        url = ref.get("url")
        return url if isinstance(url, str) else None
    return ref if isinstance(ref, str) else None


def item_uuid(part: dict) -> str:
    """The client's uuid, else a content hash: the EC cache key both sides agree on."""
    given = part.get("uuid")
    if isinstance(given, str) and given:
        return given
    url = media_url(part) if part["type"] != "input_audio" else None
    # json.dumps (not orjson) so the hash equals vLLM's proxy's for the same part.
    payload = url or json.dumps(part, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


# Request fields that only the router may set: they steer the KV and EC transfers between
# the vLLM tiers (which engine, which blocks, which cached embedding).
ROUTER_ONLY_FIELDS = ("kv_transfer_params", "ec_transfer_params")


def refuse_router_fields(body: dict) -> None:
    for key in ROUTER_ONLY_FIELDS:
        if key in body:
            raise BadRequest(f"'{key}' is set by the router, not by clients", param=key)


def extract_media(
    messages: list,
    allow_file_urls: bool = False,
    *,
    allow_embeds: bool = False,
    trust_uuids: bool = False,
    immutable_urls: bool = False,
    stripped: list | None = None,
) -> list[MediaItem]:
    """The request's media items. Untrusted by default: `*_embeds` parts are refused (a
    metadata-only part whose embedding is absent kills a vLLM 0.32 consumer) and a client's
    `uuid` is removed from every part (it would name the EC cache entry, so one client could
    make another's media resolve to its own embedding); the item is then keyed by its content
    (inline bytes, data: URL) or its URL. The parts are changed in place and each one changed
    is appended to `stripped`: the caller must then forward the re-serialised body, not the
    raw bytes."""
    items: list[MediaItem] = []
    for msg in messages:
        content = msg.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            kind = part["type"]
            given = None
            if "uuid" in part:
                if trust_uuids:
                    given = part["uuid"]
                else:
                    del part["uuid"]
                    if stripped is not None:
                        stripped.append(part)
            if kind not in MEDIA_TYPES:
                if not allow_embeds and kind.endswith("_embeds"):
                    raise BadRequest(f"{kind} parts are not accepted from clients by this router", param=kind)
                continue
            if kind != "input_audio":
                url = media_url(part)
                if not url:
                    raise BadRequest(f"{kind} part needs a 'url'", param=kind)
                if not allow_file_urls and url[:5].lower() == "file:":
                    raise BadRequest("file:// media URLs are not allowed by this router", param=kind)
                addressed = immutable_urls or url[:5].lower() == "data:"
            elif not isinstance(part.get("input_audio"), dict):
                raise BadRequest("input_audio part needs an 'input_audio' object", param="input_audio")
            else:
                addressed = True
            if isinstance(given, str) and given:
                addressed = True  # the deployment trusts its clients' names for their media
            items.append(MediaItem(len(items), kind, part, item_uuid(part), addressed))
    return items


def group_for_encoders(
    items: list[MediaItem], targets: list[Any], max_batch: int = 0
) -> list[tuple[Any, list[MediaItem]]]:
    """Batch images that share an encoder into one sub-request (at most max_batch, 0 = unlimited)."""
    groups: list[tuple[Any, list[MediaItem]]] = []
    open_batches: dict[int, list[MediaItem]] = {}
    for item, target in zip(items, targets, strict=True):
        if not item.batchable:
            groups.append((target, [item]))
            continue
        batch = open_batches.get(id(target))
        if batch is None or (max_batch and len(batch) >= max_batch):
            batch = []
            open_batches[id(target)] = batch
            groups.append((target, batch))
        batch.append(item)
    return groups


def encoder_request(
    body: dict, items: list[MediaItem], consumer_zmq: str | None = None, transfer_ids: list[str] | None = None
) -> dict:
    """Text-stripped sub-request carrying only these items, each tagged with its uuid."""
    req: dict = {
        "model": body.get("model"),
        "messages": [{"role": "user", "content": [{**item.part, "uuid": item.uuid} for item in items]}],
        "stream": False,
    }
    for key in ENCODER_PASSTHROUGH_KEYS:
        if key in body:
            req[key] = body[key]
    if consumer_zmq is not None:
        req["ec_transfer_params"] = {
            "consumer_zmq": consumer_zmq,
            "ec_items": [{"transfer_id": tid} for tid in transfer_ids or ()],
        }
    return req


def match_encoder_reply(params: Any, items: list[MediaItem]) -> dict[int, tuple[str, dict]]:
    """Map each item's index to (engine mm_hash, reported entry) from an encoder's ec_transfer_params.

    Multi-item batches match by `item_indices`; otherwise by uuid key, or the only entry.
    An empty report matches nothing (the items then stay raw), it is not an error.
    """
    if not params:
        return {}
    if not isinstance(params, dict):
        raise EncoderReplyError("ec_transfer_params is not an object")
    by_position: dict[int, tuple[str, dict]] = {}
    if len(items) > 1:
        for mm_hash, reported in params.items():
            if not isinstance(reported, dict):
                raise EncoderReplyError(f"entry {mm_hash!r} is not an object")
            for pos in reported.get("item_indices") or ():
                if type(pos) is not int or not 0 <= pos < len(items):
                    raise EncoderReplyError(f"invalid item index {pos!r}")
                if pos in by_position:
                    raise EncoderReplyError(f"duplicate item index {pos}")
                by_position[pos] = (mm_hash, reported)
    matched: dict[int, tuple[str, dict]] = {}
    for pos, item in enumerate(items):
        hit = by_position.get(pos)
        if hit is None:
            if item.uuid in params:
                hit = (item.uuid, params[item.uuid])
            elif len(items) == 1 and len(params) == 1:
                hit = next(iter(params.items()))
            else:
                raise EncoderReplyError(f"no entry for item {pos} (uuid {item.uuid})")
        if not isinstance(hit[1], dict):
            raise EncoderReplyError(f"entry {hit[0]!r} is not an object")
        matched[item.index] = hit
    return matched


def audio_in_video(body: dict) -> bool:
    """The client asked for each video's audio track as well (Qwen2.5-Omni style,
    `mm_processor_kwargs.use_audio_in_video`). An encoder then reports two features (video and
    audio) for the one item; a vLLM 0.32 consumer takes one feature per `*_embeds` part (0.33
    puts both in one part, with two transfer ids). So, like vLLM 0.32's own proxy, this router
    leaves such a video raw and its consumer encodes it."""
    kwargs = body.get("mm_processor_kwargs")
    return isinstance(kwargs, dict) and bool(kwargs.get("use_audio_in_video"))


def carries_audio(body: dict, item: MediaItem) -> bool:
    return item.kind in AUDIO_TYPES or (item.kind == "video_url" and audio_in_video(body))


def flatten_one_level(value: Any) -> list:
    if not isinstance(value, list):
        return [value]
    return [x for v in value for x in (v if isinstance(v, list) else [v])]


def rewrite_for_decode(
    body: dict, items: list[MediaItem], encoded: dict[int, EncodedItem], pin_raw: bool = False, embeds: bool = True
) -> dict:
    """Replace each encoded media part by a metadata-only `*_embeds` part (a new body; `body` is untouched).

    Items without metadata keep their raw media; with `pin_raw` they also carry their uuid, so
    a consumer still finds an embedding stored under that key and otherwise encodes locally.
    `embeds=False` treats every item that way (the handles still travel). If any audio item
    lacks metadata the whole request keeps raw media, every item pinned (vLLM proxy semantics);
    a video carrying its audio track (`audio_in_video`) counts as audio.
    """
    if not encoded and not (pin_raw and items):
        return body
    audio_missing = any(
        carries_audio(body, i) and not (encoded.get(i.index) and encoded[i.index].metadata) for i in items
    )
    ec_items: list[dict] = []
    new_messages = []
    idx = 0
    for msg in body["messages"]:
        content = msg.get("content")
        if not isinstance(content, list):
            new_messages.append(msg)
            continue
        new_content = []
        for part in content:
            if part["type"] not in MEDIA_TYPES:
                new_content.append(part)
                continue
            item = items[idx]
            idx += 1
            enc = encoded.get(item.index)
            if enc is None or not enc.metadata or audio_missing or not embeds:
                new_content.append({**part, "uuid": item.uuid} if audio_missing or pin_raw else part)
            else:
                kind = EMBEDS_TYPES[item.kind]
                metadata = {k: flatten_one_level(v) for k, v in enc.metadata.items()}
                new_content.append({"type": kind, kind: metadata, "uuid": item.uuid})
            if enc is not None and enc.metadata and enc.transfer_id is not None:
                ec_items.append({"mm_hash": enc.mm_hash, "transfer_id": enc.transfer_id})
        new_messages.append({**msg, "content": new_content})
    out = {**body, "messages": new_messages}
    if encoded:
        ec_params = dict(body.get("ec_transfer_params") or {})
        for enc in encoded.values():
            ec_params[enc.mm_hash] = enc.report
        if ec_items:
            ec_params["ec_items"] = ec_items
        out["ec_transfer_params"] = ec_params
    return out


def prefill_request(body: dict) -> dict:
    req = dict(body)
    req["kv_transfer_params"] = dict(PREFILL_KV_REQUEST)
    req["stream"] = False
    req["max_tokens"] = 1
    if "max_completion_tokens" in req:
        req["max_completion_tokens"] = 1
    req.pop("stream_options", None)
    return req


def prompt_prefix(body: dict, items: list[MediaItem], limit: int) -> str:
    """The leading part of the prompt (text and media uuids), the key for prefix-aware routing."""
    if "messages" not in body:
        prompt = body.get("prompt")
        text = prompt if isinstance(prompt, str) else orjson.dumps(prompt).decode()
        return text[:limit]
    uuids = iter(i.uuid for i in items)
    pieces: list[str] = []
    size = 0
    for msg in body["messages"]:
        content = msg.get("content")
        parts = [content] if isinstance(content, str) else content or ()
        for part in parts:
            if isinstance(part, str):
                piece = part
            elif part["type"] in MEDIA_TYPES:
                piece = next(uuids)
            else:
                piece = part.get("text") if isinstance(part.get("text"), str) else ""
            pieces.append(piece)
            size += len(piece)
            if size >= limit:
                return "".join(pieces)[:limit]
    return "".join(pieces)
