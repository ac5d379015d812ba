"""The router against scripted vLLM-shaped backends: E+PD, E/P/D, streaming, batching, Mooncake, reuse."""

import asyncio
import re
from contextlib import asynccontextmanager

import orjson
import pytest

from tests.support.fake_vllm import FakeVLLM
from tests.support.otlp_receiver import OTLPReceiver, ReceivedSpan
from tests.support.prom import sample_values
from tests.support.router_stack import router_stack

CHAT = "/v1/chat/completions"
IMG_A = {"type": "image_url", "image_url": {"url": "https://img/a.png"}}
IMG_B = {"type": "image_url", "image_url": {"url": "https://img/b.png"}}
IMG_C = {"type": "image_url", "image_url": {"url": "https://img/c.png"}}


def chat(*parts, **extra):
    return {
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "what is this"}, *parts]}],
        **extra,
    }


def sse(name: str, n: int = 3, rid: str = "0") -> bytes:
    out = b""
    for i in range(n):
        chunk = {
            "id": f"chatcmpl-{name}-{rid}",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": f"answer from {name} [{i}]"}, "finish_reason": None}],
        }
        out += b"data: " + orjson.dumps(chunk) + b"\n\n"
    return out + b"data: [DONE]\n\n"


def parts(body):
    return body["messages"][0]["content"]


async def test_e_pd_encodes_then_sends_a_metadata_only_request_to_pd():
    async with router_stack(encoders=1) as s:
        r = await s.post(CHAT, chat(IMG_A, max_tokens=8))
        assert r.status == 200
        assert r.json()["choices"][0]["message"]["content"] == "answer from d0"
        [enc_req] = s.encoders[0].bodies()
        assert enc_req["stream"] is False and "max_tokens" not in enc_req
        [item] = parts(enc_req)
        assert item["image_url"] == IMG_A["image_url"] and item["uuid"]
        [pd_req] = s.decodes[0].bodies()
        assert parts(pd_req)[0] == {"type": "text", "text": "what is this"}
        assert parts(pd_req)[1] == {
            "type": "image_embeds",
            "image_embeds": {"image_grid_thw": [1, 16, 16]},
            "uuid": item["uuid"],
        }
        assert pd_req["ec_transfer_params"][item["uuid"]]["metadata"] == {"image_grid_thw": [1, 16, 16]}
        assert pd_req["max_tokens"] == 8 and "kv_transfer_params" not in pd_req


async def test_pinned_rewrite_sends_raw_media_under_the_encoders_key():
    async with router_stack(encoders=1, rewrite="pinned") as s:
        assert (await s.post(CHAT, chat(IMG_A))).status == 200
        [item] = parts(s.encoders[0].bodies()[0])
        [pd_req] = s.decodes[0].bodies()
        assert parts(pd_req)[1] == {**IMG_A, "uuid": item["uuid"]}
        assert pd_req["ec_transfer_params"][item["uuid"]]["metadata"] == {"image_grid_thw": [1, 16, 16]}


async def test_e_pd_streams_decode_bytes_unchanged():
    async with router_stack(encoders=1) as s:
        r = await s.post(CHAT, chat(IMG_A, stream=True))
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        assert r.body == sse("d0")


async def test_stream_chunks_reach_the_client_before_decode_finishes():
    async with router_stack(encoders=1) as s:
        gate = asyncio.Event()
        s.decodes[0].knobs.stream_gate = gate
        async with s.session.post(s.url + CHAT, data=orjson.dumps(chat(stream=True))) as resp:
            first = await resp.content.readuntil(b"\n\n")
            assert b"answer from d0 [0]" in first  # decode is still parked on the gate here
            gate.set()
            rest = await resp.read()
        assert first + rest == sse("d0")


