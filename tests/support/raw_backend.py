"""A backend that writes bytes as a test scripted them: the HTTP replies a well-behaved server would never
make (no content type, a body shorter than its length) or no reply at all."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import Iterator


class RawBackend:
    """A backend that answers every request with `reply`'s bytes as they are (no header added),
    or holds it without a word while `reply` is None."""

    def __init__(self, reply: bytes | None, hold: bool = False) -> None:
        self.reply = reply
        self.hold = hold  # after the reply, keep the connection open without a word (a body that stalls)
        self.server: asyncio.Server | None = None
        self.done = asyncio.Event()
        self.writers: list[asyncio.StreamWriter] = []

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
        await reader.readexactly(int(length[1]) if length else 0)  # all of it read: closing resets nothing
        if self.reply is not None:
            writer.write(self.reply)
        if self.reply is None or self.hold:
            await self.done.wait()
        writer.close()
        await writer.wait_closed()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc) -> None:
        assert self.server is not None
        self.done.set()
        self.server.close()
        for writer in self.writers:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        await self.server.wait_closed()


@contextlib.contextmanager
def unaccepted_listener() -> Iterator[str]:
    """The URL of a listener that accepts nothing and whose accept queue is full: Linux drops the SYN of
    every further connect, so it hangs as to an overloaded backend."""
    listener = socket.socket()
    fillers = [socket.socket() for _ in range(3)]
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        for filler in fillers:
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
        yield f"http://127.0.0.1:{port}"
    finally:
        for sock in (*fillers, listener):
            sock.close()
