"""Bad input is answered with an OpenAI-style JSON error and a 4xx, and reaches no backend."""

import pytest

from tests.support.router_stack import router_stack

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
