"""What the router's HTTP messages (router/http_messages.py) hand a handler and put on the wire, byte for
byte: the request and its body limit, a whole reply, the framing of a streamed reply (chunked for HTTP/1.1,
until-close for 1.0, `Connection: close` on a connection's last reply), how a stream meets a client that
left or stopped reading, the rendered status line and header fields (CR/LF never let out), the JSON
error reply, and the connection limits' defaults.

A streamed reply is written through a recording stand-in for the client connection, so every byte it
queues and every call it makes is seen in order; the server that parses and writes is
tests/loopback/router/test_http_server.py's subject."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from epd_operator.router.http_messages import (
    BodyTooLarge,
    HttpRequest,
    Limits,
    Response,
    StreamResponse,
    error_response,
    render_head,
)


class RecordingConnection:
    """A client connection that records what a reply does to it, in order."""

    def __init__(self, last: bool = False, closed: bool = False, full: bool = False) -> None:
        self.closed = closed
        self.drained: asyncio.Future | None = asyncio.get_running_loop().create_future() if full else None
        self.last = last
        self.calls: list[str] = []
        self.sent: list[bytes] = []
        self.reset_on_drain = False

    def begin_stream(self) -> None:
        self.calls.append("begin_stream")

    def last_reply(self) -> bool:
        self.calls.append("last_reply")
        return self.last

    def send(self, data: bytes) -> None:
        self.calls.append("send")
        self.sent.append(data)

    async def wait_drained(self) -> None:
        self.calls.append("wait_drained")
        if self.reset_on_drain:
            raise ConnectionResetError("client stopped reading")


def request(conn: RecordingConnection, http10: bool = False, keep_alive: bool = True) -> HttpRequest:
    return HttpRequest("GET", "/stream", "", {}, b"", conn, keep_alive=keep_alive, http10=http10)


async def prepared(
    http10: bool = False, last: bool = False, closed: bool = False, full: bool = False
) -> tuple[StreamResponse, RecordingConnection]:
    """A stream prepared on a fresh connection, with the head it sent cleared from the record."""
    conn = RecordingConnection(last=last, full=full)
    out = StreamResponse()
    await out.prepare(request(conn, http10=http10))
    conn.closed = closed
    conn.calls.clear()
    conn.sent.clear()
    return out, conn


# ------------------------------------------------------------------------------------------ limits


def test_limits_defaults():
    assert Limits() == Limits(
        max_head=65536,
        max_headers=100,
        max_line=8192,
        max_pipeline=32,
        head_timeout=10.0,
        body_timeout=30.0,
        body_min_rate=65536.0,
        keepalive=75.0,
        send_timeout=60.0,
    )


# ----------------------------------------------------------------------------------------- request


def test_a_request_holds_what_it_was_given_and_defaults_to_http11_keep_alive():
    conn = RecordingConnection()
    req = HttpRequest("POST", "/v1/chat/completions", "a=1", {"host": "x"}, b"{}", conn)
    assert (req.method, req.path, req.query, req.headers, req.body) == (
        "POST",
        "/v1/chat/completions",
        "a=1",
        {"host": "x"},
        b"{}",
    )
    assert req.connection is conn
    assert req.keep_alive is True and req.http10 is False
    explicit = HttpRequest("GET", "/", "", {}, b"", conn, keep_alive=False, http10=True)
    assert explicit.keep_alive is False and explicit.http10 is True


async def test_read_returns_the_body_and_an_empty_body_is_a_body():
    conn = RecordingConnection()
    assert await HttpRequest("POST", "/", "", {}, b"abc", conn).read() == b"abc"
    assert await HttpRequest("POST", "/", "", {}, b"", conn).read() == b""


async def test_read_of_a_body_over_the_limit_raises_body_too_large():
    with pytest.raises(BodyTooLarge):
        await HttpRequest("POST", "/", "", {}, None, RecordingConnection()).read()


# ------------------------------------------------------------------------------------ whole replies


def test_a_response_defaults_to_an_empty_200_without_headers():
    out = Response()
    assert (out.status, out.body, out.headers) == (200, b"", {})
    assert Response().headers is not out.headers  # each reply its own header dict


def test_a_response_keeps_its_body_status_and_headers():
    out = Response(b"gone", 410, {"X-A": "1"})
    assert (out.status, out.body, out.headers) == (410, b"gone", {"X-A": "1"})


def test_content_type_is_a_content_type_header_and_wins_over_one_in_headers():
    assert Response(b"{}", content_type="application/json").headers == {"Content-Type": "application/json"}
    out = Response(headers={"X-A": "1", "Content-Type": "text/plain"}, content_type="text/html")
    assert out.headers == {"X-A": "1", "Content-Type": "text/html"}
    assert Response(content_type="").headers == {"Content-Type": ""}  # given, even empty
    assert Response(headers={"X-A": "1"}, content_type=None).headers == {"X-A": "1"}


def test_error_response_is_an_openai_style_json_error():
    out = error_response(413, "request body exceeds 64 bytes")
    assert out.status == 413
    assert out.headers == {"Content-Type": "application/json"}
    assert out.body == (
        b'{"error":{"message":"request body exceeds 64 bytes","type":"invalid_request_error","param":null,"code":413}}'
    )
    assert orjson.loads(error_response(502, "decode failed").body)["error"]["code"] == 502


# ------------------------------------------------------------------------------------- status line


def test_render_head_is_the_status_line_and_each_header_in_order():
    head = render_head(200, {"Content-Type": "text/plain", "X-Request-Id": "r-1"})
    assert head == b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Request-Id: r-1\r\n"


def test_render_head_without_headers_is_the_status_line_alone():
    assert render_head(204, {}) == b"HTTP/1.1 204 No Content\r\n"


@pytest.mark.parametrize(
    ("status", "line"),
    [
        (404, b"HTTP/1.1 404 Not Found\r\n"),
        (502, b"HTTP/1.1 502 Bad Gateway\r\n"),
        (100, b"HTTP/1.1 100 Continue\r\n"),
        (599, b"HTTP/1.1 599 Unknown\r\n"),  # no phrase registered
        (299, b"HTTP/1.1 299 Unknown\r\n"),
    ],
)
def test_render_head_reason_phrases(status, line):
    assert render_head(status, {}) == line


def test_render_head_writes_values_as_latin1():
    assert render_head(200, {"X-Name": "caf\u00e9"}) == b"HTTP/1.1 200 OK\r\nX-Name: caf\xe9\r\n"


def test_render_head_refuses_a_value_outside_latin1():
    # a ValueError too: the server answers a reply it cannot write with a 500
    with pytest.raises(UnicodeEncodeError):
        render_head(200, {"X-Name": "\u20ac"})


@pytest.mark.parametrize(
    "headers",
    [
        {"X-A": "1", "X-B": "2\r\nSet-Cookie: x=1"},  # a whole injected field
        {"X-A": "2\nX-B: 3"},  # LF alone
        {"X-A": "2\rX-B: 3"},  # CR alone
        {"X-A\r\nX-B": "1"},  # in a name
        {"X-A": "1", "X-B": "\r"},  # CR alone, with another field beside it
        {"X-A": "\n", "X-B": "1"},  # LF alone, with another field beside it
    ],
)
def test_render_head_refuses_cr_or_lf_in_a_header(headers):
    with pytest.raises(ValueError, match=r"^CR or LF in a response header$"):
        render_head(200, headers)


# ---------------------------------------------------------------------------------- streamed replies


def test_a_stream_defaults_to_200_without_headers_and_is_not_prepared():
    out = StreamResponse()
    assert (out.status, out.headers, out.prepared) == (200, {}, False)
    assert StreamResponse().headers is not out.headers
    given = StreamResponse(201, {"X-A": "1"})
    assert (given.status, given.headers) == (201, {"X-A": "1"})


async def test_an_http11_stream_is_chunked_and_keeps_the_connection():
    conn = RecordingConnection()
    req = request(conn)
    out = StreamResponse(headers={"Content-Type": "text/event-stream"})
    await out.prepare(req)
    assert out.prepared and req.keep_alive is True
    assert conn.calls == ["begin_stream", "last_reply", "send"]
    assert conn.sent == [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"]


async def test_the_head_carries_the_streams_status_and_headers():
    conn = RecordingConnection()
    await StreamResponse(201, {"X-A": "1", "X-B": "2"}).prepare(request(conn))
    assert conn.sent == [b"HTTP/1.1 201 Created\r\nX-A: 1\r\nX-B: 2\r\nTransfer-Encoding: chunked\r\n\r\n"]


@pytest.mark.parametrize(
    ("last", "keep_alive"), [(True, True), (False, False)], ids=["the connection's last reply", "asked to close"]
)
async def test_an_http11_stream_that_ends_its_connection_says_so(last, keep_alive):
    conn = RecordingConnection(last=last)
    req = request(conn, keep_alive=keep_alive)
    await StreamResponse().prepare(req)
    assert req.keep_alive is False
    assert conn.sent == [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"]


async def test_an_http10_stream_runs_until_close_without_asking_for_the_last_reply():
    conn = RecordingConnection()
    req = request(conn, http10=True)
    await StreamResponse().prepare(req)
    assert req.keep_alive is False
    assert conn.calls == ["begin_stream", "send"]  # closes anyway: whether it is the last reply does not matter
    assert conn.sent == [b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"]


async def test_chunks_are_framed_with_their_size_in_lower_case_hex():
    out, conn = await prepared()
    await out.write(b"data: 1\n\n")
    await out.write(b"z" * 26)
    await out.write(b"y" * 256)
    assert conn.sent == [b"9\r\ndata: 1\n\n\r\n", b"1a\r\n" + b"z" * 26 + b"\r\n", b"100\r\n" + b"y" * 256 + b"\r\n"]
    assert conn.calls == ["send", "send", "send"]  # the buffer never filled: no wait


async def test_an_http10_stream_writes_data_as_it_is():
    out, conn = await prepared(http10=True)
    await out.write(b"data: 1\n\n")
    assert conn.sent == [b"data: 1\n\n"]


async def test_writing_nothing_sends_nothing_not_even_an_end_chunk():
    out, conn = await prepared()
    await out.write(b"")
    assert conn.calls == []
    await StreamResponse().write(b"")  # nor needs a prepared stream


async def test_writing_before_prepare_is_an_error():
    with pytest.raises(RuntimeError, match=r"^StreamResponse\.write before prepare$"):
        await StreamResponse().write(b"x")


async def test_writing_to_a_client_that_left_raises_and_sends_nothing():
    out, conn = await prepared(closed=True)
    with pytest.raises(ConnectionResetError, match=r"^client closed the connection$"):
        await out.write(b"x")
    assert conn.calls == []


async def test_a_write_into_a_full_buffer_waits_for_it_to_drain():
    out, conn = await prepared(full=True)
    await out.write(b"x")
    assert conn.calls == ["send", "wait_drained"]  # queued first, then held until the client reads
    assert conn.sent == [b"1\r\nx\r\n"]


async def test_a_client_that_stopped_reading_fails_the_write():
    out, conn = await prepared(full=True)
    conn.reset_on_drain = True
    with pytest.raises(ConnectionResetError, match="client stopped reading"):
        await out.write(b"x")


async def test_the_end_of_a_chunked_stream_is_the_last_chunk_sent_once():
    out, conn = await prepared()
    await out.write_eof()
    await out.write_eof()
    assert conn.sent == [b"0\r\n\r\n"]


async def test_an_http10_stream_ends_without_a_last_chunk():
    out, conn = await prepared(http10=True)
    await out.write_eof()
    assert conn.calls == []


async def test_ending_a_stream_to_a_client_that_left_sends_nothing():
    out, conn = await prepared(closed=True)
    await out.write_eof()
    assert conn.calls == []


async def test_ending_a_stream_never_prepared_sends_nothing():
    out = StreamResponse()
    await out.write_eof()
    assert not out.prepared
