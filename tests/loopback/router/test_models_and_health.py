"""The router's routes beside chat in process: /v1/models relayed from a decode instance, /health's report
and status (the vLLM proxy's vocabulary), /livez, what /v1/completions refuses, and a drain (in process)."""

from __future__ import annotations

import asyncio
import re

import aiohttp
import orjson
import pytest

from epd_operator.router.backends import DiscoveredEndpoint
from epd_operator.router.config import RouterConfig
from epd_operator.router.main import listening_socket
from epd_operator.router.server import Router
from tests.support.raw_backend import RawBackend, unaccepted_listener
from tests.support.router_stack import request_counts, router_stack


async def test_models_come_from_a_decode_instance_as_it_answered():
    async with router_stack(encoders=0) as s:
        r = await s.get("/v1/models", headers={"x-request-id": "req-7", "Authorization": "Bearer t"})
        assert (r.status, r.headers["Content-Type"], r.headers["x-request-id"]) == (200, "application/json", "req-7")
        assert orjson.loads(r.body)["data"][0]["id"] == "fake-model"
        (sent,) = s.decodes[0].received
        assert (sent.path, sent.headers["x-request-id"], sent.headers["Authorization"]) == (
            "/v1/models",
            "req-7",
            "Bearer t",
        )
        assert sent.headers["Accept-Encoding"] == "identity"
        assert request_counts(s.router)[("/v1/models", "200")] == 1


async def test_a_request_id_the_router_cannot_pass_on_is_replaced():
    async with router_stack(encoders=0) as s:
        r = await s.get("/v1/models", headers={"x-request-id": "has space"})
        rid = r.headers["x-request-id"]
        assert rid != "has space" and len(rid) == 32 and int(rid, 16) >= 0
        assert s.decodes[0].received[0].headers["x-request-id"] == rid
        assert "Authorization" not in s.decodes[0].received[0].headers
        r = await s.get("/v1/models")
        assert len(r.headers["x-request-id"]) == 32


async def test_models_without_a_decode_instance_is_503():
    async with router_stack(encoders=0) as s:
        s.router.decodes.update([])
        r = await s.get("/v1/models", headers={"x-request-id": "req-8"})
        assert (r.status, r.headers["x-request-id"]) == (503, "req-8")
        assert orjson.loads(r.body)["error"] == {
            "message": "no decode endpoint available",
            "type": "service_unavailable",
            "param": None,
            "code": 503,
        }
        assert request_counts(s.router)[("/v1/models", "503")] == 1


async def test_models_from_a_decode_instance_that_does_not_answer_is_502_and_counts_against_it():
    async with router_stack(encoders=0) as s:
        s.router.decodes.update([DiscoveredEndpoint("http://127.0.0.1:9")])  # nothing listens on the discard port
        r = await s.get("/v1/models", headers={"x-request-id": "req-9"})
        assert (r.status, r.headers["x-request-id"]) == (502, "req-9")
        error = orjson.loads(r.body)["error"]
        assert error["message"].startswith("decode /v1/models failed: ") and error["type"] == "upstream_error"
        (ep,) = s.router.decodes.endpoints.values()
        assert ep.failures == 1
        assert request_counts(s.router)[("/v1/models", "502")] == 1
        kinds = {
            x.labels["kind"]: x.value
            for family in s.router.metrics.registry.collect()
            for x in family.samples
            if x.name == "epd_router_backend_errors_total" and x.labels["role"] == "decode"
        }
        assert kinds == {"connect": 1}


async def test_models_relays_the_decode_status_and_says_json_where_the_instance_named_no_type():
    reply = b'HTTP/1.1 401 Unauthorized\r\nContent-Length: 13\r\nConnection: close\r\n\r\n{"err": "no"}'
    async with RawBackend(reply) as url, router_stack(encoders=0) as s:
        s.router.decodes.update([DiscoveredEndpoint(url)])
        r = await s.get("/v1/models", headers={"x-request-id": "req-10"})
        assert (r.status, r.headers["Content-Type"], r.body) == (401, "application/json", b'{"err": "no"}')
        assert request_counts(s.router)[("/v1/models", "401")] == 1


async def test_models_from_a_decode_instance_that_holds_its_answer_is_502_after_the_prefill_timeout():
    async with RawBackend(None) as url, router_stack(encoders=0, prefill_timeout=0.3) as s:
        s.router.decodes.update([DiscoveredEndpoint(url)])
        r = await asyncio.wait_for(s.get("/v1/models", headers={"x-request-id": "req-11"}), 5)
        assert (r.status, orjson.loads(r.body)["error"]["type"]) == (502, "upstream_error")
        (ep,) = s.router.decodes.endpoints.values()
        assert ep.failures == 1


