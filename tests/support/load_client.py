"""Chat clients with images, in phases, for the autoscaling loop (tests/support/autoscale_loop.py).

    python -m tests.support.load_client URL RECORDS MODEL

It runs where URL answers (inside the real node's network namespace, where the router Service's
ClusterIP does) and reads phases from stdin, one per line: ``<name> <clients> <images> <pause>``
starts `clients` closed-loop clients, each sending a chat request with `images` images never sent
before and waiting `pause` seconds after each answer; ``stop`` (or the end of stdin) ends the run.
A new phase lets the previous phase's clients finish the request they are in, never cuts one off.
Every request is one JSON line in RECORDS: phase, start and end (Unix time), HTTP status (0 when no
answer came) and the error text when not 200.
"""

from __future__ import annotations

import itertools
import json
import struct
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from base64 import b64encode
from typing import Any

SIDE = 224  # 64 image tokens each, the tiny model's maximum (dev/local/client.py)
TIMEOUT = 300.0


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


class Images:
    """Distinct PNGs, cheaply: one picture whose first row carries the image's serial number."""

    def __init__(self) -> None:
        raw = bytearray()
        for y in range(SIDE):
            raw.append(0)
            for x in range(SIDE):
                raw += bytes(((x * 3 + y) % 256, (y * 5) % 256, (x * y) % 256))
        self.raw = raw
        self.serial = itertools.count(1)
        self.lock = threading.Lock()

    def next_url(self) -> str:
        with self.lock:
            n = next(self.serial)
        raw = bytearray(self.raw)
        raw[1:9] = struct.pack(">Q", n)
        header = struct.pack(">IIBBBBB", SIDE, SIDE, 8, 2, 0, 0, 0)
        png = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(bytes(raw), 1))
        return "data:image/png;base64," + b64encode(png + _chunk(b"IEND", b"")).decode()


class Run:
    def __init__(self, url: str, records: str, model: str) -> None:
        self.url = url.rstrip("/") + "/v1/chat/completions"
        self.model = model
        self.out = open(records, "a", buffering=1)  # noqa: SIM115 - closed by close()
        self.images = Images()
        self.write = threading.Lock()
        self.generation = 0
        self.threads: list[threading.Thread] = []

    def body(self, images: int) -> bytes:
        content: list[dict[str, Any]] = [{"type": "text", "text": "Describe the images."}]
        content += [{"type": "image_url", "image_url": {"url": self.images.next_url()}} for _ in range(images)]
        return json.dumps(
            {"model": self.model, "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": content}]}
        ).encode()

    def one(self, phase: str, images: int) -> None:
        body = self.body(images)
        started = time.time()
        status, error = 0, ""
        try:
            req = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=TIMEOUT) as reply:
                status = reply.status
                json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            status, error = exc.code, exc.read().decode(errors="replace")[:500]
        except Exception as exc:  # every failure is a record, never a crash
            error = f"{type(exc).__name__}: {exc}"[:500]
        record = {"phase": phase, "start": started, "end": time.time(), "status": status, "images": images}
        if error:
            record["error"] = error
        with self.write:
            self.out.write(json.dumps(record) + "\n")

    def client(self, generation: int, phase: str, images: int, pause: float) -> None:
        while self.generation == generation:
            self.one(phase, images)
            if pause:
                time.sleep(pause)

    def phase(self, name: str, clients: int, images: int, pause: float) -> None:
        self.generation += 1
        for _ in range(clients):
            thread = threading.Thread(target=self.client, args=(self.generation, name, images, pause), daemon=True)
            thread.start()
            self.threads.append(thread)

    def close(self) -> None:
        self.generation += 1
        for thread in self.threads:
            thread.join(TIMEOUT + 10)
        self.out.close()


def main() -> None:
    url, records, model = sys.argv[1:4]
    run = Run(url, records, model)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "stop":
            break
        name, clients, images, pause = words
        run.phase(name, int(clients), int(images), float(pause))
    run.close()


if __name__ == "__main__":
    main()
