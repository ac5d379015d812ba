"""The router as an attacker meets it: the real `epd-router` process (python -m
epd_operator.router.main) in front of fake vLLM backends on 127.0.0.1, driven with raw sockets.

One row per attack: what is sent, and the status (or behaviour) expected. After every row the
router must still answer /livez; the memory rows check that its RSS comes back to where it was.
A bounded hypothesis pass throws malformed heads at the request parser of the same process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import threading
import time

import httptools
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dev.ports import free_port
from tests.support.fake_vllm import FakeVLLM
from tests.support.router_stack import router_argv

MAX_BODY = 1 << 20
CHAT = b"/v1/chat/completions"
BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
IMG = {"type": "image_url", "image_url": {"url": "https://img.example/a.png"}}


# ---- the stack: fake backends in a thread, the router as its own process ------------------------


class Backends:
    """An encoder and a PD fake on their own event loop, so the test can read what they received."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.encoder = FakeVLLM("encoder", "e0")
        self.pd = FakeVLLM("pd", "d0")
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        for fake in (self.encoder, self.pd):
            asyncio.run_coroutine_threadsafe(fake.start(), self.loop).result(10)

    def close(self) -> None:
        for fake in (self.encoder, self.pd):
            asyncio.run_coroutine_threadsafe(fake.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class RouterProcess:
    def __init__(self, backends: Backends) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                *router_argv(self.port),
                "--encode-servers-urls",
                backends.encoder.url,
                "--decode-servers-urls",
                backends.pd.url,
                "--health-interval",
                "0",
                "--max-body-bytes",
                str(MAX_BODY),
                "--reuse-ttl",
                "60",
                "--header-timeout",
                "1",
                "--body-timeout",
                "1",
                "--send-timeout",
                "3",
                "--log-level",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                if self.alive():
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                _, stderr = self.proc.communicate()  # closes the pipe
                raise RuntimeError(f"router did not start: {stderr.decode()[-2000:]}")
            time.sleep(0.1)

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def request(self, data: bytes, *, wait: float = 10.0) -> bytes:
        """Send `data`, half-close nothing, read until the router closes or `wait` passes quietly."""
        with self.connect() as s:
            # Refused before the whole request was sent: the reply is still there to read.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                s.sendall(data)
            return read_all(s, wait)

    def rss(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def alive(self) -> bool:
        """The event loop answers on a fresh connection."""
        return status_of(self.request(b"GET /livez HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n")) == [200]

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            return -9
        finally:
            if self.proc.stderr is not None:
                self.proc.stderr.close()


def read_all(s: socket.socket, wait: float) -> bytes:
    s.settimeout(wait)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except TimeoutError:
        pass
    except ConnectionResetError:
        pass
    return out


class _Replies:
    def __init__(self) -> None:
        self.statuses: list[int] = []
        self.heads: list[dict] = []
        self.headers: dict = {}
        self.parser: httptools.HttpResponseParser | None = None

    def on_header(self, name, value):
        self.headers[name.decode().lower()] = value

    def on_headers_complete(self):
        assert self.parser is not None
        self.statuses.append(self.parser.get_status_code())
        self.heads.append(self.headers)
        self.headers = {}


def replies(raw: bytes) -> _Replies:
    """Every complete reply head in `raw` (the router's own replies are always well-formed)."""
    r = _Replies()
    r.parser = parser = httptools.HttpResponseParser(r)
    parser.feed_data(raw)
    return r


def status_of(raw: bytes) -> list[int]:
    return replies(raw).statuses


@pytest.fixture(scope="module")
def stack():
    backends = Backends()
    router = RouterProcess(backends)
    try:
        yield router, backends
    finally:
        code = router.stop()
        backends.close()
    assert code == 0, "the router must stop on SIGTERM, attacked or not"


@pytest.fixture
def router(stack):
    router, _ = stack
    yield router
    assert router.proc.poll() is None and router.alive(), "the router must stay responsive"


def post(body: bytes = BODY, extra: bytes = b"", path: bytes = CHAT) -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        path,
        len(body),
        extra,
        body,
    )


def chunked(*chunks: bytes, head_extra: bytes = b"") -> bytes:
    return b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\n%sTransfer-Encoding: chunked\r\n\r\n%s" % (
        head_extra,
        b"".join(chunks),
    )


# ---- the table: one row per attack -----------------------------------------------------------------

SMUGGLED = post(b"{}")  # a whole request hidden in a body
CL = b"Content-Length: %d\r\n"

