"""Request bodies the router benchmarks send: OpenAI chat requests with image parts."""

from __future__ import annotations

from pathlib import Path

import orjson

MODEL = "bench"


def chat_request(image_ids: list[int], stream: bool, max_tokens: int = 16) -> dict:
    content: list[dict] = [
        {"type": "image_url", "image_url": {"url": f"https://images.example/bench/{i:06d}.jpg"}} for i in image_ids
    ]
    content.append({"type": "text", "text": "Describe the images in one sentence."})
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
    if stream:
        body["stream"] = True
    return body


def write_bodies(path: Path, images_per_request: int, stream: bool, distinct: int = 256) -> Path:
    """`distinct` bodies, each with its own images, so hashing pickers see a spread of keys."""
    lines = [
        orjson.dumps(chat_request([n * images_per_request + k for k in range(images_per_request)], stream))
        for n in range(distinct)
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path
