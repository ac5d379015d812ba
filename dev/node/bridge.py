"""The only path between this machine's network namespace and a real node's (``dev/node/real_node.py``).

The node lives in a network namespace of its own, with no interface, route or iptables rule in the
machine's namespace, so the API server (on this machine's loopback) and the node cannot reach each
other directly. This process holds a socket on each side:

- a TCP listener inside the node namespace on the API server's port: the kubelet, kube-proxy and
  every pod (through the ``kubernetes`` Service) reach the API server through it;
- a Unix socket speaking HTTP CONNECT: the API server's egress selector (``cluster`` egress) dials
  kubelets through it, so ``kubectl logs``, ``exec`` and ``port-forward`` work; a CONNECT dials from
  inside the node namespace.

    python -m dev.node.bridge --netns /proc/PID/ns/net --api-port PORT --connect-socket PATH

A socket belongs to the network namespace its creating thread was in when it was made; the process
switches (``setns``) only around the creation of its node-side sockets.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import socket
from collections.abc import Iterator

_CLONE_NEWNET = 0x40000000
_LIBC = ctypes.CDLL("libc.so.6", use_errno=True)


@contextlib.contextmanager
def _in_netns(target: int, home: int) -> Iterator[None]:
    if _LIBC.setns(target, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns into the node's network namespace: {os.strerror(err)}")
    try:
        yield
    finally:
        if _LIBC.setns(home, _CLONE_NEWNET) != 0:  # pragma: no cover - would leave the process confused
            os._exit(70)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.close()


async def _splice(
    a: tuple[asyncio.StreamReader, asyncio.StreamWriter], b: tuple[asyncio.StreamReader, asyncio.StreamWriter]
) -> None:
    await asyncio.gather(_pipe(a[0], b[1]), _pipe(b[0], a[1]))


class Bridge:
    def __init__(self, netns: str, api_port: int, connect_socket: str):
        self.node_ns = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
        self.home_ns = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        self.api_port = api_port
        self.connect_socket = connect_socket

    def node_socket(self) -> socket.socket:
        with _in_netns(self.node_ns, self.home_ns):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        return sock

    async def to_apiserver(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream = await asyncio.open_connection("127.0.0.1", self.api_port)
        except OSError:
            writer.close()
            return
        await _splice((reader, writer), upstream)

    async def connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One HTTP CONNECT from the API server: dial the target from inside the node namespace."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            host, _, port = target.rpartition(":")
            if method != "CONNECT" or not port.isdigit():
                raise ValueError(target)
            sock = self.node_socket()
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, (host.strip("[]"), int(port))), 10)
            upstream = await asyncio.open_connection(sock=sock)
        except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError) as exc:
            with contextlib.suppress(OSError, RuntimeError):
                writer.write(f"HTTP/1.1 502 Bad Gateway\r\n\r\n{exc}\r\n".encode())
                await writer.drain()
                writer.close()
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await _splice((reader, writer), upstream)

    async def serve(self) -> None:
        listener = self.node_socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("0.0.0.0", self.api_port))
        listener.listen(256)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.connect_socket)
        api = await asyncio.start_server(self.to_apiserver, sock=listener)
        egress = await asyncio.start_unix_server(self.connect, path=self.connect_socket)
        print("ready", flush=True)
        async with api, egress:
            await asyncio.gather(api.serve_forever(), egress.serve_forever())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dev.node.bridge", description=__doc__.split("\n\n")[0])
    parser.add_argument("--netns", required=True, help="the node's network namespace, e.g. /proc/PID/ns/net")
    parser.add_argument("--api-port", type=int, required=True, help="the API server's port on this machine's loopback")
    parser.add_argument("--connect-socket", required=True, help="Unix socket for the API server's HTTP CONNECT egress")
    args = parser.parse_args(argv)
    asyncio.run(Bridge(args.netns, args.api_port, args.connect_socket).serve())


if __name__ == "__main__":
    main()