async def test_e_p_d_prefills_with_remote_decode_and_hands_kv_params_to_decode():
    async with router_stack(encoders=1, prefills=1, decodes=1) as s:
        r = await s.post(CHAT, chat(IMG_A, stream=True, stream_options={"include_usage": True}, max_tokens=16))
        assert r.status == 200 and r.body == sse("d0")
        [p_req] = s.prefills[0].bodies()
        assert p_req["kv_transfer_params"]["do_remote_decode"] is True
        assert (p_req["max_tokens"], p_req["stream"]) == (1, False) and "stream_options" not in p_req
        assert parts(p_req)[1]["type"] == "image_embeds"
        [d_req] = s.decodes[0].bodies()
        assert d_req["kv_transfer_params"] == {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [1, 2, 3],
            "remote_engine_id": "engine-p0",
            "remote_request_id": "cmpl-p0-0",
            "remote_host": "127.0.0.1",
            "remote_port": 5600,
            "tp_size": 1,
        }
        assert d_req["stream"] is True and d_req["max_tokens"] == 16 and parts(d_req)[1]["type"] == "image_embeds"


async def test_images_for_one_encoder_go_in_one_request_matched_by_item_indices():
    async with router_stack(encoders=1) as s:
        s.encoders[0].knobs.rehash = True  # the engine's mm_hash differs from our uuid
        r = await s.post(CHAT, chat(IMG_A, IMG_B, IMG_C))
        assert r.status == 200
        [enc_req] = s.encoders[0].bodies()
        assert len(parts(enc_req)) == 3
        [pd_req] = s.decodes[0].bodies()
        uuids = [p["uuid"] for p in parts(enc_req)]
        assert [p.get("uuid") for p in parts(pd_req)[1:]] == uuids
        assert all(p["type"] == "image_embeds" for p in parts(pd_req)[1:])
        ec = pd_req["ec_transfer_params"]
        assert [e["mm_hash"] for e in ec["ec_items"]] == [h for h in ec if h != "ec_items"]


async def test_audio_and_video_get_one_encoder_request_each():
    audio = {"type": "audio_url", "audio_url": {"url": "https://a/x.wav"}}
    video = {"type": "video_url", "video_url": {"url": "https://v/x.mp4"}}
    async with router_stack(encoders=1) as s:
        r = await s.post(CHAT, chat(audio, video))
        assert r.status == 200
        assert [len(parts(b)) for b in s.encoders[0].bodies()] == [1, 1]
        kinds = [p["type"] for p in parts(s.decodes[0].bodies()[0])[1:]]
        assert kinds == ["audio_embeds", "video_embeds"]


async def test_mooncake_picks_the_consumer_first_and_tells_the_encoder_where_to_push():
    async with router_stack(
        encoders=1, decodes=2, ec_consumer_zmq_addrs=["tcp://10.0.0.1:14579", "tcp://10.0.0.2:14579"]
    ) as s:
        r = await s.post(CHAT, chat(IMG_A, IMG_B))
        assert r.status == 200
        consumer = next(i for i, d in enumerate(s.decodes) if d.received)
        [enc_req] = s.encoders[0].bodies()
        sent = enc_req["ec_transfer_params"]
        assert sent["consumer_zmq"] == f"tcp://10.0.0.{consumer + 1}:14579"
        tids = [e["transfer_id"] for e in sent["ec_items"]]
        assert len(set(tids)) == 2
        [pd_req] = s.decodes[consumer].bodies()
        assert [e["transfer_id"] for e in pd_req["ec_transfer_params"]["ec_items"]] == tids


async def test_text_only_requests_skip_encoders_and_reach_pd_verbatim():
    async with router_stack(encoders=2) as s:
        raw = b'{"model":"m","messages":[{"role":"user","content":"hello"}],  "max_tokens":3}'
        r = await s.post(CHAT, data=raw)
        assert r.status == 200
        assert not any(e.received for e in s.encoders)
        [req] = s.decodes[0].received
        assert req.body == orjson.loads(raw)
        # the client's own bytes, extra blank included: not a re-serialisation of the parsed body
        assert int(req.headers["Content-Length"]) == len(raw) != len(orjson.dumps(orjson.loads(raw)))


async def test_request_id_and_authorization_reach_every_backend():
    async with router_stack(encoders=1, prefills=1, decodes=1) as s:
        r = await s.post(CHAT, chat(IMG_A), headers={"x-request-id": "req-42", "Authorization": "Bearer t0k"})
        assert r.headers["x-request-id"] == "req-42"
        enc = s.encoders[0].received[0].headers
        # the client's id, the item's index and 6 hex digits of the call: each encoder call told apart
        assert re.fullmatch("req-42:0:[0-9a-f]{6}", enc["x-request-id"]) and enc["Authorization"] == "Bearer t0k"
        for fake in (s.prefills[0], s.decodes[0]):
            assert fake.received[0].headers["x-request-id"] == "req-42"
            assert fake.received[0].headers["Authorization"] == "Bearer t0k"


