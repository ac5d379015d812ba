"""`make bench-autoscale`'s report from recorded runs (no cluster): the numbers the issue's targets are read
from (the new encoder's share, the scale-out window's latency, spilled items, failures) come out of the
record as the loop wrote it, for both runs."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bench import autoscale
from epd_operator.api.validation import parse_epd
from tests.support.autoscale_loop import (
    BIG_STEP,
    KEDA_LOOP,
    KEDA_TIMELINE,
    PROMETHEUS_PORT,
    TIMELINE,
    LoopConfig,
    LoopRecord,
    Sample,
    autoscaled_example,
    record_from_json,
    write_record,
)

T0 = 1_000_000.0  # the load step, Unix time


def record(spill_over: bool, new_requests: float = 50.0) -> LoopRecord:
    r = LoopRecord(LoopConfig(spill_over=spill_over))
    r.first_encoder, r.second_encoder, r.leaving_encoder = "vl-encoder-a", "vl-encoder-b", "vl-encoder-b"
    r.marks = {
        "load_start": T0 - 30,
        "light_start": T0 - 30,
        "step_start": T0,
        "scaled_up": T0 + 2,
        "second_ready": T0 + 100,
        "second_serving": T0 + 104,
        "light_after_start": T0 + 164,
        "scaled_down": T0 + 195,
        "left_gone": T0 + 220,
        "load_end": T0 + 230,
    }
    r.timeline = {name: T0 + 2 + i for i, (name, _) in enumerate(TIMELINE)}
    r.counts_at_second_ready = {"vl-encoder-a": 100.0, "vl-encoder-b": 0.0}
    r.counts_at_second_serving = {"vl-encoder-a": 110.0, "vl-encoder-b": 1.0}
    r.counts_at_step_end = {"vl-encoder-a": 160.0, "vl-encoder-b": 1.0 + new_requests}
    r.spilled = {"step_items": 12.0, "step_requests": 3.0, "items": 12.0, "requests": 3.0} if spill_over else {}
    r.scaled_up_hpa = {"conditions": [{"type": "ScalingActive", "status": "True", "reason": "ValidMetricFound"}]}
    r.autoscaling_active = {"status": "True", "reason": "ScalingActive"}
    # 10 requests in the scale-out window taking 1..10 s, 10 after it taking 0.1..1 s, one failure after.
    r.requests = [
        *({"phase": "step", "start": T0 + i, "end": T0 + i + (i + 1), "status": 200} for i in range(10)),
        *(
            {"phase": "step", "start": T0 + 110 + i, "end": T0 + 110 + i + 0.1 * (i + 1), "status": 200}
            for i in range(10)
        ),
        {"phase": "light_after", "start": T0 + 200, "end": T0 + 201, "status": 503},
    ]
    r.samples = [Sample(T0 + t, "step", 1 if t < 2 else 2, 1 if t < 100 else 2, 2, 6.0) for t in range(0, 160, 2)]
    r.series = {"inflight:vl-encoder-a": [(T0, 8.0), (T0 + 1, 9.0)], "waiting:vl-encoder-a": [(T0, 0.0)]}
    return r


def test_the_new_encoders_share_counts_from_its_first_request_served():
    r = record(True, new_requests=50.0)
    assert r.share_after_second() == {"vl-encoder-a": 50.0, "vl-encoder-b": 50.0}
    assert r.new_share() == pytest.approx(0.5)
    r.counts_at_second_serving = {}  # a record of a run from before that mark: from the readiness
    assert r.share_after_second() == {"vl-encoder-a": 60.0, "vl-encoder-b": 51.0}


def test_latencies_are_those_of_the_successful_requests_started_in_the_window():
    r = record(False)
    assert r.latencies("step_start", "second_serving") == [float(i + 1) for i in range(10)]
    assert r.latencies("second_serving", "light_after_start") == pytest.approx([0.1 * (i + 1) for i in range(10)])


def test_the_report_compares_both_runs_on_the_issues_targets(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(autoscale, "cpu_model", lambda: "a CPU")  # it reads the machine's
    runs = [record(False, new_requests=80.0), record(True, new_requests=50.0)]
    text = autoscale.report(runs, datetime(2026, 12, 3, tzinfo=UTC), 1800.0, (1.0, 2.0, 3.0), "abc1234")
    table = text.split("## Both runs")[1].split("\n\n")[1].splitlines()
    assert table[0] == "| | spill-over off | spill-over on |"
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in table[2:]}
    assert rows["seconds from the load step to the new encoder serving"] == ["104 s", "104 s |"]
    assert rows["timeline: pod created"] == ["3 s", "3 s |"]
    # p50 / p90 / p99 of 1..10 s (the last is the slowest) and of 0.1..1 s
    assert rows["client p50 / p90 / p99 during the scale-out window (requests)"][0] == "6.00 / 10.00 / 10.00 s (10)"
    assert rows["client p50 / p90 / p99 after it, to the step's end (requests)"][0] == "0.60 / 1.00 / 1.00 s (10)"
    share = "new encoder's share of encoder requests in the minute after it first served (target 35-65 %)"
    assert rows[share] == ["62%", "50% |"]
    assert rows["spilled items / requests (in the step; in the whole run)"] == ["0 / 0; 0 / 0", "12 / 3; 12 / 3 |"]
    assert rows["failed client requests (target 0), of all"] == ["1 of 21", "1 of 21 |"]
    assert "## Spill-over off" in text and "## Spill-over on" in text


def test_a_written_record_reads_back_into_the_same_report(tmp_path: Path):
    runs = [record(False), record(True)]
    path = tmp_path / "autoscale.json"
    autoscale.write_records(path, runs, datetime(2026, 12, 3, tzinfo=UTC), 1800.0, "abc1234")
    data = json.loads(path.read_text())
    back = autoscale.records_from_json(data)
    assert [r.config.spill_over for r in back] == [False, True]
    assert back[1].timeline == runs[1].timeline and back[1].spilled == runs[1].spilled
    # a single-run file from before both runs were recorded
    single = {"record": runs[0].to_json()}
    assert record_from_json(single["record"]).counts_at_step_end == runs[0].counts_at_step_end
    assert len(autoscale.records_from_json(single)) == 1


def keda_record() -> LoopRecord:
    """A KEDA run: 20 light requests at zero, a step whose first encoder serves 90 s in and whose second
    serves at 200 s, then light load back to zero at 300 s."""
    r = LoopRecord(KEDA_LOOP)
    r.first_encoder, r.second_encoder, r.leaving_encoder = "vl-encoder-a", "vl-encoder-b", "vl-encoder-a,vl-encoder-b"
    r.marks = {
        "load_start": T0 - 40,
        "light_start": T0 - 40,
        "step_start": T0,
        "activated": T0 + 6,
        "first_ready": T0 + 88,
        "first_serving": T0 + 90,
        "scaled_up": T0 + 20,
        "second_serving": T0 + 200,
        "light_after_start": T0 + 230,
        "scaled_down": T0 + 300,
        "left_gone": T0 + 330,
        "load_end": T0 + 360,
    }
    r.timeline = {name: T0 + 6 + i for i, (name, _) in enumerate(KEDA_TIMELINE)}
    r.counts_at_step_end = {"vl-encoder-a": 70.0, "vl-encoder-b": 30.0}
    r.statuses = {
        "idle": {
            "phase": "Ready",
            "encoder": {"ready": "0/0", "reason": "ScaledToZero"},
            "scaled_object": {"Ready": "True", "Active": "False"},
        },
        "zero_again": {"phase": "Ready", "encoder": {"ready": "0/0", "reason": "ScaledToZero"}},
        "raw_items_at_light_end": 20.0,
        "events": ["ScaledToZero"],
    }
    r.requests = [
        *({"phase": "light", "start": T0 - 40 + 2 * i, "end": T0 - 39 + 2 * i, "status": 200} for i in range(20)),
        *({"phase": "step", "start": T0 + 10 * i, "end": T0 + 10 * i + 4, "status": 200} for i in range(23)),
        {"phase": "light_after", "start": T0 + 320, "end": T0 + 340, "status": 200},
    ]
    r.samples = [Sample(T0 + t, "step", 0 if t < 6 else 2, 0 if t < 88 else 1, 2, 5.0, True) for t in range(0, 230, 2)]
    r.series = {"inflight:vl-encoder-a": [(T0 + 90, 3.0)]}
    return r


def test_the_keda_loop_asks_for_an_encoder_tier_from_zero_reading_the_loops_prometheus():
    docs = autoscaled_example(KEDA_LOOP)
    [epd] = [d for d in docs if d["kind"] == "EPDDeployment"]
    scaling = epd["spec"]["encoder"]["autoscaling"]
    assert (scaling["engine"], scaling["minReplicas"], scaling["maxReplicas"]) == ("KEDA", 0, 2)
    assert scaling["keda"]["prometheusAddress"] == f"http://127.0.0.1:{PROMETHEUS_PORT}"
    # Light load's demand (its items, raw at zero, until the consumer answers) is never above the activation
    # threshold (KEDA activates above it), the step's is far above it.
    assert KEDA_LOOP.light.clients * KEDA_LOOP.light.images <= scaling["keda"]["activationThreshold"]
    assert KEDA_LOOP.step.clients * KEDA_LOOP.step.images > KEDA_LOOP.target_per_pod
    parse_epd(epd)  # the API takes it
    assert "engine" not in autoscaled_example(LoopConfig())[-1]["spec"]["encoder"]["autoscaling"]


def test_the_keda_report_reads_the_issues_figures_from_the_record(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setattr(autoscale, "cpu_model", lambda: "a CPU")
    r = keda_record()
    path = tmp_path / "autoscale-keda.json"
    write_record(path, r, datetime(2026, 12, 3, tzinfo=UTC), 1500.0, "abc1234")
    [back] = autoscale.records_from_json(json.loads(path.read_text()))
    assert back.config.engine == "KEDA" and back.statuses == r.statuses and back.samples[-1].active is True
    text = autoscale.keda_report(back, datetime(2026, 12, 3, tzinfo=UTC), 1500.0, (1.0, 2.0, 3.0), "abc1234")
    cells = (line.strip("| ").split(" | ") for line in text.splitlines() if " | " in line)
    rows = {row[0]: row[1] for row in cells if len(row) > 1}
    assert (
        rows["**seconds from the step's first request to an encoder serving** (its vLLM counter moves)"] == "**90 s**"
    )
    assert rows["timeline: KEDA activates the tier (encoder Deployment 0 → 1, as the loop's 1 s poll sees it)"] == "6 s"
    assert rows["step ends → tier at zero (replicas 0)"] == "70 s"
    assert rows["tier at zero → last encoder gone (preStop, vLLM's shutdown)"] == "30 s"
    assert rows["**failed client requests, whole run (target 0)**"] == "**0 of 44**"
    assert rows["failed client requests while the last encoders drained (target 0)"] == "0 of 1"
    assert rows["light load, tier at zero (served raw by the consumer)"] == "20"
    assert rows["encoder requests each encoder answered by the step's end"] == "`vl-encoder-a` 70, `vl-encoder-b` 30"


def big_record(spill_over: bool) -> LoopRecord:
    """A run of `make bench-autoscale`'s step: the HPA asks for 4 two seconds in, an item spills at once (spill-over
    on), the new encoders answer their first request at 300, 320 and 350 s."""
    r = record(spill_over)
    r.config = dataclasses.replace(BIG_STEP, spill_over=spill_over)
    r.marks |= {"second_serving": T0 + 300, "all_serving": T0 + 350, "light_after_start": T0 + 370}
    r.decisions = [
        {"t": T0 + 2, "order": 2, "size": 4, "reason": "EPDDeployment metric epd_router_encoder_demand above target"}
    ]
    r.serving = {"vl-encoder-c": T0 + 320, "vl-encoder-b": T0 + 300, "vl-encoder-d": T0 + 350}
    # the routers' spilled items as Prometheus scraped them: none before the step, the first one a second in
    r.series["spilled:total"] = [(T0 + 1, 2.0), (T0 + 2, 8.0)] if spill_over else []
    return r


def test_the_big_step_needs_every_encoder_maxreplicas_allows_and_the_example_asks_for_them():
    assert BIG_STEP.step.clients * BIG_STEP.step.images >= 3 * BIG_STEP.target_per_pod  # three encoders' worth or more
    assert BIG_STEP.needed == BIG_STEP.max_replicas == 4
    assert LoopConfig().needed == 2 and KEDA_LOOP.needed == 2  # the node tests' loops: one new encoder
    [epd] = [d for d in autoscaled_example(BIG_STEP) if d["kind"] == "EPDDeployment"]
    scaling = epd["spec"]["encoder"]["autoscaling"]
    assert (scaling["minReplicas"], scaling["maxReplicas"], scaling["load"]) == (1, 4, {"targetPerPod": 1})
    parse_epd(epd)
    # light load never asks for a second encoder: its demand is at most the target
    assert BIG_STEP.light.clients * BIG_STEP.light.images <= BIG_STEP.target_per_pod


def test_the_big_step_report_has_the_first_decision_the_first_spill_and_every_encoder_serving(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setattr(autoscale, "cpu_model", lambda: "a CPU")
    runs = [big_record(False), big_record(True)]
    text = autoscale.report(runs, datetime(2026, 12, 5, tzinfo=UTC), 1800.0, (1.0, 2.0, 3.0), "abc1234")
    assert text.startswith("# Encoder autoscaling loop on real pods (`make bench-autoscale`)")
    table = text.split("## Both runs")[1].split("\n\n")[1].splitlines()
    rows = {line.split(" | ")[0].lstrip("| "): [v.rstrip(" |") for v in line.split(" | ")[1:]] for line in table[2:]}
    names = list(rows)
    assert names[0].startswith("first scale-up decision") and names[1].startswith("first spilled request")
    assert rows[names[0]] == ["4 (the load needs 4), 2 s", "4 (the load needs 4), 2 s"]
    assert rows[names[1]] == ["none (spill-over off)", "1 s"]
    assert rows["every needed encoder serving (4: the first and 3 new), seconds since the step"] == ["350 s", "350 s"]
    assert rows["each new encoder's first request from the router, seconds since the step"][0] == "300 s, 320 s, 350 s"
    # the 20 requests of the step, all started before every encoder served
    assert rows["client p50 / p90 / p99 from the step until every needed encoder serves (requests)"][0] == (
        "1.00 / 9.00 / 10.00 s (20)"
    )
    assert "maxReplicas: 4" in text and "step = 4 closed-loop clients × 2 images per request" in text
    assert "**every needed encoder (4) serving** | **350 s**" in text


def test_a_record_without_the_big_steps_fields_reads_back(tmp_path: Path):
    runs = [big_record(False), big_record(True)]
    path = tmp_path / "autoscale.json"
    autoscale.write_records(path, runs, datetime(2026, 12, 5, tzinfo=UTC), 1800.0, "abc1234")
    back = autoscale.records_from_json(json.loads(path.read_text()))
    assert back[1].decisions == runs[1].decisions and back[1].serving == runs[1].serving
    assert back[1].config == runs[1].config
    assert autoscale.first_spill(back[1]) == T0 + 1
    old = runs[0].to_json()  # a record from before maxReplicas, the decisions and the serving times were kept
    del old["decisions"], old["serving"], old["config"]["max_replicas"], old["config"]["all_serving_timeout"]
    assert record_from_json(old).config.max_replicas == 2 and record_from_json(old).decisions == []


def test_the_profiles_run_spill_over_off_then_on():
    for configs, _ in autoscale.PROFILES.values():
        assert [c.spill_over for c in configs] == [False, True]
    assert autoscale.PROFILES["big"][1] == "autoscale" and autoscale.PROFILES["big"][0][0].max_replicas == 4
