"""E+PD on real vLLM (CPU): the shared-storage example, rendered by `render()` and run locally.

One encoder (EC producer, `--mm-encoder-only`), one combined prefill+decode instance (EC
consumer) and `epd-router`, started once for the module. The tests read the pipeline's own
signals: the router's item counters, vLLM's request counters, and the files in the shared
store. Each leaves the pipeline working (the one that kills the encoder starts it again), so they pass in
any order. Images and videos (a few
frames, see `client.video_url`); both tiers take per-request media options
(`--trust-request-mm-kwargs`), so a video's frame count can be chosen per request.
"""

from __future__ import annotations

import hashlib
import itertools
import shutil
from pathlib import Path

import pytest

from dev.local.client import chat, chat_body, image_part, image_url, metric_sum, text_part, video_part, video_url
from dev.local.cpu_sizing import fit_to_cpu
from dev.local.runner import load_spec, run_local
from tests.support.operator_e2e import wait_for
from tests.support.vllm_pipeline import MAX_TOKENS, ask, requests_served, router_items

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]  # the first run also builds the vLLM venv

EXAMPLE = Path(__file__).parents[2] / "examples" / "epd-shared-storage.yaml"
STORE = "pvc/ec-cache"  # the example's `ecTransfer.sharedStorage.claimName`
_seeds = itertools.count(1)


@pytest.fixture(scope="module")
def epd(vllm_ready, tmp_path_factory):
    spec, _ = fit_to_cpu(load_spec(EXAMPLE), videos=1)
    for tier in ("encoder", "decode"):
        spec["spec"][tier]["extraArgs"].append("--trust-request-mm-kwargs")
    with run_local(spec, tmp_path_factory.mktemp("e-pd")) as running:
        yield running


def encoder_requests(epd) -> float:
    return requests_served(epd, "encoder")


def stored_items(epd) -> set[str]:
    store = epd.plan.volume(STORE)
    return {p.parent.name for p in store.glob("*/encoder_cache.safetensors")}


def new_image() -> int:
    return next(_seeds)


def url_key(url: str) -> str:
    """The router tags a media item with the SHA-256 of its URL; vLLM then stores it under that key
    (unless the request carries encoding options: then under a hash of both)."""
    return hashlib.sha256(url.encode()).hexdigest()


def router_uuid(seed: int) -> str:
    return url_key(image_url(seed))


def test_image_request_is_encoded_by_the_encoder_and_answered_by_pd(epd):
    encoded, requests, stored = router_items(epd, "encoded"), encoder_requests(epd), stored_items(epd)

    reply = ask(epd, [text_part("Describe the image."), image_part(new_image())])

    assert reply.completion_tokens == MAX_TOKENS
    assert router_items(epd, "encoded") == encoded + 1
    assert encoder_requests(epd) == requests + 1
    assert len(stored_items(epd) - stored) == 1, "the encoder wrote the image's embedding to the shared store"


def test_pd_answers_from_the_encoders_stored_output(epd):
    """Swap proof: PD's answer for image A follows the embedding stored under A's key, not A's pixels."""
    a, b, c = new_image(), new_image(), new_image()
    question = [text_part("What is in this picture?")]
    answer_b = ask(epd, question + [image_part(b)])
    answer_c = ask(epd, question + [image_part(c)])
    assert answer_b.token_ids != answer_c.token_ids, "the tiny model's answer must depend on the image"

    # A is encoded at the encoder directly, so PD has never seen it; its stored output is then
    # replaced by B's (same size, so same shape).
    key_a, key_b = (_encode_directly(epd, seed) for seed in (a, b))
    store = epd.plan.volume(STORE)
    shutil.copyfile(store / key_b / "encoder_cache.safetensors", store / key_a / "encoder_cache.safetensors")

    answer_a = ask(epd, question + [image_part(a)])

    assert answer_a.token_ids == answer_b.token_ids


def _encode_directly(epd, seed: int, part=None) -> str:
    # Tagged as the router tags it, so the stored key is the one the router's requests use.
    part = image_part(seed, uuid=router_uuid(seed)) if part is None else part
    reply = chat(epd.url("encoder"), chat_body(epd.plan.served_model, [part]))
    assert reply.ok, f"encoder: {reply}"
    [key] = reply.body["ec_transfer_params"]
    return key


def test_repeated_image_is_not_encoded_again(epd):
    image = new_image()
    ask(epd, [text_part("First look."), image_part(image)])
    encoded, reused, requests = router_items(epd, "encoded"), router_items(epd, "reused"), encoder_requests(epd)

    reply = ask(epd, [text_part("Second look."), image_part(image)])

    assert reply.completion_tokens == MAX_TOKENS
    assert router_items(epd, "reused") == reused + 1
    assert router_items(epd, "encoded") == encoded
    assert encoder_requests(epd) == requests, "the encoder did not see the repeated image"


def test_video_request_is_encoded_by_the_encoder_and_answered_by_pd(epd):
    encoded, requests, stored = router_items(epd, "encoded"), encoder_requests(epd), stored_items(epd)
    seed = new_image()

    reply = ask(epd, [text_part("Describe the video."), video_part(seed)])

    assert reply.completion_tokens == MAX_TOKENS
    assert router_items(epd, "encoded") == encoded + 1
    assert encoder_requests(epd) == requests + 1
    assert stored_items(epd) - stored == {url_key(video_url(seed))}, "the encoder stored the video's embedding"