async def test_completions_route_needs_no_encoder_and_supports_e_p_d():
    async with router_stack(encoders=1, prefills=1, decodes=1) as s:
        r = await s.post("/v1/completions", {"model": "m", "prompt": "once upon", "max_tokens": 4})
        assert r.status == 200 and r.json()["choices"][0]["text"] == "answer from d0"
        assert s.prefills[0].received[0].path == "/v1/completions"
        assert s.decodes[0].bodies()[0]["kv_transfer_params"]["remote_engine_id"] == "engine-p0"
        assert not s.encoders[0].received


async def test_models_are_relayed_from_decode():
    async with router_stack(encoders=0) as s:
        r = await s.get("/v1/models")
        assert r.status == 200 and r.json()["data"][0]["id"] == "fake-model"


async def test_cache_aware_sends_a_repeated_image_to_the_same_encoder():
    async with router_stack(encoders=3) as s:
        for _ in range(4):
            assert (await s.post(CHAT, chat(IMG_A))).status == 200
        assert sorted(len(e.received) for e in s.encoders) == [0, 0, 4]


async def test_least_loaded_uses_scraped_queue_depth():
    async with router_stack(encoders=0, decodes=2) as s:
        s.decodes[0].knobs.running, s.decodes[0].knobs.waiting = 3, 4
        await s.router.health.check_all()
        for _ in range(3):
            await s.post(CHAT, chat())
        assert (len(s.decodes[0].received), len(s.decodes[1].received)) == (0, 3)


async def test_prefix_aware_keeps_a_conversation_on_one_instance():
    async with router_stack(encoders=0, decodes=3, pd_policy="prefix-aware") as s:
        for turn in range(3):
            await s.post(
                CHAT,
                chat(
                    **{
                        "messages": [
                            {"role": "system", "content": "x" * 300},
                            {"role": "user", "content": f"turn {turn}"},
                        ]
                    }
                ),
            )
        assert sorted(len(d.received) for d in s.decodes) == [0, 0, 3]


async def test_prefix_aware_in_e_p_d_sends_a_repeated_prompt_to_the_same_prefill_and_decode():
    # Prefill and decode each keep their own homes: a picker shared by both pools would overwrite the
    # prefill home with the decode one on every request, and no prompt would ever go home.
    async with router_stack(encoders=0, prefills=3, decodes=3, pd_policy="prefix-aware") as s:
        prompts = [f"system prompt {i} " + "x" * 300 for i in range(6)]
        for _ in range(2):
            for prompt in prompts:
                r = await s.post(CHAT, chat(messages=[{"role": "user", "content": prompt}]))
                assert r.status == 200
        for tier in (s.prefills, s.decodes):
            served: dict[str, set[str]] = {}
            for fake in tier:
                for body in fake.bodies():
                    served.setdefault(body["messages"][0]["content"], set()).add(fake.name)
            assert len(served) == len(prompts)
            assert all(len(names) == 1 for names in served.values()), served
            # and different prompts have different homes: the load bound spreads new keys over the tier
            assert all(fake.received for fake in tier), [len(f.received) for f in tier]


@pytest.mark.parametrize("mode, reused_part", [("pinned", "image_url"), ("metadata", "image_embeds")])
async def test_reuse_skips_the_encoder_for_a_repeated_item_until_the_ttl(mode, reused_part):
    async with router_stack(encoders=1, reuse_ttl=60, reuse_mode=mode, immutable_media_urls=True) as s:
        now = [1000.0]
        s.router.reuse.clock = lambda: now[0]
        await s.post(CHAT, chat(IMG_A))
        await s.post(CHAT, chat(IMG_A))
        assert len(s.encoders[0].received) == 1
        first, second = s.decodes[0].bodies()
        assert parts(first)[1]["type"] == "image_embeds"
        # pinned: raw media under the same uuid, so the consumer loads the stored embedding
        assert parts(second)[1]["type"] == reused_part and parts(second)[1]["uuid"] == parts(first)[1]["uuid"]
        if mode == "metadata":  # the stored embedding travels again under a transfer id of its own
            tids = [b["ec_transfer_params"]["ec_items"][0]["transfer_id"] for b in (first, second)]
            assert tids[0] != tids[1] and all(re.fullmatch("[0-9a-f]{32}", t) for t in tids)
        now[0] += 61  # past the TTL the item may be gone from the shared store: encode again
        await s.post(CHAT, chat(IMG_A))
        assert len(s.encoders[0].received) == 2
        metrics = (await s.get("/metrics")).body
        assert sample_values(metrics, "epd_router_items_total", outcome="reused") == [1]
        assert sample_values(metrics, "epd_router_items_total", outcome="encoded") == [2]


