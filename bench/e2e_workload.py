"""The end-to-end benchmark's workload: chat requests whose images follow a Zipf popularity.

Images are drawn locally with PIL from a seed (no downloads): 224 x 224 JPEGs, which the tiny
Qwen2-VL turns into 64 image tokens each. A request carries 0, 1 or 2 distinct images (image
parts first, then a question that differs per request), streamed, greedy, a fixed number of
tokens. The sequence of catalogue indices, image counts and arrival gaps comes from one seed,
so every contender gets the same workload.

Each measured cell draws its pixels with its own `salt`: the same catalogue structure, but
images no earlier cell has sent. vLLM's caches (the shared encoder store, the processor
caches, PD's prefix cache) and the router's reuse cache therefore start cold in every cell,
whichever contender ran before: contenders can be interleaved without one warming the
caches for the next.

The no-repeat control has the same shape (image counts, text-only share, questions) but every
image is new, so neither reuse nor cache-aware picking can help.
"""

from __future__ import annotations

import base64
import io
import random
from dataclasses import dataclass
from functools import lru_cache

IMAGE_SIDE = 224  # 16 x 16 patches of 14 px, merged 2 x 2: 64 tokens, the tiny model's maximum
JPEG_QUALITY = 85


@dataclass(frozen=True)
class Mix:
    catalogue: int = 120  # images that can be drawn
    zipf_s: float = 1.1  # P(rank k) ∝ 1 / k^s
    # share of requests with 0 (text-only), 1 and 2 images
    images_per_request: tuple[tuple[int, float], ...] = ((0, 0.15), (1, 0.60), (2, 0.25))
    max_tokens: int = 16

    def describe(self) -> str:
        shares = ", ".join(
            f"{int(w * 100)}% with {n} image{'s' if n != 1 else ''}" for n, w in self.images_per_request if n
        )
        text_only = next((w for n, w in self.images_per_request if n == 0), 0.0)
        return (
            f"catalogue of {self.catalogue} images, Zipf exponent {self.zipf_s}, {shares}, "
            f"{int(text_only * 100)}% text-only; {self.max_tokens} output tokens per request"
        )


@dataclass(frozen=True)
class Request:
    images: tuple[int, ...]  # catalogue indices (no-repeat: fresh indices past the catalogue)
    question: str
    gap_s: float  # open loop: wait before sending this one (exponential, i.e. Poisson arrivals)


QUESTIONS = (
    "Describe the image.",
    "What is in the picture?",
    "Name the main colour.",
    "Is there a circle?",
    "Count the shapes.",
    "What stands out?",
)


def requests(mix: Mix, n: int, rate: float, seed: int, repeat_images: bool = True) -> list[Request]:
    """n requests; with repeat_images False every image is one no other request has."""
    rng = random.Random(seed)
    ranks = list(range(mix.catalogue))
    rng.shuffle(ranks)  # popularity rank -> catalogue index
    weights = [1.0 / (k + 1) ** mix.zipf_s for k in range(mix.catalogue)]
    counts, shares = zip(*mix.images_per_request, strict=True)
    fresh = mix.catalogue
    out = []
    for i in range(n):
        k = rng.choices(counts, shares)[0]
        chosen: list[int] = []
        while len(chosen) < k:
            pick = ranks[rng.choices(range(mix.catalogue), weights)[0]]
            if pick not in chosen:
                chosen.append(pick)
        if not repeat_images:
            chosen = list(range(fresh, fresh + k))
            fresh += k
        question = f"Request {i}: {rng.choice(QUESTIONS)}"
        out.append(Request(tuple(chosen), question, rng.expovariate(rate) if rate > 0 else 0.0))
    return out


def distinct_images(reqs: list[Request]) -> int:
    return len({i for r in reqs for i in r.images})


def image_items(reqs: list[Request]) -> int:
    return sum(len(r.images) for r in reqs)


@lru_cache(maxsize=4096)
def image_data_url(index: int, salt: int) -> str:
    """A deterministic JPEG (a data: URL) for catalogue `index`, its pixels varied by `salt`."""
    from PIL import Image, ImageDraw  # the `bench` extra

    rng = random.Random(index * 1_000_003 + salt * 7_919 + 17)
    img = Image.new("RGB", (IMAGE_SIDE, IMAGE_SIDE), tuple(rng.randrange(256) for _ in range(3)))
    draw = ImageDraw.Draw(img)
    for _ in range(6):
        x0, y0 = rng.randrange(IMAGE_SIDE - 40), rng.randrange(IMAGE_SIDE - 40)
        box = (x0, y0, x0 + rng.randrange(20, 120), y0 + rng.randrange(20, 120))
        colour = tuple(rng.randrange(256) for _ in range(3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=colour)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=JPEG_QUALITY)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def chat_body(model: str, req: Request, salt: int, max_tokens: int) -> dict:
    content: list[dict] = [{"type": "image_url", "image_url": {"url": image_data_url(i, salt)}} for i in req.images]
    content.append({"type": "text", "text": req.question})
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,  # random weights would often stop at once
        "stream": True,
        "stream_options": {"include_usage": True},
    }