async def test_metrics_on_the_serving_port_are_prometheus_text():
    async with router_stack(encoders=0) as s:
        r = await s.get("/metrics")
        assert r.status == 200 and r.headers["Content-Type"] == "text/plain; version=1.0.0; charset=utf-8"
        assert b"epd_router_requests_total" in r.body


async def test_health_reports_each_tier_and_serves_while_consumers_do():
    async with router_stack(encoders=1, prefills=1, decodes=1) as s:
        r = await s.get("/health")
        assert (r.status, r.headers["Content-Type"]) == (200, "application/json")
        report = orjson.loads(r.body)
        assert {k: report[k] for k in ("proxy", "encode_cluster", "prefill_cluster", "decode_cluster")} == {
            "proxy": "healthy",
            "encode_cluster": "healthy",
            "prefill_cluster": "healthy",
            "decode_cluster": "healthy",
        }
        assert sorted(report["tiers"]) == ["decode", "encoder", "prefill"]
        assert [e["url"] for e in report["tiers"]["prefill"]] == [s.prefills[0].url]
        s.router.encoders.update([])  # without encoders the consumers encode: still serving
        assert (await s.get("/health")).status == 200
        s.router.prefills.update([])
        r = await s.get("/health")
        assert r.status == 503 and orjson.loads(r.body)["prefill_cluster"] == "empty"


async def test_health_of_e_pd_without_decode_or_while_draining_is_503():
    async with router_stack(encoders=1) as s:
        report = orjson.loads((await s.get("/health")).body)
        assert report["prefill_cluster"] == "disabled"
        s.router.draining.set()
        r = await s.get("/health")
        assert r.status == 503 and orjson.loads(r.body)["proxy"] == "draining"
        s.router.draining.clear()
        s.router.decodes.update([])
        assert (await s.get("/health")).status == 503


async def test_completions_refuse_client_prompt_embeds_unless_allowed():
    doc = {"model": "m", "prompt": "x", "prompt_embeds": "AAAA", "max_tokens": 2}
    async with router_stack(encoders=0) as s:
        r = await s.post("/v1/completions", doc)
        assert r.status == 400 and not s.decodes[0].received
        assert orjson.loads(r.body)["error"] == {
            "message": "prompt_embeds are not accepted from clients by this router",
            "type": "invalid_request_error",
            "param": "prompt_embeds",
            "code": 400,
        }
    async with router_stack(encoders=0, allow_client_embeds=True) as s:
        assert (await s.post("/v1/completions", doc)).status == 200
        assert s.decodes[0].bodies("/v1/completions")[0]["prompt_embeds"] == "AAAA"


async def test_livez_is_answered_by_the_router_itself_whatever_its_backends():
    async with router_stack(encoders=0) as s:
        s.router.decodes.update([])  # no backend at all: /health says 503, /livez still 200
        r = await s.get("/livez")
        assert (r.status, r.body, r.headers["Content-Type"].split(";")[0]) == (200, b"ok", "text/plain")
        assert (await s.get("/health")).status == 503


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def in_flight(s, decode_delay: float) -> asyncio.Task:
    """A chat request the decode instance holds for `decode_delay` seconds, once it has reached it."""
    s.decodes[0].knobs.delay = decode_delay
    asked = asyncio.create_task(s.post("/v1/chat/completions", CHAT))
    async with asyncio.timeout(5):
        while not s.decodes[0].received:
            await asyncio.sleep(0.01)
    return asked


async def test_a_drain_lets_the_request_in_flight_finish_says_so_and_stops_listening(caplog):
    async with router_stack(encoders=0) as s:
        asked = await in_flight(s, 0.5)
        with caplog.at_level("INFO", logger="epd_router"):
            assert s.server is not None
            drained = asyncio.create_task(s.server.shutdown(10))
            async with asyncio.timeout(5):
                while not s.router.draining.is_set():
                    await asyncio.sleep(0.01)
                assert (await asyncio.wait_for(asked, 5)).status == 200  # answered, not cut
                await drained
        messages = [r.getMessage() for r in caplog.records]
        assert (
            messages[0] == "draining: not accepting connections; in flight: 1 requests on 1 connections; deadline 10 s"
        )
        took = re.fullmatch(r"drained in (\d+\.\d) s: every request in flight answered", messages[-1])
        assert took and 0.3 <= float(took[1]) < 10  # the request in flight held the drain for its 0.5 s
        with pytest.raises(aiohttp.ClientConnectionError):  # not listening any more
            await s.get("/livez")


