"""Every failure path: encoder retry and fallback, metadata-only rejection, P/D retry, disconnects, ejection."""

import asyncio
import contextlib
import logging

import aiohttp
import orjson
import pytest
from aiohttp import web

from epd_operator.router.backends import DiscoveredEndpoint, HealthChecker, Pool
from epd_operator.router.metrics import RouterMetrics
from tests.support.prom import sample_values
from tests.support.raw_backend import RawBackend, unaccepted_listener
from tests.support.router_stack import router_stack

CHAT = "/v1/chat/completions"
IMG_A = {"type": "image_url", "image_url": {"url": "https://img/a.png"}}
IMG_B = {"type": "image_url", "image_url": {"url": "https://img/b.png"}}


def chat(*parts, **extra):
    return {
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "what"}, *parts]}],
        **extra,
    }


def media_parts(body):
    return [p for p in body["messages"][0]["content"] if p["type"] != "text"]


async def metric(stack, name: str, **labels: str) -> list[float]:
    return sample_values((await stack.get("/metrics")).body, name, **labels)


async def wait_for(predicate, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


def home(fakes):
    """The backend a first request went to: hash pickers send the same key there again."""
    [used] = [f for f in fakes if f.received]
    other = next(f for f in fakes if f is not used)
    used.received.clear()
    return used, other


async def test_a_failing_encoder_is_retried_once_on_another():
    async with router_stack(encoders=2) as s:
        await s.post(CHAT, chat(IMG_A))
        failing, other = home(s.encoders)
        failing.knobs.fail_next = 1
        r = await s.post(CHAT, chat(IMG_A))
        assert r.status == 200
        assert (len(failing.received), len(other.received)) == (1, 1)
        assert media_parts(s.decodes[0].bodies()[1])[0]["type"] == "image_embeds"
        assert await metric(s, "epd_router_retries_total", reason="encoder_failed", stage="encode") == [1]


async def test_an_encoder_timeout_counts_as_a_failure_and_is_retried():
    async with router_stack(encoders=2, encode_timeout=0.2) as s:
        for e in s.encoders:
            e.knobs.delay = 5
        r = await s.post(CHAT, chat(IMG_A))
        # Both time out: the item goes raw to PD, which encodes it locally.
        assert r.status == 200
        assert sum(len(e.received) for e in s.encoders) == 2
        assert media_parts(s.decodes[0].bodies()[0])[0]["type"] == "image_url"
        backend = s.encoders[0].url.split("//")[1]
        assert await metric(s, "epd_router_backend_errors_total", backend=backend, kind="timeout", role="encoder") == [
            1
        ]


async def test_when_encoders_keep_failing_the_media_goes_raw_and_pinned_to_pd():
    async with router_stack(encoders=2) as s:
        for e in s.encoders:
            e.knobs.fail_always = True
        r = await s.post(CHAT, chat(IMG_A))
        assert r.status == 200
        [part] = media_parts(s.decodes[0].bodies()[0])
        assert part["image_url"] == IMG_A["image_url"] and part["uuid"]
        assert await metric(s, "epd_router_encoder_fallback_requests_total", reason="encoder_failed") == [1]
        assert await metric(s, "epd_router_items_total", outcome="fallback") == [1]


async def test_without_any_encoder_the_raw_request_goes_to_pd_and_is_counted():
    async with router_stack(encoders=0) as s:
        r = await s.post(CHAT, chat(IMG_A, IMG_B))
        assert r.status == 200
        assert [p["type"] for p in media_parts(s.decodes[0].bodies()[0])] == ["image_url", "image_url"]
        assert await metric(s, "epd_router_encoder_fallback_requests_total", reason="no_encoder") == [1]
        assert await metric(s, "epd_router_items_total", outcome="fallback") == [2]
        r = await s.get("/health")
        assert (r.status, r.json()["encode_cluster"]) == (200, "empty")


async def test_an_encoder_client_error_is_relayed_not_retried():
    async with router_stack(encoders=2) as s:
        for e in s.encoders:
            e.knobs.fail_always, e.knobs.fail_status = True, 400
        r = await s.post(CHAT, chat(IMG_A))
        assert r.status == 400 and "scripted failure" in r.json()["error"]["message"]
        assert sum(len(e.received) for e in s.encoders) == 1
        assert not s.decodes[0].received


async def test_a_consumer_rejecting_metadata_only_is_retried_with_raw_media_and_forgets_the_reuse_entry():
    async with router_stack(encoders=1, decodes=1, reuse_ttl=60, reuse_mode="metadata", immutable_media_urls=True) as s:
        await s.post(CHAT, chat(IMG_A))
        assert len(s.router.reuse) == 1
        s.decodes[0].knobs.reject_embeds = True  # the cached item was evicted from the shared store
        r = await s.post(CHAT, chat(IMG_A))
        assert r.status == 200
        assert len(s.encoders[0].received) == 1  # the second request reused the first one's encoding
        _, rejected, retried = s.decodes[0].bodies()
        assert media_parts(rejected)[0]["type"] == "image_embeds"
        assert media_parts(retried)[0]["image_url"] == IMG_A["image_url"]
        assert media_parts(retried)[0]["uuid"] == media_parts(rejected)[0]["uuid"]
        assert len(s.router.reuse) == 0
        assert await metric(s, "epd_router_retries_total", reason="metadata_rejected", stage="decode") == [1]
        s.decodes[0].knobs.reject_embeds = False
        assert (await s.post(CHAT, chat(IMG_A))).status == 200
        assert len(s.encoders[0].received) == 2  # forgotten: encoded again, not reused


async def test_a_consumer_answering_400_to_metadata_only_gets_the_media_on_the_retry():
    async with router_stack(encoders=1, decodes=1) as s:
        s.decodes[0].knobs.fail_next, s.decodes[0].knobs.fail_status = 1, 400
        r = await s.post(CHAT, chat(IMG_A))
        assert r.status == 200
        rejected, retried = s.decodes[0].bodies()
        assert media_parts(rejected)[0]["type"] == "image_embeds"
        assert media_parts(retried)[0]["image_url"] == IMG_A["image_url"]
        assert await metric(s, "epd_router_retries_total", reason="metadata_rejected", stage="decode") == [1]


@pytest.mark.parametrize("status", [500, 400])
async def test_a_prefill_rejecting_metadata_only_is_retried_with_raw_media(status):
    async with router_stack(encoders=1, prefills=1, decodes=1) as s:
        s.prefills[0].knobs.fail_next, s.prefills[0].knobs.fail_status = 1, status
        r = await s.post(CHAT, chat(IMG_A))
        assert r.status == 200
        first, second = s.prefills[0].bodies()
        assert media_parts(first)[0]["type"] == "image_embeds"
        assert media_parts(second)[0]["type"] == "image_url"
        assert media_parts(s.decodes[0].bodies()[0])[0]["type"] == "image_url"
        assert await metric(s, "epd_router_retries_total", reason="metadata_rejected", stage="prefill") == [1]


def garble_prefill(fake, times: int | None = None) -> None:
    """`fake` answers its next `times` prefills (all, when None) with a body that is not a JSON object."""
    real = fake._prefill
    left = [times]

    def prefill(path, body):
        if left[0] == 0:
            return real(path, body)
        if left[0] is not None:
            left[0] -= 1
        return web.Response(body=b"<html>oops</html>", content_type="application/json")

    fake._prefill = prefill


async def test_a_prefill_reply_that_is_not_json_is_a_retried_failure_of_that_backend():
    async with router_stack(encoders=0, prefills=1, decodes=1) as s:
        garble_prefill(s.prefills[0], 1)
        r = await s.post(CHAT, chat())
        assert r.status == 200
        assert len(s.prefills[0].received) == 2
        assert s.decodes[0].bodies()[0]["kv_transfer_params"]["remote_engine_id"] == "engine-p0"
        assert await metric(s, "epd_router_retries_total", reason="reply", stage="prefill") == [1]
        host = s.prefills[0].url.split("//")[1]
        assert await metric(s, "epd_router_backend_errors_total", backend=host, kind="reply", role="prefill") == [1]


async def test_prefill_replies_that_are_never_json_are_a_502_naming_the_prefill_tier():
    async with router_stack(encoders=0, prefills=2, decodes=1) as s:
        for fake in s.prefills:
            garble_prefill(fake)
        r = await s.post(CHAT, chat(), headers={"x-request-id": "garbled-1"})
        assert r.status == 502 and r.headers["x-request-id"] == "garbled-1"
        assert r.json()["error"]["message"] == "prefill failed (reply)"
        assert not s.decodes[0].received


async def test_decode_gone_while_prefill_ran_is_a_503():
    async with router_stack(encoders=0, prefills=1, decodes=1, eject_after=1) as s:
        s.prefills[0].knobs.delay = 0.2
        task = asyncio.create_task(s.post(CHAT, chat(), headers={"x-request-id": "late-1"}))
        await wait_for(lambda: s.prefills[0].received)
        s.decodes[0].knobs.health_status = 500
        await s.router.health.check_all()  # the only decode is ejected before prefill answers
        r = await asyncio.wait_for(task, 10)
        assert r.status == 503 and r.headers["x-request-id"] == "late-1"
        error = r.json()["error"]
        assert error["message"] == "no decode endpoint available" and error["type"] == "service_unavailable"
        assert error["code"] == 503
        assert not s.decodes[0].received


async def test_prefill_failure_is_retried_on_another_prefill():
    async with router_stack(encoders=0, prefills=2, decodes=1, pd_policy="prefix-aware") as s:
        await s.post(CHAT, chat())
        failing, other = home(s.prefills)
        failing.knobs.drop_next = 1
        r = await s.post(CHAT, chat())
        assert r.status == 200
        assert (len(failing.received), len(other.received)) == (1, 1)
        assert await metric(s, "epd_router_retries_total", reason="connect", stage="prefill") == [1]


async def test_prefill_failing_twice_is_a_5xx():
    async with router_stack(encoders=0, prefills=2, decodes=1) as s:
        for p in s.prefills:
            p.knobs.fail_always = True
        r = await s.post(CHAT, chat())
        assert r.status == 500 and "scripted failure" in r.json()["error"]["message"]
        assert not s.decodes[0].received


async def test_decode_failure_before_the_first_byte_is_retried_on_another_instance():
    async with router_stack(encoders=0, decodes=2, pd_policy="prefix-aware") as s:
        await s.post(CHAT, chat(stream=True))
        failing, other = home(s.decodes)
        failing.knobs.fail_next = 1
        r = await s.post(CHAT, chat(stream=True))
        assert r.status == 200 and r.body.endswith(b"data: [DONE]\n\n")
        assert (len(failing.received), len(other.received)) == (1, 1)
        assert await metric(s, "epd_router_retries_total", reason="status", stage="decode") == [1]
        # the prompt's home is now the instance that answered it: the conversation goes on there
        assert (await s.post(CHAT, chat(stream=True))).status == 200
        assert (len(failing.received), len(other.received)) == (1, 2)


async def test_e_p_d_decode_failure_prefills_again_then_uses_another_decode():
    async with router_stack(encoders=0, prefills=1, decodes=2, pd_policy="prefix-aware") as s:
        await s.post(CHAT, chat())
        failing, other = home(s.decodes)
        failing.knobs.drop_next = 1
        r = await s.post(CHAT, chat())
        assert r.status == 200
        assert len(s.prefills[0].received) == 3  # the first request, then twice for this one
        assert (len(failing.received), len(other.received)) == (1, 1)


async def test_e_p_d_decode_refusing_the_request_is_relayed_not_retried():
    async with router_stack(encoders=0, prefills=1, decodes=1) as s:
        s.decodes[0].knobs.fail_next, s.decodes[0].knobs.fail_status = 1, 400
        r = await s.post(CHAT, chat())
        assert r.status == 400 and "scripted failure" in r.json()["error"]["message"]
        assert (len(s.prefills[0].received), len(s.decodes[0].received)) == (1, 1)
        assert await metric(s, "epd_router_retries_total") == []


@pytest.mark.parametrize(
    "tiers, failing, status",
    [
        ({"decodes": 1}, "decodes", 503),  # E+PD: both attempts fail
        ({"prefills": 1, "decodes": 1}, "prefills", 503),
        ({"prefills": 1, "decodes": 1}, "decodes", 503),
        ({"prefills": 1, "decodes": 1}, "prefills", 404),  # refused, relayed as it is
    ],
)
async def test_an_error_reply_carries_the_clients_request_id(tiers, failing, status):
    async with router_stack(encoders=0, **tiers) as s:
        for fake in getattr(s, failing):
            fake.knobs.fail_always, fake.knobs.fail_status = True, status
        r = await s.post(CHAT, chat(), headers={"x-request-id": "failed-1"})
        assert r.status == status and "scripted failure" in r.json()["error"]["message"]
        assert r.headers["x-request-id"] == "failed-1"
        assert r.headers["Content-Type"].split(";")[0] == "application/json"  # the backend's own, relayed
        # each 5xx counts against its backend as a failed status; a refusal (4xx) does not
        role = {"decodes": "decode", "prefills": "prefill"}[failing]
        calls = sum(len(fake.received) for fake in getattr(s, failing))
        failures = await metric(s, "epd_router_backend_errors_total", kind="status", role=role)
        assert sum(failures) == (calls if status >= 500 else 0)


async def test_kv_handoffs_are_counted_by_what_decode_made_of_them():
    """A decode 5xx on prefill's KV handle is vLLM failing a KV load: counted even when the retry succeeds."""
    async with router_stack(encoders=0, prefills=1, decodes=1) as s:
        assert (await s.post(CHAT, chat())).status == 200
        s.decodes[0].knobs.fail_next = 1
        assert (await s.post(CHAT, chat())).status == 200  # prefilled again, pulled on the retry
        s.prefills[0].knobs.omit_kv_params = True
        assert (await s.post(CHAT, chat())).status == 200
        assert "kv_transfer_params" not in s.decodes[0].bodies()[-1]
        counts = {
            o: await metric(s, "epd_router_kv_handoffs_total", outcome=o) for o in ("pulled", "failed", "missing")
        }
        assert counts == {"pulled": [2], "failed": [1], "missing": [1]}


async def test_e_pd_counts_no_kv_handoffs():
    async with router_stack(encoders=0, decodes=1) as s:
        assert (await s.post(CHAT, chat())).status == 200
        assert await metric(s, "epd_router_kv_handoffs_total") == []


async def test_decode_failing_on_every_attempt_relays_the_error():
    async with router_stack(encoders=0, decodes=2) as s:
        for d in s.decodes:
            d.knobs.fail_always, d.knobs.fail_status = True, 503
        r = await s.post(CHAT, chat())
        assert r.status == 503


async def test_a_stream_broken_after_the_first_byte_is_not_replayed():
    async with router_stack(encoders=0, decodes=2) as s:
        for d in s.decodes:
            d.knobs.break_stream_after = 1
        async with s.session.post(s.url + CHAT, data=orjson.dumps(chat(stream=True))) as resp:
            first = await resp.content.readuntil(b"\n\n")
            with contextlib.suppress(aiohttp.ClientPayloadError):  # the stream ends where decode's broke
                await resp.read()
        assert b"[0]" in first
        assert sum(len(d.received) for d in s.decodes) == 1


async def test_client_disconnect_cancels_the_upstream_call():
    async with router_stack(encoders=1) as s:
        s.decodes[0].knobs.delay = 30
        task = asyncio.create_task(s.post(CHAT, chat()))
        await wait_for(lambda: s.decodes[0].received)
        task.cancel()
        await wait_for(lambda: s.decodes[0].cancelled == 1)
        s.encoders[0].knobs.delay = 30
        task = asyncio.create_task(s.post(CHAT, chat(IMG_A)))
        await wait_for(lambda: s.encoders[0].received)
        task.cancel()
        await wait_for(lambda: s.encoders[0].cancelled == 1)
        await wait_for(lambda: s.router.encoders.endpoints[s.encoders[0].url].inflight == 0)


async def test_endpoints_are_ejected_after_consecutive_failed_checks_and_readmitted(caplog):
    caplog.set_level(logging.INFO, logger="epd_router.backends")
    async with router_stack(encoders=2, eject_after=2) as s:
        bad = s.encoders[0]
        bad.knobs.health_status = 503
        bad.knobs.running = 5  # a backend failing /health is not scraped for load
        await s.router.health.check_all()
        assert len(s.router.encoders.available) == 2  # one failed check is not enough
        await s.router.health.check_all()
        assert [ep.url for ep in s.router.encoders.available] == [s.encoders[1].url]
        for img in (IMG_A, IMG_B, {**IMG_A, "uuid": "x"}):
            await s.post(CHAT, chat(img))
        assert not bad.received
        backend = bad.url.split("//")[1]
        assert await metric(s, "epd_router_ejections_total", backend=backend, role="encoder") == [1]
        assert await metric(s, "epd_router_backend_errors_total", backend=backend, kind="health") == [2]
        r = await s.get("/health")
        assert r.json()["tiers"]["encoder"][0] == {
            "url": bad.url,
            "pod": "",
            "generation": None,
            "ready": True,
            "healthy": False,
            "inflight": 0,
            "load": 0,
        }
        bad.knobs.health_status = 200
        await s.router.health.check_all()
        assert len(s.router.encoders.available) == 2
    logged = [(rec.levelname, rec.getMessage()) for rec in caplog.records if rec.name == "epd_router.backends"]
    assert logged == [
        ("WARNING", f"ejected encoder {bad.url} after 2 consecutive failures (health)"),
        ("INFO", f"re-admitted encoder {bad.url}"),
    ]


async def test_a_backend_that_went_away_fails_its_check():
    async with router_stack(encoders=2, eject_after=1) as s:
        await s.encoders[0].stop()  # connection refused
        await s.router.health.check_all()
        assert [ep.url for ep in s.router.encoders.available] == [s.encoders[1].url]


async def test_background_health_checks_keep_running_round_after_round():
    async with router_stack(encoders=1, eject_after=3, health_interval=0.01) as s:
        s.encoders[0].knobs.health_status = 503
        await wait_for(lambda: not s.router.encoders.available, timeout=3)


@contextlib.asynccontextmanager
async def scripted_backend(health: tuple[int, str] | None = (200, ""), metrics: tuple[int, str] | None = (200, "")):
    """A backend whose /health and /metrics answer (status, body) as scripted; None: never answer."""

    def route(script: tuple[int, str] | None):
        async def answer(request: web.Request) -> web.Response:
            if script is None:
                await asyncio.Event().wait()
            assert script is not None
            return web.Response(status=script[0], text=script[1])

        return answer

    app = web.Application()
    app.router.add_get("/health", route(health))
    app.router.add_get("/metrics", route(metrics))
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_a_probe_or_scrape_that_never_answers_gives_up_at_the_health_timeout():
    async with (
        scripted_backend(health=None) as hung,
        scripted_backend(metrics=None) as slow_metrics,
        aiohttp.ClientSession() as session,
    ):
        m = RouterMetrics()
        pool = Pool("decode", m)
        pool.update([DiscoveredEndpoint(hung), DiscoveredEndpoint(slow_metrics)])
        async with asyncio.timeout(3):  # the session's own default would wait five minutes
            await HealthChecker([pool], session, interval=1.0, timeout=0.2).check_all()
        errors = sample_values(m.exposition()[0], "epd_router_backend_errors_total", kind="health")
        assert errors == [1]  # the hung probe; a hung scrape is no failure
        assert [d["load"] for d in pool.describe()] == [0, 0]


async def test_scraped_load_is_what_the_backend_runs_beyond_this_routers_own_work():
    async with (
        scripted_backend(metrics=(500, "vllm:num_requests_running 4.0\n")) as erring,
        scripted_backend(metrics=(200, "vllm:num_requests_running 5.0\n")) as busy,
        scripted_backend(metrics=(200, 'vllm:num_requests_running{engine="1"} 3.0\n')) as dp,
        aiohttp.ClientSession() as session,
    ):
        m = RouterMetrics()
        plain, ranked = Pool("decode", m), Pool("prefill", m, dp_size=2)
        plain.update([DiscoveredEndpoint(erring), DiscoveredEndpoint(busy)])
        ranked.update([DiscoveredEndpoint(dp)])
        plain.acquire(plain.endpoints[busy], 2)  # two of the five are this router's
        await HealthChecker([plain, ranked], session, interval=1.0, timeout=2.0).check_all()
        # a failed scrape's body is no load; the router's own two count once
        assert [(d["inflight"], d["load"]) for d in plain.describe()] == [(0, 0), (2, 5)]
        # engine 0 reports nothing: only engine 1's rank takes the load
        assert [(d["rank"], d["load"]) for d in ranked.describe()] == [(0, 0), (1, 3)]


async def test_health_is_503_while_no_decode_can_serve():
    async with router_stack(encoders=1, eject_after=1) as s:
        s.decodes[0].knobs.health_status = 500
        await s.router.health.check_all()
        r = await s.get("/health")
        assert r.status == 503 and r.json()["decode_cluster"] == "unhealthy"
        r = await s.post(CHAT, chat(), headers={"x-request-id": "nobody-1"})
        assert r.status == 503 and r.json()["error"]["type"] == "service_unavailable"
        assert r.headers["x-request-id"] == "nobody-1"


async def test_client_leaving_mid_stream_stops_decode():
    async with router_stack(encoders=0) as s:
        s.decodes[0].knobs.stream_gate = asyncio.Event()  # never set: decode is parked after one chunk
        async with aiohttp.ClientSession() as own:
            resp = await own.post(s.url + CHAT, data=orjson.dumps(chat(stream=True)))
            assert b"[0]" in await resp.content.readuntil(b"\n\n")
            resp.close()
        await wait_for(lambda: s.decodes[0].cancelled == 1)
        await wait_for(lambda: s.router.decodes.available[0].inflight == 0)


async def test_an_encoder_reply_that_is_not_json_is_a_retried_failure_of_that_encoder(caplog):
    async with router_stack(encoders=2) as s:
        for e in s.encoders:  # every encoder answers with a body that is not JSON
            e._encode = lambda body: web.Response(body=b"<html>oops</html>", content_type="application/json")
        with caplog.at_level(logging.WARNING, logger="epd_router"):
            r = await s.post(CHAT, chat(IMG_A), headers={"x-request-id": "req-u"})
        # Each encoder is tried once; neither reply can be used: the item goes raw to PD, which encodes it.
        assert r.status == 200
        assert [len(e.received) for e in s.encoders] == [1, 1]
        assert media_parts(s.decodes[0].bodies()[0])[0]["type"] == "image_url"
        for e in s.encoders:
            backend = e.url.split("//")[1]
            assert await metric(
                s, "epd_router_backend_errors_total", backend=backend, kind="reply", role="encoder"
            ) == [1]
        unusable = sorted(r.getMessage().split(": ", 1) for r in caplog.records if "reply unusable" in r.getMessage())
        assert [said for said, _ in unusable] == sorted(f"[req-u] encoder {e.url} reply unusable" for e in s.encoders)
        assert all(why.startswith("unexpected character") for _, why in unusable)  # what the JSON parser said


async def test_a_decode_5xx_whose_body_breaks_off_is_retried_and_then_a_502_of_its_own():
    # 500 with 40 bytes promised and 5 sent: the body is lost, so the client gets the router's own error
    broken = b'HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n{"err'
    async with RawBackend(broken) as url, router_stack(encoders=0) as s:
        s.router.decodes.update([DiscoveredEndpoint(url)])
        r = await s.post("/v1/chat/completions", chat(), headers={"x-request-id": "cut-1"})
        assert (r.status, r.json()["error"]["message"]) == (502, "decode failed (status)")
        assert r.headers["x-request-id"] == "cut-1"
        (ep,) = s.router.decodes.endpoints.values()
        assert ep.failures == 2  # both tries went to the only decode instance, each a failed status


async def test_a_lone_encoder_that_failed_an_item_gets_it_again():
    async with router_stack(encoders=1) as s:
        s.encoders[0].knobs.fail_next = 1
        r = await s.post(CHAT, chat(IMG_A))
        assert r.status == 200 and len(s.encoders[0].received) == 2
        assert media_parts(s.decodes[0].bodies()[0])[0]["type"] == "image_embeds"


@pytest.mark.parametrize(("max_batch", "calls"), [(0, 1), (1, 2)])
async def test_items_bound_for_one_encoder_share_a_call_up_to_the_batch_bound(max_batch, calls):
    async with router_stack(encoders=1, encoder_max_batch=max_batch) as s:
        r = await s.post(CHAT, chat(IMG_A, IMG_B))
        assert r.status == 200 and len(s.encoders[0].received) == calls
        assert [p["type"] for p in media_parts(s.decodes[0].bodies()[0])] == ["image_embeds"] * 2
        (ep,) = s.router.encoders.endpoints.values()
        assert ep.inflight == 0  # each call gave back as many in-flight units as it had items


async def test_an_encoder_rejecting_its_item_fails_the_request_and_cancels_the_other_encoders_call():
    async with router_stack(encoders=2, encoder_policy="round-robin") as s:
        first, second = s.encoders
        first.knobs.fail_always, first.knobs.fail_status = True, 400
        second.knobs.delay = 5
        r = await asyncio.wait_for(s.post(CHAT, chat(IMG_A, IMG_B)), 3)
        assert r.status == 400 and "scripted failure" in r.json()["error"]["message"]
        assert [len(e.received) for e in s.encoders] == [1, 1] and not s.decodes[0].received
        await wait_for(lambda: second.cancelled == 1)  # its call was cut, not left to run
        assert [ep.inflight for ep in s.router.encoders.endpoints.values()] == [0, 0]


async def test_an_item_whose_encoder_failed_beside_another_encoders_success_is_retried_there():
    async with router_stack(encoders=2, encoder_policy="round-robin") as s:
        s.encoders[0].knobs.fail_next = 1
        r = await s.post(CHAT, chat(IMG_A, IMG_B))
        assert r.status == 200 and [len(e.received) for e in s.encoders] == [1, 2]
        assert [p["type"] for p in media_parts(s.decodes[0].bodies()[0])] == ["image_embeds"] * 2


async def test_an_encoder_whose_accept_queue_is_full_is_a_timeout_at_the_connect_bound():
    with unaccepted_listener() as url:
        async with router_stack(encoders=0, connect_timeout=0.2, encode_timeout=30) as s:
            s.router.encoders.update([DiscoveredEndpoint(url)])
            r = await asyncio.wait_for(s.post(CHAT, chat(IMG_A)), 5)  # not the 30 s encode bound
            assert r.status == 200 and media_parts(s.decodes[0].bodies()[0])[0]["type"] == "image_url"
            backend = url.split("//")[1]
            errors = await metric(s, "epd_router_backend_errors_total", backend=backend, kind="timeout", role="encoder")
            assert errors == [2]  # the first round and the retry on the same, only, encoder


async def test_an_encoder_reply_whose_body_stalls_is_a_timeout_at_the_encode_bound():
    stalled = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n{"ec_tra'
    async with RawBackend(stalled, hold=True) as url, router_stack(encoders=0, encode_timeout=0.3) as s:
        s.router.encoders.update([DiscoveredEndpoint(url)])
        r = await asyncio.wait_for(s.post(CHAT, chat(IMG_A)), 5)
        assert r.status == 200 and media_parts(s.decodes[0].bodies()[0])[0]["type"] == "image_url"
        backend = url.split("//")[1]
        errors = await metric(s, "epd_router_backend_errors_total", backend=backend, kind="timeout", role="encoder")
        assert errors == [2]


async def test_prefills_that_drop_every_connection_are_a_502_naming_the_prefill_tier():
    async with router_stack(encoders=0, prefills=2, decodes=1) as s:
        for p in s.prefills:
            p.knobs.drop_next = 5
        r = await s.post(CHAT, chat(), headers={"x-request-id": "dropped-1"})
        assert (r.status, r.json()["error"]["message"]) == (502, "prefill failed (connect)")
        assert not s.decodes[0].received


@pytest.mark.parametrize(
    ("reply", "answer"),
    [
        (b"Content-Length: 0\r\n\r\n", (502, "application/json", "prefill failed (status)")),
        (b"Content-Type: text/plain\r\nContent-Length: 4\r\n\r\nbusy", (500, "text/plain", "busy")),
    ],
)
async def test_a_prefill_5xx_on_every_try_is_relayed_with_its_type_or_named_when_empty(reply, answer):
    head = b"HTTP/1.1 500 Internal Server Error\r\nConnection: close\r\n"
    async with RawBackend(head + reply) as url, router_stack(encoders=0, prefills=1, decodes=1) as s:
        s.router.prefills.update([DiscoveredEndpoint(url)])
        r = await s.post(CHAT, chat())
        body = r.json()["error"]["message"] if r.status == 502 else r.body.decode()
        assert (r.status, r.headers["Content-Type"], body) == answer
        assert not s.decodes[0].received


async def test_an_encoder_ejected_by_its_failure_leaves_the_retry_round_none_and_the_items_go_raw():
    async with router_stack(encoders=1, eject_after=1) as s:
        s.encoders[0].knobs.fail_next = 1
        r = await s.post(CHAT, chat(IMG_A, IMG_B))
        assert r.status == 200 and len(s.encoders[0].received) == 1 and not s.router.encoders.available
        assert [p["type"] for p in media_parts(s.decodes[0].bodies()[0])] == ["image_url"] * 2
        assert await metric(s, "epd_router_encoder_fallback_requests_total", reason="encoder_failed") == [1]
        assert await metric(s, "epd_router_items_total", outcome="fallback") == [2]


SSE_HEAD = (
    b"HTTP/1.1 %d OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
)


async def test_a_decode_reply_whose_body_breaks_off_is_retried_and_then_a_502_naming_the_read():
    broken = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n{"id'
    async with RawBackend(broken) as url, router_stack(encoders=0) as s:
        s.router.decodes.update([DiscoveredEndpoint(url)])
        r = await s.post(CHAT, chat())
        assert (r.status, r.json()["error"]["message"]) == (502, "decode failed (read)")
        backend = url.split("//")[1]
        assert await metric(s, "epd_router_backend_errors_total", backend=backend, kind="read", role="decode") == [2]


async def test_a_stream_that_breaks_before_its_first_chunk_is_retried_and_then_a_502_naming_the_read():
    async with RawBackend(SSE_HEAD % 200) as url, router_stack(encoders=0) as s:
        s.router.decodes.update([DiscoveredEndpoint(url)])
        r = await s.post(CHAT, chat(stream=True))
        assert (r.status, r.json()["error"]["message"]) == (502, "decode failed (read)")
        backend = url.split("//")[1]
        assert await metric(s, "epd_router_backend_errors_total", backend=backend, kind="read", role="decode") == [2]


@pytest.mark.parametrize(("status", "chunks"), [(200, b""), (422, b'17\r\ndata: {"error": "no"}\n\n\r\n')])
async def test_a_stream_is_relayed_with_its_status_and_no_cache_even_when_empty(status, chunks):
    async with RawBackend(SSE_HEAD % status + chunks + b"0\r\n\r\n") as url, router_stack(encoders=0) as s:
        s.router.decodes.update([DiscoveredEndpoint(url)])
        r = await s.post(CHAT, chat(stream=True), headers={"x-request-id": "sse-1"})
        assert (r.status, r.body) == (status, chunks[4:-2])
        assert (r.headers["Content-Type"], r.headers["Cache-Control"], r.headers["x-request-id"]) == (
            "text/event-stream",
            "no-cache",
            "sse-1",
        )


@pytest.mark.parametrize("stream", [False, True])
async def test_the_time_to_first_byte_is_observed_once_from_the_requests_arrival(stream):
    async with router_stack(encoders=0) as s:
        s.decodes[0].knobs.delay = 0.2
        assert (await s.post(CHAT, chat(stream=stream))).status == 200
        (count,) = await metric(s, "epd_router_stage_seconds_count", stage="ttfb")
        (took,) = await metric(s, "epd_router_stage_seconds_sum", stage="ttfb")
        assert count == 1 and 0.2 <= took < 5


async def test_a_stream_broken_after_the_first_byte_counts_against_its_decode_and_is_logged(caplog):
    async with router_stack(encoders=0, decodes=1) as s:
        s.decodes[0].knobs.break_stream_after = 1
        with caplog.at_level(logging.WARNING, logger="epd_router"):
            r = await s.post(CHAT, chat(stream=True), headers={"x-request-id": "broke-1"})
        assert r.status == 200  # the head went out with the first chunk; the stream ends where it broke
        backend = s.decodes[0].url.split("//")[1]
        assert await metric(s, "epd_router_backend_errors_total", backend=backend, kind="stream", role="decode") == [1]
        (said,) = [r.getMessage() for r in caplog.records if "broke after the first byte" in r.getMessage()]
        said_before, why = said.split(" broke after the first byte: ")
        assert said_before == f"[broke-1] decode stream from {s.decodes[0].url}" and why.startswith("TransportError(")


async def test_a_decode_that_accepts_no_connection_is_a_504_at_the_connect_bound():
    with unaccepted_listener() as url:
        async with router_stack(encoders=0, connect_timeout=0.2, decode_timeout=30) as s:
            s.router.decodes.update([DiscoveredEndpoint(url)])
            r = await asyncio.wait_for(s.post(CHAT, chat(stream=True)), 5)
            assert (r.status, r.json()["error"]["message"]) == (504, "decode failed (timeout)")


async def test_a_decode_nobody_listens_on_is_a_502_naming_the_connect():
    async with router_stack(encoders=0) as s:
        s.router.decodes.update([DiscoveredEndpoint("http://127.0.0.1:9")])
        r = await s.post(CHAT, chat(stream=True))
        assert (r.status, r.json()["error"]["message"]) == (502, "decode failed (connect)")
        errors = await metric(
            s, "epd_router_backend_errors_total", backend="127.0.0.1:9", kind="connect", role="decode"
        )
        assert errors == [2]


async def test_a_decode_5xx_on_every_try_is_relayed_with_its_content_type():
    reply = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n\r\nbusy"
    async with RawBackend(reply) as url, router_stack(encoders=0) as s:
        s.router.decodes.update([DiscoveredEndpoint(url)])
        r = await s.post(CHAT, chat(stream=True))
        assert (r.status, r.headers["Content-Type"], r.body) == (503, "text/plain", b"busy")


async def test_a_decode_that_says_nothing_is_a_504_at_the_decode_timeout():
    async with RawBackend(None) as url, router_stack(encoders=0, decode_timeout=0.3) as s:
        s.router.decodes.update([DiscoveredEndpoint(url)])
        r = await asyncio.wait_for(s.post(CHAT, chat(stream=True)), 5)
        assert (r.status, r.json()["error"]["message"]) == (504, "decode failed (timeout)")


async def test_with_reuse_on_an_item_behind_a_mutable_url_is_encoded_beside_a_reusable_one():
    data_url = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    async with router_stack(encoders=1, reuse_ttl=60) as s:
        for _ in range(2):
            assert (await s.post(CHAT, chat(IMG_A, data_url))).status == 200
        # the URL's item each time, the data URL's once: the second request reused it
        assert [len(media_parts(b)) for b in s.encoders[0].bodies()] == [2, 1]
        assert [p["type"] for p in media_parts(s.decodes[0].bodies()[1])] == [
            "image_embeds",
            "image_url",
        ]  # pinned reuse
