"""A backend that writes bytes as a test scripted them: the HTTP replies a well-behaved server would never
make (no content type, a body shorter than its length) or no reply at all."""

from __future__ import annotations

import asyncio
import contextlib
import re


class RawBackend:
    """A backend that answers every request with `reply`'s bytes as they are (no header added),
    or holds it without a word while `reply` is None."""

    def __init__(self, reply: bytes | None) -> None:
        self.reply = reply
        self.server: asyncio.Server | None = None
        self.done = asyncio.Event()
        self.writers: list[asyncio.StreamWriter] = []

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
        await reader.readexactly(int(length[1]) if length else 0)  # all of it read: closing resets nothing
        if self.reply is None:
            await self.done.wait()
        else:
            writer.write(self.reply)
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