# (name, bytes sent, expected status of the only reply; the connection is then closed)
FRAMING = [
    ("negative chunk size (a parser that accepts it can loop forever)", chunked(b"-6\r\nabc\r\n0\r\n\r\n"), 400),
    ("chunk size with 0x", chunked(b"0x3\r\nabc\r\n0\r\n\r\n"), 400),
    ("chunk size with underscore", chunked(b"1_0\r\n" + b"a" * 16 + b"\r\n0\r\n\r\n"), 400),
    ("chunk size with sign", chunked(b"+3\r\nabc\r\n0\r\n\r\n"), 400),
    ("chunk data without CRLF", chunked(b"3\r\nabcXX0\r\n\r\n"), 400),
    (
        "Content-Length with Transfer-Encoding (CL.TE)",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        + SMUGGLED,
        400,
    ),
    (
        "Transfer-Encoding with Content-Length (TE.CL)",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        400,
    ),
    ("duplicate Content-Length, same value", post(BODY, CL % len(BODY)), 400),
    ("duplicate Content-Length, other value", post(BODY, CL % (len(BODY) - 2)), 400),
    ("Content-Length list", b"POST / HTTP/1.1\r\nHost: r\r\nContent-Length: 2, 2\r\n\r\n{}", 400),
    ("duplicate Transfer-Encoding", chunked(b"0\r\n\r\n", head_extra=b"Transfer-Encoding: chunked\r\n"), 400),
    (
        "xchunked (a coding not understood)",
        b"POST / HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
        501,
    ),
    (
        "chunked, identity (chunked not final)",
        b"POST / HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
        400,
    ),
    (
        "gzip, chunked (coding not understood)",
        b"POST / HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
        501,
    ),
    (
        "Transfer-Encoding with a space before the colon",
        b"POST / HTTP/1.1\r\nHost: r\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
        400,
    ),
    ("Transfer-Encoding in HTTP/1.0", b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    ("Content-Length with sign", b"POST / HTTP/1.1\r\nHost: r\r\nContent-Length: +2\r\n\r\n{}", 400),
    ("negative Content-Length", b"POST / HTTP/1.1\r\nHost: r\r\nContent-Length: -2\r\n\r\n{}", 400),
    ("Content-Length with 0x", b"POST / HTTP/1.1\r\nHost: r\r\nContent-Length: 0x2\r\n\r\n{}", 400),
    ("Content-Length with underscore", b"POST / HTTP/1.1\r\nHost: r\r\nContent-Length: 1_0\r\n\r\n0123456789", 400),
    (
        "Content-Length overflow",
        b"POST / HTTP/1.1\r\nHost: r\r\nContent-Length: 99999999999999999999999\r\n\r\n{}",
        400,
    ),
    ("obs-fold", b"GET /livez HTTP/1.1\r\nHost: r\r\nX-A: a\r\n b\r\n\r\n", 400),
    ("bare LF line endings (refused at once, not waited on)", b"GET /livez HTTP/1.1\nHost: r\n\n", 400),
    (
        "bare LF in X-Request-Id (response splitting)",
        b"GET /livez HTTP/1.1\r\nHost: r\r\nX-Request-Id: a\nSet-Cookie: x=1\r\n\r\n",
        400,
    ),
    ("bare CR in a header value", b"GET /livez HTTP/1.1\r\nHost: r\r\nX-Request-Id: a\rSet-Cookie: x=1\r\n\r\n", 400),
    ("NUL in a header value", b"GET /livez HTTP/1.1\r\nHost: r\r\nX-A: a\x00b\r\n\r\n", 400),
    ("control character in a header value", b"GET /livez HTTP/1.1\r\nHost: r\r\nX-A: a\x1bb\r\n\r\n", 400),
    ("control character in the target", b"GET /li\x01vez HTTP/1.1\r\nHost: r\r\n\r\n", 400),
    ("tab in the target", b"GET /li\tvez HTTP/1.1\r\nHost: r\r\n\r\n", 400),
    ("HTTP/1.9", b"GET /livez HTTP/1.9\r\nHost: r\r\n\r\n", 400),
    ("HTTP/2.0 over HTTP/1 framing", b"GET /livez HTTP/2.0\r\nHost: r\r\n\r\n", 505),
    ("HTTP/0.9 version", b"GET /livez HTTP/0.9\r\nHost: r\r\n\r\n", 505),
    ("no Host in HTTP/1.1", b"GET /livez HTTP/1.1\r\n\r\n", 400),
    ("two Host fields", b"GET /livez HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
    ("two X-Request-Id fields", b"GET /livez HTTP/1.1\r\nHost: r\r\nX-Request-Id: a\r\nX-Request-Id: b\r\n\r\n", 400),
    ("space in a header name", b"GET /livez HTTP/1.1\r\nHost: r\r\nX A: b\r\n\r\n", 400),
    ("header line without a colon", b"GET /livez HTTP/1.1\r\nHost: r\r\nXA\r\n\r\n", 400),
    ("whitespace before the first header", b"GET /livez HTTP/1.1\r\n Host: r\r\n\r\n", 400),
    ("lower-case method", b"get /livez HTTP/1.1\r\nHost: r\r\n\r\n", 400),
    ("CONNECT tunnel", b"CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: 127.0.0.1:22\r\n\r\n", 405),
    (
        "101 header fields",
        b"GET /livez HTTP/1.1\r\nHost: r\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(101)) + b"\r\n",
        431,
    ),
    ("one header field of 9 KiB", b"GET /livez HTTP/1.1\r\nHost: r\r\nX-A: " + b"a" * 9000 + b"\r\n\r\n", 431),
    (
        "head over 64 KiB",
        b"GET /livez HTTP/1.1\r\nHost: r\r\n"
        + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 8000) for i in range(9))
        + b"\r\n",
        431,
    ),
    ("target of 9 KiB", b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: r\r\n\r\n", 414),
    (
        "body over the limit, announced",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1),
        413,
    ),
    (
        "body over the limit, chunked",
        chunked(b"%x\r\n" % (MAX_BODY + 1) + b"x" * (MAX_BODY + 1) + b"\r\n0\r\n\r\n"),
        413,
    ),
    ("x-request-id with a space", post(BODY, b"X-Request-Id: a b\r\nConnection: close\r\n"), 400),
    ("x-request-id with obs-text", post(BODY, b"X-Request-Id: a\xffb\r\nConnection: close\r\n"), 400),
]


