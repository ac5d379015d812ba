"""`closing_connections()` against a loopback TLS server that never answers a close_notify: the socket of a
connection aiohttp closed mid-answer stays open after its session is closed, and is closed when the ledger exits."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import aiohttp

from dev.cluster.pki import make_pki
from epd_operator.kube import closing_connections

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"


@contextlib.contextmanager
def silent_tls_server(pki: Path) -> Iterator[str]:
    """One TLS connection: the start of a streamed answer, then nothing is read or written until the end
    (like a watch whose server never reads the client's close_notify)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki / "apiserver.crt", pki / "apiserver.key")
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        conn, _ = listener.accept()
        tls = context.wrap_socket(conn, server_side=True)
        held.append(tls)
        request = b""
        while b"\r\n\r\n" not in request:
            request += tls.recv(4096)
        tls.sendall(ANSWER)
        done.wait(60)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{listener.getsockname()[1]}/watch"
    finally:
        done.set()
        thread.join(10)
        for sock in held:
            sock.close()
        listener.close()


async def test_a_connection_closed_mid_answer_is_closed_when_the_ledger_exits(tmp_path):
    make_pki(tmp_path)
    client_tls = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    loop = asyncio.get_running_loop()
    with silent_tls_server(tmp_path) as url:
        async with closing_connections():
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_tls)) as session:
                response = await session.get(url)
                assert await response.content.readexactly(5) == b"hello"
                assert response.connection is not None
                sock = response.connection.transport.get_extra_info("socket")  # type: ignore[union-attr]
                response.close()  # released mid-answer: aiohttp closes the connection, a TLS close handshake starts
            # The session is closed; the connection waits for the server's close_notify, which never comes.
            assert sock.fileno() != -1
        assert sock.fileno() == -1
    assert "create_connection" not in vars(loop)  # the loop's own method again