async def test_reuse_by_url_needs_urls_declared_immutable_but_data_urls_are_reused():
    data_url = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    async with router_stack(encoders=1, reuse_ttl=60) as s:
        for _ in range(2):
            await s.post(CHAT, chat(IMG_A))  # what is behind the URL may have changed: encoded each time
        assert len(s.encoders[0].received) == 2
        for _ in range(2):
            await s.post(CHAT, chat(data_url))  # the URL is the content
        assert len(s.encoders[0].received) == 3


async def test_health_reports_every_tier_and_metrics_expose_inflight_per_endpoint():
    async with router_stack(encoders=1, prefills=1, decodes=1) as s:
        r = await s.get("/health")
        doc = r.json()
        assert r.status == 200
        assert (doc["proxy"], doc["encode_cluster"], doc["prefill_cluster"], doc["decode_cluster"]) == ("healthy",) * 4
        assert [t["url"] for t in doc["tiers"]["encoder"]] == [s.encoders[0].url]
        await s.post(CHAT, chat(IMG_A))
        text = (await s.get("/metrics")).body
        host = s.encoders[0].url.split("//")[1]
        assert sample_values(text, "epd_router_endpoint_inflight", backend=host, backend_pod="", role="encoder") == [0]
        assert sample_values(text, "epd_router_requests_total", route="/v1/chat/completions", status="200") == [1]
        for stage in ("encode", "prefill", "decode", "total", "ttfb"):
            assert sample_values(text, "epd_router_stage_seconds_count", stage=stage) == [1], stage
        # every stage took part of the request's time: none is longer than the whole
        [total] = sample_values(text, "epd_router_stage_seconds_sum", stage="total")
        for stage in ("encode", "prefill", "decode"):
            [took] = sample_values(text, "epd_router_stage_seconds_sum", stage=stage)
            assert 0 < took <= total, (stage, took, total)
        # and every call released what it held: nothing is left in flight anywhere
        for fake in (s.prefills[0], s.decodes[0]):
            host = fake.url.split("//")[1]
            assert sample_values(text, "epd_router_endpoint_inflight", backend=host, role=fake.role) == [0], fake.name


@asynccontextmanager
async def receiver():
    rx = OTLPReceiver()
    await rx.start()
    try:
        yield rx
    finally:
        await rx.stop()


def spans_of(rx: OTLPReceiver) -> tuple[ReceivedSpan, dict[str, list[ReceivedSpan]]]:
    """The one request span and its children by name, in the order they ended."""
    [server] = [span for span in rx.spans if span.kind == "server"]
    children: dict[str, list[ReceivedSpan]] = {}
    for span in rx.spans:
        if span is not server:
            assert span.parent_id == server.span_id and span.trace_id == server.trace_id, span.name
            children.setdefault(span.name, []).append(span)
    return server, children


def joined(fake: FakeVLLM, spans: list[ReceivedSpan]) -> None:
    """Each call `fake` received named its own span as its parent, and the span names that call."""
    assert len(fake.received) == len(spans), (fake.name, len(fake.received), len(spans))
    for rec, span in zip(fake.received, spans, strict=True):
        _, trace_id, span_id, _ = rec.headers["traceparent"].split("-")
        assert (trace_id, span_id) == (span.trace_id, span.span_id), f"{fake.name}: not its {span.name} span"
        assert span.attributes["url.full"] == fake.url + rec.path and span.attributes["epd.stage"] == span.name
        assert span.attributes["server.port"] == int(fake.url.rsplit(":", 1)[1])