@pytest.mark.parametrize("name, data, status", FRAMING, ids=[row[0] for row in FRAMING])
def test_framing_attacks_get_a_clear_refusal_and_a_closed_connection(stack, router, name, data, status):
    _, backends = stack
    before = len(backends.pd.received)
    raw = router.request(data)
    got = replies(raw)
    assert got.statuses == [status], raw[:300]
    assert got.heads[0].get("connection") == b"close"
    assert len(backends.pd.received) == before, "nothing of a refused request reaches a backend"


def test_a_request_smuggled_in_a_cl_te_body_is_never_answered(router):
    raw = router.request(
        b"POST /livez HTTP/1.1\r\nHost: r\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        b"GET /livez HTTP/1.1\r\nHost: r\r\n\r\n"
    )
    assert status_of(raw) == [400] and raw.count(b"HTTP/1.1") == 1


def test_a_crlf_injected_request_id_never_reaches_a_reply_head_or_a_backend(stack, router):
    _, backends = stack
    before = len(backends.pd.received)
    for rid in (b"a\nInjected: 1", b"a\rInjected: 1", b"a\r \nInjected: 1"):
        raw = router.request(post(BODY, b"X-Request-Id: " + rid + b"\r\nConnection: close\r\n"))
        assert b"Injected" not in raw
    assert len(backends.pd.received) == before


def test_only_allow_listed_headers_reach_a_backend_and_hop_by_hop_ones_never_do(stack, router):
    _, backends = stack
    raw = router.request(
        post(
            BODY,
            b"Connection: keep-alive, X-Secret\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\n"
            b"Proxy-Authorization: Basic eA==\r\nUpgrade: h2c\r\nX-Secret: s\r\nCookie: c=1\r\n"
            b"Authorization: Bearer t\r\nX-Request-Id: hop-1\r\nConnection: close\r\n",
        )
    )
    got = replies(raw)
    assert got.statuses == [200]
    seen = backends.pd.received[-1].headers
    assert {name.lower() for name in seen} <= {
        "host",
        "content-length",
        "content-type",
        "accept-encoding",
        "authorization",
        "x-request-id",
    }
    assert seen["Authorization"] == "Bearer t" and seen["x-request-id"] == "hop-1"
    # Replies carry the router's own headers only: framing, Content-Type, x-request-id.
    assert set(got.heads[0]) <= {
        "content-type",
        "x-request-id",
        "content-length",
        "connection",
        "transfer-encoding",
        "cache-control",
    }


