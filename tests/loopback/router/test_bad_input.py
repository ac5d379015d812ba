"""Bad input is answered with an OpenAI-style JSON error and a 4xx, and reaches no backend."""

import orjson
import pytest

from tests.support.router_stack import request_counts, router_stack

CHAT = "/v1/chat/completions"


@pytest.mark.parametrize(
    "path, raw, status, fragment",
    [
        (CHAT, b"{oops", 400, "not valid JSON"),
        (CHAT, b'"a string"', 400, "JSON object"),
        (CHAT, b'{"model": "m"}', 400, "'messages'"),
        (CHAT, b'{"messages": []}', 400, "'messages'"),
        (CHAT, b'{"messages": [{"role": "user", "content": [{"text": "no type"}]}]}', 400, "'type'"),
        (CHAT, b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}', 400, "'url'"),
        (
            CHAT,
            b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}]}',
            400,
            "file://",
        ),
        (CHAT, b'{"messages": [{"role": "user", "content": "' + b"x" * 3000 + b'"}]}', 413, "exceeds 2048 bytes"),
        ("/v1/completions", b'{"model": "m"}', 400, "'prompt'"),
    ],
)
async def test_bad_requests_get_openai_errors(path, raw, status, fragment):
    async with router_stack(encoders=1, max_body_bytes=2048) as s:
        r = await s.post(path, data=raw, headers={"x-request-id": "bad-1"})
        assert r.status == status
        error = r.json()["error"]
        assert fragment in error["message"] and error["code"] == status and error["type"] == "invalid_request_error"
        assert r.headers["x-request-id"] == "bad-1"
        assert not any(b.received for b in s.all_backends())
        assert request_counts(s.router) == {(path, str(status)): 1}


async def test_file_urls_pass_through_when_allowed_without_the_router_reading_them():
    async with router_stack(encoders=1, allow_file_urls=True) as s:
        body = {
            "model": "m",
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///nonexistent/x.png"}}]}
            ],
        }
        r = await s.post(CHAT, body)
        assert r.status == 200
        assert s.encoders[0].bodies()[0]["messages"][0]["content"][0]["image_url"]["url"] == "file:///nonexistent/x.png"


def chat_with(part: dict) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "what"}, part]}]}


EMBEDS = {"type": "image_embeds", "image_embeds": "AAAA"}


async def test_client_embeds_are_refused_on_chat_unless_allowed():
    async with router_stack(encoders=0) as s:
        r = await s.post(CHAT, chat_with(EMBEDS))
        assert r.status == 400 and r.json()["error"]["param"] == "image_embeds"
        assert not s.decodes[0].received
    async with router_stack(encoders=0, allow_client_embeds=True) as s:
        assert (await s.post(CHAT, chat_with(EMBEDS))).status == 200
        assert s.decodes[0].bodies()[0]["messages"][0]["content"][1] == EMBEDS


IMAGE = {"type": "image_url", "image_url": {"url": "https://img/a.png"}, "uuid": "client-1"}


@pytest.mark.parametrize("part", [IMAGE, {"type": "text", "text": "and", "uuid": "client-1"}])
async def test_a_client_uuid_never_reaches_a_backend_unless_trusted(part):
    async with router_stack(encoders=1) as s:
        assert (await s.post(CHAT, chat_with(part))).status == 200
        # a text part's too: the body is otherwise unchanged, and the client's bytes are not forwarded as they came
        for fake in (*s.encoders, *s.decodes):
            assert all(b"client-1" not in orjson.dumps(body) for body in fake.bodies()), fake.name
    async with router_stack(encoders=1, trust_client_uuids=True) as s:
        assert (await s.post(CHAT, chat_with(IMAGE))).status == 200
        assert s.decodes[0].bodies()[0]["messages"][0]["content"][1]["uuid"] == "client-1"


async def test_a_generation_with_an_id_the_router_cannot_pass_on_is_a_400_counted_on_its_route():
    async with router_stack(encoders=0) as s:
        r = await s.post(CHAT, chat_with(EMBEDS), headers={"x-request-id": "has space"})
        assert r.status == 400 and len(r.headers["x-request-id"]) == 32
        assert r.json()["error"]["message"] == "x-request-id must be 1 to 256 visible ASCII characters"
        assert request_counts(s.router) == {(CHAT, "400"): 1} and not s.decodes[0].received
