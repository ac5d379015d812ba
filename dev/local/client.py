"""A small OpenAI-chat client for local runs: test images, chat requests, Prometheus metrics.

Standard library only, so `make demo` and the e2e tests need nothing beyond the package.
The tiny model's answers are random tokens: callers look at structure (token counts, which
tier did what), never at wording.
"""

from __future__ import annotations

import base64
import json
import struct
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# 224 x 224 pixels = 16 x 16 patches of 14 px, merged 2 x 2: 64 image tokens, the tiny model's maximum.
IMAGE_SIDE = 224


def png(width: int, height: int, seed: int) -> bytes:
    """A deterministic RGB PNG whose pixels depend on `seed` (distinct seeds -> distinct images)."""
    r0, g0, b0 = (seed * 97) % 256, (seed * 57 + 80) % 256, (seed * 31 + 160) % 256
    rows = []
    for y in range(height):
        row = bytearray(b"\x00")  # filter type: none
        for x in range(width):
            row += bytes(((r0 + x * (seed % 7 + 1)) % 256, (g0 + y * (seed % 5 + 1)) % 256, (b0 + x * y) % 256))
        rows.append(bytes(row))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"".join(rows)))
        + chunk(b"IEND", b"")
    )


def image_url(seed: int, side: int = IMAGE_SIDE) -> str:
    return "data:image/png;base64," + base64.b64encode(png(side, side, seed)).decode()


def image_part(seed: int, uuid: str | None = None) -> dict:
    part: dict[str, Any] = {"type": "image_url", "image_url": {"url": image_url(seed)}}
    if uuid is not None:
        part["uuid"] = uuid
    return part


def video_url(seed: int, frames: int = 4, side: int = 112) -> str:
    """A short video as vLLM takes one without a video decoder: its frames as base64 images in
    one `video/jpeg` data URL, comma-separated (vLLM reads each frame with PIL, which goes by
    the bytes, so PNG frames do). 112 px frames in pairs (Qwen2-VL's temporal patch): 4 frames
    are 2 x 4 x 4 patches after merging, 32 video tokens."""
    return "data:video/jpeg;base64," + ",".join(
        base64.b64encode(png(side, side, seed * 1000 + frame)).decode() for frame in range(frames)
    )


def video_part(seed: int, frames: int = 4) -> dict:
    return {"type": "video_url", "video_url": {"url": video_url(seed, frames)}}


def text_part(text: str) -> dict:
    return {"type": "text", "text": text}


def chat_body(model: str, content: list[dict] | str, max_tokens: int = 8, stream: bool = False) -> dict:
    """A greedy request that always produces `max_tokens` tokens and returns their ids."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,  # random weights would often stop at once
        "return_token_ids": True,  # the text of random tokens is often empty; the ids are not
        "stream": stream,
    }


@dataclass
class Reply:
    status: int
    body: Any  # parsed JSON, or the raw text when it is not JSON
    seconds: float
    chunks: list[dict] = field(default_factory=list)  # streamed replies: every `data:` event

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def completion_tokens(self) -> int:
        return self.body["usage"]["completion_tokens"]

    @property
    def token_ids(self) -> list[int]:
        return self.body["choices"][0]["token_ids"]

    def __str__(self) -> str:
        return f"HTTP {self.status} after {self.seconds:.2f} s: {str(self.body)[:600]}"


def post(url: str, body: dict, timeout: float = 120) -> Reply:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw, kind = response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as error:
        status, raw, kind = error.code, error.read(), error.headers.get("Content-Type", "")
    seconds = time.monotonic() - started
    text = raw.decode(errors="replace")
    if "text/event-stream" in kind:
        chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
        done = text.rstrip().endswith("data: [DONE]")
        return Reply(status, {"done": done}, seconds, chunks)
    try:
        return Reply(status, json.loads(text), seconds)
    except ValueError:
        return Reply(status, text, seconds)


def chat(base_url: str, body: dict, timeout: float = 120) -> Reply:
    return post(f"{base_url}/v1/chat/completions", body, timeout)


def metrics(base_url: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a Prometheus /metrics page as (name, labels, value), read by prometheus_client's parser."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]


def metric_sum(base_url: str, name: str, **labels: str) -> float:
    """The sum of `name` over all samples whose labels include `labels` (0 when absent)."""
    return sum(
        value
        for sample, sample_labels, value in metrics(base_url)
        if sample == name and all(sample_labels.get(k) == v for k, v in labels.items())
    )