def test_pipelining_far_ahead_is_answered_in_order_then_cut(router):
    raw = router.request(b"GET /livez HTTP/1.1\r\nHost: r\r\n\r\n" * 60)
    statuses = status_of(raw)
    assert statuses[-1] == 429 and set(statuses[:-1]) == {200} and len(statuses) < 60


def test_an_upgrade_request_is_answered_and_the_connection_closed(router):
    raw = router.request(
        b"GET /livez HTTP/1.1\r\nHost: r\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\nPRI * HTTP/2.0\r\n\r\n"
    )
    got = replies(raw)
    assert got.statuses == [200] and got.heads[0]["connection"] == b"close"


# ---- timeouts ----------------------------------------------------------------------------------------


def test_a_head_that_never_ends_times_out_with_408(router):
    with router.connect() as s:
        s.sendall(b"GET /livez HTTP/1.1\r\nHost: r\r\n")
        for _ in range(3):  # keeps trickling, each byte well inside any idle limit
            time.sleep(0.4)
            s.sendall(b"X")
        raw = read_all(s, 5)
    assert status_of(raw) == [408]


def test_a_body_that_stops_arriving_times_out_with_408(router):
    with router.connect() as s:
        s.sendall(b'POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 100\r\n\r\n{"a":')
        raw = read_all(s, 5)
    assert status_of(raw) == [408]


# ---- trust boundary -------------------------------------------------------------------------------


def chat(*parts, **extra) -> bytes:
    return orjson.dumps(
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, *parts]}], **extra}
    )


@pytest.mark.parametrize(
    "body, fragment",
    [
        (chat(kv_transfer_params={"do_remote_prefill": True, "remote_host": "10.0.0.66"}), b"kv_transfer_params"),
        (chat(ec_transfer_params={"deadbeef": {"metadata": {"image_grid_thw": [1, 2, 2]}}}), b"ec_transfer_params"),
        (
            chat({"type": "image_embeds", "image_embeds": {"image_grid_thw": [1, 16, 16]}, "uuid": "victim"}),
            b"image_embeds",
        ),
        (chat({"type": "audio_embeds", "audio_embeds": {"audio_num_tokens": [50]}}), b"audio_embeds"),
        (orjson.dumps({"model": "m", "prompt": "x", "prompt_embeds": "AAAA"}), b"prompt_embeds"),
    ],
    ids=["kv_transfer_params", "ec_transfer_params", "image_embeds", "audio_embeds", "prompt_embeds"],
)
def test_router_only_fields_and_client_embeds_are_refused(stack, router, body, fragment):
    _, backends = stack
    before = (len(backends.pd.received), len(backends.encoder.received))
    path = b"/v1/completions" if b'"prompt"' in body else CHAT
    raw = router.request(post(body, b"Connection: close\r\n", path))
    assert status_of(raw) == [400] and fragment in raw
    assert (len(backends.pd.received), len(backends.encoder.received)) == before


def test_a_client_uuid_never_names_the_media_sent_to_encoders_or_consumers(stack, router):
    _, backends = stack
    raw = router.request(post(chat({**IMG, "uuid": "victims-image-uuid"}), b"Connection: close\r\n"))
    assert status_of(raw) == [200]
    sent = [orjson.dumps(r.body) for r in (backends.encoder.received[-1], backends.pd.received[-1])]
    assert all(b"victims-image-uuid" not in body for body in sent)


def test_a_url_is_not_taken_for_its_content_unless_declared_immutable(stack, router):
    _, backends = stack
    url = {"type": "image_url", "image_url": {"url": "https://img.example/changes.png"}}
    data = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    before = len(backends.encoder.received)
    for part in (url, url, data, data):
        assert status_of(router.request(post(chat(part), b"Connection: close\r\n"))) == [200]
    # The URL was encoded both times (its content may have changed); the data: URL, once.
    assert len(backends.encoder.received) - before == 3


# ---- resources: a client that never reads, a body in tiny chunks --------------------------------


def settle_rss(router: RouterProcess) -> int:
    time.sleep(0.5)
    return router.rss()