def test_pd_answers_a_video_from_the_encoders_stored_output(epd):
    """The image swap proof with videos: PD's answer follows the embedding stored under the video's key."""
    a, b, c = new_image(), new_image(), new_image()
    question = [text_part("What happens in this video?")]
    answer_b = ask(epd, question + [video_part(b)])
    answer_c = ask(epd, question + [video_part(c)])
    assert answer_b.token_ids != answer_c.token_ids, "the tiny model's answer must depend on the video"

    key_a, key_b = (
        _encode_directly(epd, seed, {**video_part(seed), "uuid": url_key(video_url(seed))}) for seed in (a, b)
    )
    store = epd.plan.volume(STORE)
    shutil.copyfile(store / key_b / "encoder_cache.safetensors", store / key_a / "encoder_cache.safetensors")

    answer_a = ask(epd, question + [video_part(a)])

    assert answer_a.token_ids == answer_b.token_ids


def test_repeated_video_is_not_encoded_again(epd):
    seed = new_image()
    ask(epd, [text_part("First look."), video_part(seed)])
    encoded, reused, requests = router_items(epd, "encoded"), router_items(epd, "reused"), encoder_requests(epd)

    reply = ask(epd, [text_part("Second look."), video_part(seed)])

    assert reply.completion_tokens == MAX_TOKENS
    assert router_items(epd, "reused") == reused + 1
    assert router_items(epd, "encoded") == encoded
    assert encoder_requests(epd) == requests, "the encoder did not see the repeated video"


def test_a_video_read_with_another_frame_count_is_another_item(epd):
    """`media_io_kwargs.video.num_frames` changes what is encoded: the router neither reuses the
    4-frame encoding for a 2-frame request nor encodes the 2-frame one twice."""
    seed = new_image()
    question = [text_part("How many frames?"), video_part(seed)]
    ask(epd, question)
    encoded, reused, requests, stored = (
        router_items(epd, "encoded"),
        router_items(epd, "reused"),
        encoder_requests(epd),
        stored_items(epd),
    )
    two_frames = {
        **chat_body(epd.plan.served_model, question, MAX_TOKENS),
        "media_io_kwargs": {"video": {"num_frames": 2}},
    }

    first = chat(epd.router_url, two_frames)
    assert first.ok, f"router: {first}"
    assert (router_items(epd, "encoded"), encoder_requests(epd)) == (encoded + 1, requests + 1)
    [key] = stored_items(epd) - stored
    assert key != url_key(video_url(seed)), "vLLM keys the 2-frame encoding by the video and its options"

    again = chat(epd.router_url, two_frames)
    assert again.ok, f"router: {again}"
    assert again.completion_tokens == MAX_TOKENS
    assert (router_items(epd, "reused"), encoder_requests(epd)) == (reused + 1, requests + 1)


def test_text_only_request_skips_the_encoder(epd):
    requests = encoder_requests(epd)

    reply = ask(epd, "Say something about encoders.")

    assert reply.completion_tokens == MAX_TOKENS
    assert encoder_requests(epd) == requests


def test_streaming_reply_passes_through(epd):
    body = chat_body(
        epd.plan.served_model, [text_part("Stream this."), image_part(new_image())], MAX_TOKENS, stream=True
    )
    body["stream_options"] = {"include_usage": True}

    reply = chat(epd.router_url, body)

    assert reply.ok, f"router: {reply}"
    assert reply.body["done"], "the stream ends with `data: [DONE]`"
    assert [c["usage"]["completion_tokens"] for c in reply.chunks if c.get("usage")] == [MAX_TOKENS]
    assert sum(1 for c in reply.chunks if c.get("choices")) >= 1


def test_deleted_cache_item_still_answers(epd):
    """A stored embedding is gone (the janitor's TTL, a lost volume) while encoder and router know the image.

    PD refuses the first request (too many tokens) after the encoder has stored the image, so PD
    has never held the item in memory and really has to look in the store for it.
    """
    image = new_image()
    refused = chat(epd.router_url, chat_body(epd.plan.served_model, [image_part(image)], max_tokens=10**6))
    assert refused.status == 400, f"PD refuses max_tokens beyond the context: {refused}"
    key = router_uuid(image)
    assert key in stored_items(epd), "the encoder stored the image before PD refused"
    shutil.rmtree(epd.plan.volume(STORE) / key)

    try:
        reply = ask(epd, [text_part("Look again."), image_part(image)])
        assert reply.completion_tokens == MAX_TOKENS
        assert epd.healthy("decode"), "PD survived the request for a missing embedding"
    finally:
        if not epd.healthy("decode"):  # leave a working pipeline to the next test, as a liveness probe would
            epd.restart("decode")


def test_requests_still_answer_when_the_encoder_is_down(epd):
    epd.kill("encoder")
    try:
        fallback = router_items(epd, "fallback")

        image_reply = ask(epd, [text_part("Anyone there?"), image_part(new_image())])
        text_reply = ask(epd, "And without an image?")

        assert image_reply.completion_tokens == MAX_TOKENS
        assert text_reply.completion_tokens == MAX_TOKENS
        assert router_items(epd, "fallback") == fallback + 1, "PD encoded the image itself"
    finally:  # leave a working pipeline to the tests after this one, whatever their order
        epd.restart("encoder")
        wait_for(
            lambda: metric_sum(epd.router_url, "epd_router_endpoint_available", role="encoder") == 1,
            120,
            "the router sending work to the restarted encoder again",
        )