async def test_an_e_p_d_trace_has_a_span_per_backend_call_and_an_event_per_retry():
    async with receiver() as rx:
        async with router_stack(encoders=1, prefills=1, decodes=1, otlp_traces_endpoint=rx.url) as s:
            pre, dec = s.prefills[0], s.decodes[0]
            pre.knobs.fail_next, pre.knobs.fail_status = 1, 400  # refuses the metadata-only body once
            dec.knobs.fail_next = 1  # fails on the KV handle: prefill again, then decode again
            r = await s.post(CHAT, chat(IMG_A, max_tokens=4))
            assert r.status == 200 and r.json()["choices"][0]["message"]["content"] == "answer from d0"
            assert [parts(b)[1]["type"] for b in pre.bodies()] == ["image_embeds", "image_url", "image_url"]
        # The router has stopped: its exporter flushed every span.
        server, children = spans_of(rx)
        assert sorted(children) == ["decode", "encode", "prefill"]
        assert server.attributes["epd.media_items"] == 1
        assert [name for name, _ in server.events] == ["retry", "retry"]  # every item was encoded: no fallback
        assert ("retry", {"epd.stage": "prefill", "epd.reason": "metadata_rejected"}) in server.events
        assert ("retry", {"epd.stage": "decode", "epd.reason": "status"}) in server.events
        assert [span.status_code for span in children["prefill"]] == [2, 0, 0]
        assert children["prefill"][0].attributes["http.response.status_code"] == 400
        assert [span.attributes["http.response.status_code"] for span in children["decode"]] == [500, 200]
        assert [span.status_code for span in children["decode"]] == [2, 0]
        joined(s.encoders[0], children["encode"])
        joined(pre, children["prefill"])
        joined(dec, children["decode"])


async def test_a_trace_shows_the_encoder_retry_with_its_items():
    async with receiver() as rx:
        async with router_stack(encoders=1, otlp_traces_endpoint=rx.url) as s:
            s.encoders[0].knobs.fail_next = 1
            assert (await s.post(CHAT, chat(IMG_A, IMG_B))).status == 200
        server, children = spans_of(rx)
        assert server.events == [("retry", {"epd.stage": "encode", "epd.reason": "encoder_failed", "epd.items": 2})]
        assert [span.status_code for span in children["encode"]] == [2, 0]


async def test_an_e_pd_trace_shows_the_consumer_refusing_metadata_and_the_retry_with_media():
    async with receiver() as rx:
        async with router_stack(encoders=1, otlp_traces_endpoint=rx.url) as s:
            pd = s.decodes[0]
            pd.knobs.fail_next, pd.knobs.fail_status = 1, 400
            r = await s.post(CHAT, chat(IMG_A), headers={"x-request-id": "traced-1"})
            assert r.status == 200 and r.headers["x-request-id"] == "traced-1"
            assert [parts(b)[1]["type"] for b in pd.bodies()] == ["image_embeds", "image_url"]
            assert all(rec.headers["x-request-id"] == "traced-1" for rec in pd.received)
        server, children = spans_of(rx)
        assert ("retry", {"epd.stage": "decode", "epd.reason": "metadata_rejected"}) in server.events
        assert [span.attributes["http.response.status_code"] for span in children["decode"]] == [400, 200]
        joined(pd, children["decode"])


async def test_a_trace_counts_the_items_that_went_raw_beside_encoded_ones():
    reused = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    fresh = {"type": "image_url", "image_url": {"url": "data:image/png;base64,BBBB"}}
    async with receiver() as rx:
        async with router_stack(encoders=1, reuse_ttl=60, reuse_mode="pinned", otlp_traces_endpoint=rx.url) as s:
            assert (await s.post(CHAT, chat(reused))).status == 200
            # pinned reuse: the first image goes raw under its stored uuid, the second is encoded
            r = await s.post(CHAT, chat(reused, fresh), headers={"x-request-id": "mixed-1"})
            assert r.status == 200
            assert [p["type"] for p in parts(s.decodes[0].bodies()[1])[1:]] == ["image_url", "image_embeds"]
        [server] = [span for span in rx.spans if span.attributes.get("epd.request_id") == "mixed-1"]
        assert server.attributes["epd.media_items"] == 2
        assert ("encoder_fallback", {"epd.items": 1}) in server.events