def test_pipelined_requests_from_a_client_that_never_reads_do_not_grow_memory(router):
    for _ in range(3):
        router.alive()
    baseline = settle_rss(router)
    batch = b"GET /metrics HTTP/1.1\r\nHost: r\r\n\r\n" * 16 + post(BODY) * 8
    attackers: list[socket.socket] = []
    sent = stalls = cuts = 0
    # At least 4 s and 2 MiB of attack (a loaded machine sends slower), at most 30 s or 64 MiB.
    start = time.monotonic()
    while (time.monotonic() - start < 4 or sent < 2 * 2**20) and time.monotonic() - start < 30 and sent < 64 * 2**20:
        while len(attackers) < 4:
            s = router.connect()
            s.setblocking(False)
            attackers.append(s)
        for s in list(attackers):
            try:
                sent += s.send(batch)
            except BlockingIOError:
                stalls += 1  # the router stopped reading: its buffers are full, ours fill next
            except (BrokenPipeError, ConnectionResetError):
                cuts += 1  # too far ahead (429) or not reading for --send-timeout: cut
                attackers.remove(s)
                s.close()
        time.sleep(0.002)
    peak = router.rss()
    assert router.alive(), "other clients are served while the attack runs"
    for s in attackers:
        s.close()
    time.sleep(4)  # past --send-timeout: whatever the router still held for them is gone
    after = settle_rss(router)
    assert sent > 2**20, "the attack sent at least 1 MiB of pipelined requests"
    assert stalls or cuts, "the router pushed back on a client that never reads"
    assert peak - baseline < 48 * 2**20, f"RSS grew by {(peak - baseline) >> 20} MiB"
    assert after - baseline < 24 * 2**20, f"RSS stayed {(after - baseline) >> 20} MiB above its baseline"


def test_a_body_in_tiny_chunks_is_parsed_as_it_arrives_while_others_are_served(stack, router):
    _, backends = stack
    text = b"y" * 300_000
    body = b'{"model":"m","messages":[{"role":"user","content":"' + text + b'"}]}'
    pieces = [
        b"7\r\n" + body[i : i + 7] + b"\r\n"
        if len(body[i : i + 7]) == 7
        else b"%x\r\n%s\r\n" % (len(body[i : i + 7]), body[i : i + 7])
        for i in range(0, len(body), 7)
    ]
    baseline = settle_rss(router)
    with router.connect() as s:
        s.sendall(chunked(b"".join(pieces[: len(pieces) // 2]), head_extra=b"Connection: close\r\n"))
        assert router.alive(), "a half-sent chunked upload does not hold up other clients"
        s.sendall(b"".join(pieces[len(pieces) // 2 :]) + b"0\r\n\r\n")
        raw = read_all(s, 15)
    assert status_of(raw) == [200]
    assert backends.pd.received[-1].body["messages"][0]["content"] == text.decode()
    assert settle_rss(router) - baseline < 24 * 2**20


# ---- fuzz: malformed heads at the real parser ---------------------------------------------------------

_TOKENS = st.sampled_from(
    [
        b"GET",
        b"POST",
        b" ",
        b"/livez",
        b"/v1/chat/completions",
        b"HTTP/1.1",
        b"HTTP/1.0",
        b"HTTP/1.9",
        b"\r\n",
        b"\n",
        b"\r",
        b"Host: r",
        b"Content-Length: 2",
        b"Content-Length: -1",
        b"Content-Length: 0x2",
        b"Transfer-Encoding: chunked",
        b"Transfer-Encoding: xchunked",
        b"X-Request-Id: a",
        b":",
        b"\t",
        b"\x00",
        b"\x7f",
        b"\xff",
        b"{}",
        b"0\r\n\r\n",
        b"-6\r\n",
        b"ffffffffffffffffff\r\n",
        b"Expect: 100-continue",
        b"Connection: close",
        b" x",
    ]
)


@settings(
    max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(pieces=st.lists(st.one_of(_TOKENS, st.binary(max_size=8)), min_size=1, max_size=24))
def test_fuzzed_heads_get_a_well_formed_reply_or_a_close_and_never_wedge_the_router(stack, pieces):
    router, _backends = stack
    data = b"".join(pieces) + b"\r\n\r\n"
    with router.connect() as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)  # then EOF: whatever the router makes of it, it answers or closes
        except (BrokenPipeError, ConnectionResetError):
            pass
        raw = read_all(s, 5)
    if raw:
        assert raw.startswith(b"HTTP/1.1 "), raw[:100]
        statuses = replies(raw).statuses  # parses: every reply head is well-formed
        assert statuses and all(100 <= code < 600 for code in statuses)
        assert b"\r\n\r\n" in raw
    assert router.proc.poll() is None


def test_the_router_is_responsive_after_the_fuzz_pass(router):
    assert router.alive()
    assert os.path.exists(f"/proc/{router.proc.pid}")
