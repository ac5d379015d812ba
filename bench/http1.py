"""Just enough HTTP/1.1 for the benchmark's own servers and the raw-asyncio floor.

Keep-alive, Content-Length and chunked bodies; no pipelining guarantees beyond answering
in order, no trailers, no 100-continue. Good for loopback traffic between known peers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


def response(status: bytes, content_type: bytes, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\ncontent-type: "
        + content_type
        + b"\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def take_request(buf: bytearray) -> Request | None:
    """The first complete request in `buf`, removed from it; None while incomplete."""
    head_end = buf.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    lines = bytes(buf[:head_end]).decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    start = head_end + 4
    if headers.get("transfer-encoding", "").lower() == "chunked":
        parsed = _dechunk(buf, start)
        if parsed is None:
            return None
        body, end = parsed
    else:
        end = start + int(headers.get("content-length", "0"))
        if len(buf) < end:
            return None
        body = bytes(buf[start:end])
    del buf[:end]
    return Request(method, path, headers, body)


def _dechunk(buf: bytearray, pos: int) -> tuple[bytes, int] | None:
    body = bytearray()
    while True:
        line_end = buf.find(b"\r\n", pos)
        if line_end < 0:
            return None
        size = int(bytes(buf[pos:line_end]).split(b";")[0], 16)
        pos = line_end + 2
        if size == 0:
            if len(buf) < pos + 2:
                return None
            return bytes(body), pos + 2
        if len(buf) < pos + size + 2:
            return None
        body += buf[pos : pos + size]
        pos += size + 2


class ResponseEnd:
    """Finds where one response ends in a byte stream fed piece by piece (the bytes
    themselves are relayed untouched): after Content-Length bytes, or after the last chunk."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.in_body = False
        self.remaining = 0  # body bytes (or chunk bytes + CRLF) still to come
        self.chunked = False
        self.last_chunk = False
        self.line = bytearray()  # a chunk-size line split across pieces
        self.status = 0

    def feed(self, data: bytes) -> int | None:
        """Feed bytes; returns how many of them belong to this response once it is complete."""
        pos = 0
        if not self.in_body:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return None
            head = bytes(self.head[:end]).decode("latin-1").lower()
            self.status = int(head[9:12])
            self.chunked = "transfer-encoding: chunked" in head
            if not self.chunked:
                for line in head.split("\r\n"):
                    if line.startswith("content-length:"):
                        self.remaining = int(line.split(":", 1)[1])
            self.in_body = True
            pos = len(data) - (len(self.head) - end - 4)
        n = len(data)
        while True:
            if self.remaining:
                take = min(self.remaining, n - pos)
                pos += take
                self.remaining -= take
                if self.remaining:
                    return None
            if not self.chunked or self.last_chunk:
                return pos
            line_end = data.find(b"\n", pos)  # LF, so a CRLF split across pieces is still found
            if line_end < 0:
                self.line += data[pos:]
                return None
            size = int((bytes(self.line) + data[pos:line_end]).rstrip(b"\r").split(b";")[0], 16)
            self.line.clear()
            pos = line_end + 1
            self.remaining = size + 2  # the chunk and its CRLF; the last chunk is followed by CRLF only
            self.last_chunk = size == 0