async def test_a_drain_past_its_deadline_cuts_what_is_left_and_says_so(caplog):
    async with router_stack(encoders=0) as s:
        asked = await in_flight(s, 5)
        with caplog.at_level("INFO", logger="epd_router"):
            assert s.server is not None
            await asyncio.wait_for(s.server.shutdown(0.2), 5)
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert warnings == ["drain deadline (0.2 s) reached: cut 1 requests still in flight"]
        with pytest.raises(aiohttp.ClientError):
            await asyncio.wait_for(asked, 5)


async def test_models_from_a_decode_instance_that_accepts_no_connection_is_502_at_the_connect_bound():
    with unaccepted_listener() as url:
        async with router_stack(encoders=0, connect_timeout=0.2, prefill_timeout=30) as s:
            s.router.decodes.update([DiscoveredEndpoint(url)])
            r = await asyncio.wait_for(s.get("/v1/models"), 5)  # not the 30 s the whole call may take
            assert r.status == 502


def test_the_router_builds_its_parts_from_its_config():
    config = RouterConfig(
        decode_urls=["http://d:8000"],
        prefill_urls=["http://p:8000"],
        decode_dp_size=2,
        prefill_dp_size=2,
        ec_consumer_tp_size=2,
        load_factor=1.5,
        reuse_max_items=7,
        pd_policy="prefix-aware",
    )
    router = Router(config)
    assert router.prefills is not None
    assert (router.prefills.zmq_rank_stride, router.decodes.zmq_rank_stride) == (2, 2)
    assert (router.prefills.dp_size, router.decodes.dp_size) == (2, 2)
    pickers = [router.encoder_picker, *router.pd_pickers.values()]
    assert [getattr(p, "load_factor", None) for p in pickers] == [1.5, 1.5, 1.5]
    assert router.reuse.max_items == 7


async def test_a_router_stopped_before_it_started_has_nothing_to_close():
    await Router(RouterConfig(decode_urls=["http://d:8000"])).stop()


async def test_the_background_work_is_named_and_probes_give_up_at_the_health_timeout():
    async with RawBackend(None) as hung, router_stack(encoders=0, health_interval=30, health_timeout=0.2) as s:
        assert sorted(t.get_name() for t in s.router._tasks) == ["demand", "health"]
        s.router.decodes.update([DiscoveredEndpoint(hung)])
        await asyncio.wait_for(s.router.health.check_all(), 3)  # not the session's 5 minutes
        (ep,) = s.router.decodes.endpoints.values()
        assert ep.failures == 1


async def test_each_answer_is_logged_with_its_id_route_status_and_time_when_asked(caplog):
    async with router_stack(encoders=0, log_requests=True) as s:
        s.decodes[0].knobs.delay = 0.2
        with caplog.at_level("INFO", logger="epd_router"):
            assert (await s.post("/v1/chat/completions", CHAT, headers={"x-request-id": "log-1"})).status == 200
        (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("log-1 ")]
        took = re.fullmatch(r"log-1 /v1/chat/completions 200 (\d+\.\d) ms", line)
        total = s.router.metrics.registry.get_sample_value("epd_router_stage_seconds_sum", {"stage": "total"})
        assert total is not None and 0.2 <= total < 5
        assert took and abs(float(took[1]) - total * 1e3) < 0.06  # the same time, in milliseconds


async def test_a_router_on_ipv6_gives_a_url_that_reaches_it():
    router = Router(RouterConfig(decode_urls=["http://127.0.0.1:9"], health_interval=0))
    server = await router.serve(listening_socket("::1", 0))
    try:
        assert server.url.startswith("http://[::1]:")
        async with aiohttp.ClientSession() as session, session.get(server.url + "/livez") as r:
            assert (r.status, await r.read()) == (200, b"ok")
    finally:
        await server.cleanup()


async def test_stopping_takes_the_background_work_down_whatever_became_of_it():
    async with router_stack(encoders=0, health_interval=0, demand_window=0) as s:
        assert s.router._tasks == []  # no probes, no demand window: nothing in the background

    router = Router(RouterConfig(decode_urls=["http://127.0.0.1:9"], health_interval=0))

    async def broken() -> None:
        raise RuntimeError("a bug")

    router.pipeline.encoding.demand.run = broken  # type: ignore[method-assign]
    await router.start()
    await asyncio.sleep(0)  # the demand task ran and failed
    await router.stop()  # and stop does not raise it
