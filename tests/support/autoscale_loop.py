"""The encoder autoscaling loop on the real node: real load through the router Service, real metrics,
kube-controller-manager's HPA, real vLLM encoder pods coming and going.

- :func:`metrics_pipeline`: Prometheus (Debian's package) and, for the HPA engine, prometheus-adapter
  (dev/parts/prometheus_adapter.py) inside the node's network namespace, where pod IPs answer. Prometheus scrapes the routers' `metrics`
  port and the vLLM pods' /metrics every second, labelled as the chart's PodMonitors label them
  (`namespace`, `pod`); Debian builds Prometheus without Kubernetes discovery, so the loop lists the
  EPDDeployment's pods and keeps a file of targets up to date. The adapter runs the operator chart's
  rules unchanged and is registered as the custom.metrics.k8s.io APIService (the API server reaches
  it through the node bridge, its egress to the cluster).
- :func:`run_loop`: applies examples/epd-local-cpu.yaml with an autoscaled encoder tier (router
  spill-over on or off), then light load, a load step, light load again, and records what happened:
  every client request's status, the encoder Deployment, the HPA and the EPDDeployment every two
  seconds, the new encoder's way from the HPA's decision to the router's first request (the
  timeline: pod created, container started, vLLM listening, startup probe passed, Ready, in the
  EndpointSlice), each encoder's own `vllm:request_success_total`, the routers' spill-over counters,
  and Prometheus' series of the load the HPA reads. :func:`run_loops` runs it once per config, each
  on a fresh EPDDeployment.
- The same loop with the KEDA engine (`LoopConfig(engine="KEDA")`, :data:`KEDA_LOOP`): the encoder tier
  from 0 to 2 and back to 0. KEDA's operator and metrics server run in the node's network namespace too
  (`cluster.start_part("keda")`), where its Prometheus trigger reaches the loop's Prometheus; light load at
  zero is served raw by the consumer, the step wakes the tier, and after the step the tier goes back to
  zero while light load keeps coming.

The node tests (tests/node/test_autoscaling_loop.py, tests/node/test_keda_loop.py) assert on the record; the benchmark (tests/node/test_autoscaling_loop.py) asserts on the record; the benchmark
(bench/autoscale.py, `--keda`) reports it. The local API server has no front-proxy certificates, so it calls
aggregated APIs anonymously: the anonymous user may read custom.metrics.k8s.io while the pipeline runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from epd_operator.router.contract import ENCODER_DEMAND_METRIC
from tests.support.cluster import CUSTOM_METRICS_GROUP as GROUP
from tests.support.cluster import EPD_API, cluster_objects, custom_metrics_api, wait_for
from tests.support.metric_processes import Processes, adapter_argv
from tests.support.mission import REPO, Mission, all_ready, describe, load_clients, remove
from tests.support.real_node import is_ready

EXAMPLE = REPO / "examples" / "epd-local-cpu.yaml"
LOAD = ENCODER_DEMAND_METRIC
SERVED = "tiny-vl"
# Inside the node's network namespace nothing else listens on these.
PROMETHEUS_PORT, ADAPTER_PORT = 19090, 16443


@dataclass(frozen=True)
class Phase:
    clients: int
    images: int  # per request, each never sent before
    pause: float  # seconds a client waits after each answer

    def line(self, name: str) -> str:
        return f"{name} {self.clients} {self.images} {self.pause}\n"


@dataclass(frozen=True)
class LoopConfig:
    target_per_pod: int = 4  # the encoder load target (items in flight per pod): the default
    scale_down_window: int = 30  # seconds (behavior.scaleDown.stabilizationWindowSeconds)
    light: Phase = Phase(clients=1, images=1, pause=1.0)  # at most 1 item in flight
    step: Phase = Phase(clients=4, images=4, pause=0.0)  # up to 16 items in flight
    light_seconds: float = 30  # before the step
    share_seconds: float = 60  # of step load after the second encoder serves
    tail_seconds: float = 10  # of light load after the leaving encoder is gone
    scale_up_timeout: float = 300  # from the step to the HPA's 2
    second_ready_timeout: float = 600  # a vLLM CPU pod starting on busy shared cores
    scale_down_timeout: float = 300
    spill_over: bool = True  # spec.router.spillOver.enabled (the deployment's default: on)
    # The autoscaler: an HPA (1 to 2 encoders) or KEDA (0 to 2), with KEDA's polling interval, cooldown
    # before zero and activation threshold (items of the encoder demand).
    engine: str = "HPA"
    keda_polling: int = 5
    keda_cooldown: int = 30
    keda_activation: float = 1.0
    second_timeout: float = 180  # KEDA: from the first encoder serving to its HPA's 2, if the load asks for it
    max_replicas: int = 2  # the HPA's maxReplicas (KEDA's maxReplicaCount)
    all_serving_timeout: float = 900  # from the second encoder serving to every needed one serving

    @property
    def needed(self) -> int:
        """Encoders the step's load needs: its items in flight at the target per pod, within maxReplicas."""
        return min(self.max_replicas, -(-self.step.clients * self.step.images // self.target_per_pod))


@dataclass
class Sample:
    t: float  # Unix time
    phase: str
    replicas: int  # the encoder Deployment's spec (the HPA writes it)
    ready: int  # its ready pods
    desired: int | None  # the HPA's desiredReplicas
    load: float | None  # the HPA's current average of the load metric
    active: bool | None = None  # KEDA: the ScaledObject's Active condition


@dataclass
class LoopRecord:
    config: LoopConfig
    marks: dict[str, float] = field(default_factory=dict)  # event -> Unix time
    first_encoder: str = ""
    second_encoder: str = ""
    leaving_encoder: str = ""
    scaled_up_hpa: dict[str, Any] = field(default_factory=dict)  # the HPA's status once it asked for 2
    autoscaling_active: dict[str, Any] = field(default_factory=dict)  # the EPDDeployment's condition then
    counts_at_second_ready: dict[str, float] = field(default_factory=dict)  # vllm:request_success_total per encoder
    counts_at_second_serving: dict[str, float] = field(default_factory=dict)
    counts_at_step_end: dict[str, float] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)  # one per client request
    samples: list[Sample] = field(default_factory=list)
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # from Prometheus
    # The new encoder's way to serving: event -> Unix time (TIMELINE names them, in order).
    timeline: dict[str, float] = field(default_factory=dict)
    # The routers' spill-over counters (summed over router pods) at the step's end and the load's end.
    spilled: dict[str, float] = field(default_factory=dict)
    # KEDA: the EPDDeployment and the ScaledObject as the loop found them at its stages (idle at zero,
    # activated, back at zero), and the media items the routers sent raw at the light phase's end.
    statuses: dict[str, Any] = field(default_factory=dict)
    # The HPA's rescale Events after the step, in the order it made them: {"t": Unix time (the Event's, 1 s
    # resolution), "size": the replicas it set, "reason": its words}; the first is the first scale-up decision.
    decisions: list[dict[str, Any]] = field(default_factory=list)
    # Each new encoder's first answer to the router (its vLLM counter moved from 0, as the loop's 1 s poll saw it).
    serving: dict[str, float] = field(default_factory=dict)

    def failures(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["status"] != 200]

    def share_after_second(self) -> dict[str, float]:
        """Encoder requests each encoder answered in the `share_seconds` after the second first served
        (records of runs before that mark: from the second's readiness) to the step's end."""
        base = self.counts_at_second_serving or self.counts_at_second_ready
        return {pod: self.counts_at_step_end[pod] - base.get(pod, 0.0) for pod in self.counts_at_step_end}

    def new_share(self) -> float:
        """The new encoder's share (0..1) of the encoder requests in `share_after_second`."""
        share = self.share_after_second()
        total = sum(share.values())
        return share.get(self.second_encoder, 0.0) / total if total else 0.0

    def latencies(self, start: str, end: str) -> list[float]:
        """Seconds each successful client request took, of those that started between two marks."""
        lo, hi = self.marks[start], self.marks[end]
        return sorted(r["end"] - r["start"] for r in self.requests if r["status"] == 200 and lo <= r["start"] < hi)

    def since(self, mark: str, until: str) -> float:
        return self.marks[until] - self.marks[mark]

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("config", "samples")}
        out["config"] = {k: (v.__dict__ if isinstance(v, Phase) else v) for k, v in self.config.__dict__.items()}
        out["samples"] = [s.__dict__ for s in self.samples]
        return out


def write_record(path: Path, record: LoopRecord, started: datetime, wall: float, commit: str = "") -> None:
    """The record with when the run started, at which commit, how long it took and the load average
    at its end, as `python -m bench.autoscale --from-record` reads it."""
    raw = {
        "started": started.isoformat(),
        "commit": commit or "not recorded",
        "wall": wall,
        "load_average": os.getloadavg(),
        "record": record.to_json(),
    }
    path.write_text(json.dumps(raw, indent=1))


def record_from_json(data: dict[str, Any]) -> LoopRecord:
    """A record as :meth:`LoopRecord.to_json` wrote it."""
    raw = data["config"]
    values: dict[str, Any] = {k: Phase(**v) if isinstance(v, dict) else v for k, v in raw.items()}
    config = LoopConfig(**values)
    fields = {k: v for k, v in data.items() if k not in ("config", "samples", "series")}
    record = LoopRecord(config, **fields)
    record.samples = [Sample(**s) for s in data["samples"]]
    record.series = {k: [(float(t), float(v)) for t, v in points] for k, points in data["series"].items()}
    return record


# The new encoder's way from the HPA's decision to the router's first request, in order: what each
# is read from is in _Loop.observe and _Loop.settle_timeline.
TIMELINE = (
    ("hpa_decision", "HPA decision (its lastScaleTime)"),
    ("pod_created", "pod created"),
    ("container_started", "container started"),
    ("vllm_listening", "vLLM listening (/health answers)"),
    ("startup_probe_passed", "startup probe passed"),
    ("ready", "pod Ready"),
    ("endpointslice_ready", "EndpointSlice lists it ready"),
    ("router_first_request", "router's first request (its vLLM counter moves)"),
)


def rfc3339(value: str | None) -> float | None:
    """A Kubernetes timestamp (seconds resolution) as Unix time."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def autoscaled_example(config: LoopConfig) -> list[dict[str, Any]]:
    """examples/epd-local-cpu.yaml with `spec.encoder.autoscaling` (1 to `max_replicas` encoders on their
    load; with KEDA from 0, reading the loop's Prometheus) and the router's spill-over on or off."""
    docs = list(yaml.safe_load_all(EXAMPLE.read_text()))
    epd = next(d for d in docs if d["kind"] == "EPDDeployment")
    epd["spec"].setdefault("router", {})["spillOver"] = {"enabled": config.spill_over}
    autoscaling: dict[str, Any] = {
        "minReplicas": 1,
        "maxReplicas": config.max_replicas,
        "load": {"targetPerPod": config.target_per_pod},
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": config.scale_down_window}},
    }
    if config.engine == "KEDA":
        autoscaling |= {
            "engine": "KEDA",
            "minReplicas": 0,
            "keda": {
                # KEDA's operator runs in the node's network namespace, beside the loop's Prometheus.
                "prometheusAddress": f"http://127.0.0.1:{PROMETHEUS_PORT}",
                "pollingInterval": config.keda_polling,
                "cooldownPeriod": config.keda_cooldown,
                "activationThreshold": config.keda_activation,
            },
        }
    epd["spec"]["encoder"]["autoscaling"] = autoscaling
    return docs


# ---------------------------------------------------------------- the metrics pipeline


@dataclass(kw_only=True)
class Pipeline(Processes):
    """Prometheus and prometheus-adapter (its processes, `Processes`) scraping the mission's pods. The fault
    table (tests/support/fault_table.py) stops one and starts it again, as a metric source lost for a while."""

    m: Mission
    targets: Path
    written: str = ""

    def prometheus_ready(self) -> bool:
        try:
            return self.m.in_node(f"http://127.0.0.1:{PROMETHEUS_PORT}/-/ready", timeout=5)[0] == 200
        except AssertionError:  # not listening yet
            return False

    def adapter_available(self) -> bool:
        """The custom metrics APIService is Available: the API server reaches the adapter."""
        _, body = self.m.kube.request("GET", f"/apis/apiregistration.k8s.io/v1/apiservices/v1beta2.{GROUP}")
        conditions = (body.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)

    def discover(self) -> None:
        """What the chart's PodMonitors scrape, as Prometheus' file discovery reads it: each router
        pod's `metrics` port and each vLLM pod's, labelled with `namespace` and `pod`."""
        groups = []
        for pod in self.m.kube.pods(**{"app.kubernetes.io/instance": self.m.name}):
            role = pod["metadata"]["labels"].get("serving.epd.dev/role")
            ip = pod.get("status", {}).get("podIP")
            if not ip or role is None:
                continue
            port = 9090 if role == "router" else 8000
            labels = {"namespace": self.m.kube.ns, "pod": pod["metadata"]["name"]}
            groups.append({"targets": [f"{ip}:{port}"], "labels": labels})
        text = json.dumps(sorted(groups, key=lambda g: g["labels"]["pod"]))
        if text != self.written:
            partial = self.targets.with_suffix(".partial")
            partial.write_text(text)
            partial.replace(self.targets)  # Prometheus never reads half a file
            self.written = text

    def prometheus(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        status, text = self.m.in_node(f"http://127.0.0.1:{PROMETHEUS_PORT}/api/v1/{path}?{query}", timeout=30)
        assert status == 200, text[:500]
        return json.loads(text)["data"]

    def range(self, query: str, start: float, end: float) -> dict[str, list[tuple[float, float]]]:
        """A range query at 1 s resolution: series (by their `pod` or `backend_pod` label) -> points."""
        data = self.prometheus("query_range", query=query, start=f"{start:.3f}", end=f"{end:.3f}", step="1")
        out = {}
        for series in data["result"]:
            labels = series["metric"]
            key = labels.get("backend_pod") or labels.get("pod") or "total"
            out[key] = [(float(t), float(v)) for t, v in series["values"]]
        return out


def _prometheus_config(tmp: Path, targets: Path) -> Path:
    # Debian's Prometheus is built without Kubernetes service discovery: the targets come from a file
    # the loop keeps up to date from the API server (Pipeline.discover), labelled as a PodMonitor
    # labels them.
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {"job_name": "epd-pods", "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}]}
        ],
    }
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.contextmanager
def metrics_pipeline(m: Mission, tmp: Path, *, adapter: bool = True) -> Iterator[Pipeline]:
    """Prometheus in the node's network namespace and, with `adapter` (the HPA engine), prometheus-adapter
    (the chart's rules) beside it serving custom.metrics.k8s.io; stopped and unregistered on exit. KEDA
    (no adapter) reads Prometheus itself."""
    prometheus = shutil.which("prometheus")
    assert prometheus is not None, "Prometheus is not installed (apt-get install prometheus; `make test-tools`)"
    node = m.cluster.real_node()
    logs = {"prometheus": tmp / "prometheus.log", "adapter": tmp / "adapter.log"}
    pipeline = Pipeline(m=m, logs=logs, targets=tmp / "targets.json")
    pipeline.discover()
    pipeline.argv["prometheus"] = node.netns_argv(
        prometheus,
        f"--config.file={_prometheus_config(tmp, pipeline.targets)}",
        f"--storage.tsdb.path={tmp / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{PROMETHEUS_PORT}",
    )
    with contextlib.ExitStack() as stack:
        stack.callback(pipeline.stop_all)
        pipeline.start("prometheus")
        if adapter:
            pipeline.argv["adapter"] = _adapter_argv(m, tmp)
            pipeline.start("adapter")
            # The adapter listens on localhost of the node's network namespace, where the API server's egress dials.
            stack.enter_context(
                cluster_objects(
                    m.kube,
                    custom_metrics_api(
                        "epd-custom-metrics-anonymous-reader", "default", "epd-custom-metrics", ADAPTER_PORT
                    ),
                )
            )
            wait_for(
                pipeline.adapter_available,
                180,
                lambda: f"APIService not Available; adapter:\n{pipeline.tail('adapter')}",
                interval=1,
            )
        wait_for(
            pipeline.prometheus_ready, 120, lambda: f"Prometheus not ready:\n{pipeline.tail('prometheus')}", interval=2
        )
        yield pipeline


def _adapter_argv(m: Mission, tmp: Path) -> list[str]:
    """prometheus-adapter in the node's network namespace, reading the Prometheus beside it."""
    kubeconfig = m.cluster.kubeconfig_path  # https://127.0.0.1:<port>: the node bridge, in the node
    argv = adapter_argv(
        tmp, kubeconfig=kubeconfig, port=ADAPTER_PORT, prometheus_url=f"http://127.0.0.1:{PROMETHEUS_PORT}"
    )
    return m.cluster.real_node().netns_argv(*argv)


# ---------------------------------------------------------------- the loop


class _Loop:
    def __init__(self, m: Mission, pipeline: Pipeline, config: LoopConfig, tmp: Path, say: Callable[[str], None]):
        self.m, self.pipeline, self.config, self.tmp, self.say = m, pipeline, config, tmp, say
        self.record = LoopRecord(config)
        self.phase = "start"
        self.last_sample = 0.0
        self.encoder_deployment = f"{m.name}-encoder"
        self.hpa_name = f"{m.name}-encoder"
        self.ready_mark = "second_ready"  # the mark of the encoder the timeline follows being Ready

    # -- what the cluster says

    def deployment(self) -> dict[str, Any]:
        return self.m.kube.get("apps/v1", "Deployment", self.encoder_deployment) or {}

    def hpa(self) -> dict[str, Any]:
        return self.m.kube.get("autoscaling/v2", "HorizontalPodAutoscaler", self.hpa_name) or {}

    def epd_condition(self, kind: str) -> dict[str, Any]:
        epd = self.m.kube.get(EPD_API, "EPDDeployment", self.m.name) or {}
        return next((c for c in epd.get("status", {}).get("conditions") or [] if c["type"] == kind), {})

    def encoders(self, *, leaving: bool = False) -> list[dict[str, Any]]:
        pods = self.m.kube.pods(**{"app.kubernetes.io/instance": self.m.name, "serving.epd.dev/role": "encoder"})
        return [p for p in pods if leaving or not p["metadata"].get("deletionTimestamp")]

    def count(self, pod: dict[str, Any]) -> float:
        return self.m.pod_metric(pod, "vllm:request_success_total")

    def counts(self) -> dict[str, float]:
        """Each encoder's requests answered so far: 0 for one not Ready yet (a new pod, still starting, whose
        /metrics may not answer; it has answered nothing)."""
        return {p["metadata"]["name"]: self.count(p) if is_ready(p) else 0.0 for p in self.encoders()}

    def sample(self, force: bool = False) -> None:
        now = time.time()
        if not force and now - self.last_sample < 2:
            return
        self.last_sample = now
        dep, hpa = self.deployment(), self.hpa()
        status = hpa.get("status") or {}
        load = None
        for metric in status.get("currentMetrics") or []:
            if metric.get("type") == "Object" and metric["object"]["metric"]["name"] == LOAD:
                load = _quantity(metric["object"]["current"]["averageValue"])
            elif metric.get("type") == "External":  # KEDA's HPA: its load trigger, an AverageValue
                load = _quantity(metric["external"]["current"]["averageValue"])
        self.record.samples.append(
            Sample(
                t=now,
                phase=self.phase,
                replicas=int(dep.get("spec", {}).get("replicas") or 0),
                ready=int(dep.get("status", {}).get("readyReplicas") or 0),
                desired=status.get("desiredReplicas"),
                load=load,
                active=self.active(),
            )
        )

    def active(self) -> bool | None:
        """KEDA's verdict on the triggers (None for an HPA)."""
        return None

    def timeline_name(self) -> str:
        """The encoder whose way to serving the timeline follows: the one the scale-up added."""
        return self.record.second_encoder

    def second_pod(self) -> dict[str, Any] | None:
        name = self.timeline_name()
        return next((p for p in self.encoders() if p["metadata"]["name"] == name), None) if name else None

    def observe(self) -> None:
        """The new encoder's steps that leave no timestamp behind, seen at the first tick they hold
        (1 s resolution): vLLM answering /health, the startup probe passed, the EndpointSlice."""
        timeline = self.record.timeline
        if "endpointslice_ready" in timeline:
            return
        pod = self.second_pod()
        ip = (pod or {}).get("status", {}).get("podIP")
        if pod is None or not ip:
            return
        now = time.time()
        if "vllm_listening" not in timeline:
            with contextlib.suppress(AssertionError):
                if self.m.in_node(f"http://{ip}:8000/health", timeout=2)[0] == 200:
                    timeline["vllm_listening"] = now
        statuses = pod.get("status", {}).get("containerStatuses") or []
        if "startup_probe_passed" not in timeline and any(c["name"] == "vllm" and c.get("started") for c in statuses):
            timeline["startup_probe_passed"] = now
        slices = self.m.kube.list(
            "discovery.k8s.io/v1",
            "EndpointSlice",
            labels={"app.kubernetes.io/instance": self.m.name, "serving.epd.dev/role": "encoder"},
        )
        for item in slices:
            for ep in item.get("endpoints") or []:
                named = (ep.get("targetRef") or {}).get("name") == pod["metadata"]["name"]
                if named and (ep.get("conditions") or {}).get("ready"):
                    timeline["endpointslice_ready"] = now

    def settle_timeline(self) -> None:
        """The steps with a timestamp of their own, from the HPA and the new pod's status."""
        timeline, pod = self.record.timeline, self.second_pod()
        if (decided := rfc3339(self.record.scaled_up_hpa.get("lastScaleTime"))) is not None:
            timeline["hpa_decision"] = decided
        if pod is None:
            return
        if (created := rfc3339(pod["metadata"].get("creationTimestamp"))) is not None:
            timeline["pod_created"] = created
        for c in pod.get("status", {}).get("containerStatuses") or []:
            started = rfc3339((c.get("state", {}).get("running") or {}).get("startedAt"))
            if c["name"] == "vllm" and started is not None:
                timeline["container_started"] = started
        for cond in pod.get("status", {}).get("conditions") or []:
            if cond["type"] == "Ready" and cond["status"] == "True":
                timeline["ready"] = rfc3339(cond.get("lastTransitionTime")) or self.record.marks[self.ready_mark]

    def rescales(self) -> list[dict[str, Any]]:
        """The HPA's rescale Events (`New size: N; reason: ...`) in the order it posted them: an Event's
        name ends in the hexadecimal UnixNano of its creation (client-go's recorder)."""
        out = []
        uid = self.hpa().get("metadata", {}).get("uid")  # not an HPA of the same name from an earlier run
        for event in self.m.kube.events(kind="HorizontalPodAutoscaler", name=self.hpa_name):
            said = re.match(r"New size: (\d+); reason: (.*)", event.get("message") or "")
            if event.get("reason") != "SuccessfulRescale" or said is None or event["involvedObject"].get("uid") != uid:
                continue
            meta = event["metadata"]
            when = rfc3339(event.get("eventTime") or event.get("firstTimestamp") or meta.get("creationTimestamp"))
            suffix = meta["name"].rpartition(".")[2]
            order = int(suffix, 16) if re.fullmatch(r"[0-9a-f]+", suffix) else int((when or 0) * 1e9)
            out.append({"t": when, "order": order, "size": int(said[1]), "reason": said[2]})
        return sorted(out, key=lambda d: d["order"])

    def watch_serving(self) -> None:
        """Each new encoder's first answer to the router: its vLLM counter moving from 0 (new pods only)."""
        for pod in self.encoders():
            name = pod["metadata"]["name"]
            new = name != self.record.first_encoder and name not in self.record.serving
            if new and is_ready(pod) and self.count(pod) > 0:
                self.record.serving[name] = time.time()

    def every_needed_serving(self) -> bool:
        """The first encoder and enough new ones have answered the router (wait() watches them each tick)."""
        return 1 + len(self.record.serving) >= self.config.needed

    def spill_counters(self) -> dict[str, float]:
        return {
            name: self.m.metric("router", f"epd_router_spilled_{name}_total", port=9090)
            for name in ("items", "requests")
        }

    def wait(self, condition: Callable[[], Any], timeout: float, what: str) -> Any:
        def tick() -> Any:
            self.pipeline.discover()
            self.sample()
            if self.phase == "step":
                self.observe()
                if self.config.needed > 2 and "scaled_up" in self.record.marks:
                    self.watch_serving()
            return condition()

        return wait_for(tick, timeout, lambda: f"{what} within {timeout:.0f} s\n{describe(self.m)}", interval=1)

    def hold(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        self.wait(lambda: time.monotonic() >= until, seconds + 60, "a pause")

    def mark(self, name: str) -> None:
        self.record.marks[name] = time.time()
        self.say(f"{name} (+{self.record.marks[name] - self.record.marks.get('load_start', time.time()):.0f} s)")

    # -- the loop

    def deploy(self) -> None:
        manifest = self.tmp / "epd-local-cpu-autoscaled.yaml"
        manifest.write_text(yaml.safe_dump_all(autoscaled_example(self.config)))
        self.m.kube.kubectl("apply", "-f", str(manifest))
        started = time.monotonic()
        self.wait(lambda: all_ready(self.m), 900, "the EPDDeployment Ready")
        self.say(f"EPDDeployment Ready {time.monotonic() - started:.0f} s after kubectl apply")
        self.wait(
            lambda: self.epd_condition("AutoscalingActive").get("status") == "True",
            300,
            f"AutoscalingActive; HPA {self.hpa().get('status')}; adapter:\n{self.pipeline.tail('adapter')}"
            f"\nprometheus:\n{self.pipeline.tail('prometheus')}",
        )
        [first] = self.encoders()
        self.record.first_encoder = first["metadata"]["name"]

    def start_phase(self, client: subprocess.Popen[str], name: str, load: Phase) -> None:
        """Tell the load client to run `load` from now on, and mark when it began."""
        self.phase = name
        assert client.stdin is not None
        client.stdin.write(load.line(name))
        client.stdin.flush()
        self.mark(f"{name}_start")

    def run(self, client: subprocess.Popen[str]) -> None:
        c = self.config

        def phase(name: str, load: Phase) -> None:
            self.start_phase(client, name, load)

        self.record.marks["load_start"] = time.time()
        phase("light", c.light)
        self.hold(c.light_seconds)
        assert self.deployment()["spec"]["replicas"] == 1, "light load alone scaled the encoders"

        phase("step", c.step)
        self.wait(lambda: self.deployment()["spec"]["replicas"] >= 2, c.scale_up_timeout, "the HPA scaling up")
        self.mark("scaled_up")
        self.record.scaled_up_hpa = self.hpa().get("status") or {}
        self.record.autoscaling_active = self.epd_condition("AutoscalingActive")
        second = self.wait(
            lambda: next((p for p in self.encoders() if p["metadata"]["name"] != self.record.first_encoder), None),
            60,
            "a second encoder pod",
        )
        self.record.second_encoder = second["metadata"]["name"]

        def second_ready() -> dict[str, Any] | None:
            pod = next((p for p in self.encoders() if p["metadata"]["name"] == self.record.second_encoder), None)
            return pod if pod is not None and is_ready(pod) else None

        self.wait(second_ready, c.second_ready_timeout, "the second encoder Ready")
        self.mark("second_ready")
        self.record.counts_at_second_ready = self.counts()

        def second_serving() -> bool:
            pod = second_ready()
            return pod is not None and self.count(pod) > self.record.counts_at_second_ready[self.record.second_encoder]

        self.wait(second_serving, 180, "the second encoder answering the router")
        self.mark("second_serving")
        self.record.timeline["router_first_request"] = self.record.marks["second_serving"]
        self.record.counts_at_second_serving = self.counts()
        self.wait(lambda: "endpointslice_ready" in self.record.timeline, 30, "the EndpointSlice listing it")
        self.settle_timeline()
        if c.needed > 2:  # a step that needs more than one new encoder: until every one serves
            self.wait(self.every_needed_serving, c.all_serving_timeout, f"{c.needed} encoders serving")
            self.mark("all_serving")
        self.hold(c.share_seconds)
        self.record.counts_at_step_end = self.counts()
        self.record.spilled = {f"step_{k}": v for k, v in self.spill_counters().items()}
        self.record.decisions = [
            d for d in self.rescales() if d["t"] is not None and d["t"] >= int(self.record.marks["step_start"])
        ]

        phase("light_after", c.light)
        self.wait(lambda: self.deployment()["spec"]["replicas"] == 1, c.scale_down_timeout, "the HPA scaled to 1")
        self.mark("scaled_down")
        leaving = self.wait(
            lambda: (
                next((p for p in self.encoders(leaving=True) if p["metadata"].get("deletionTimestamp")), None)
                or (len(self.encoders(leaving=True)) == 1 and "gone")
            ),
            60,
            "the leaving encoder",
        )
        if isinstance(leaving, dict):
            self.record.leaving_encoder = ",".join(
                p["metadata"]["name"] for p in self.encoders(leaving=True) if p["metadata"].get("deletionTimestamp")
            )
        self.wait(lambda: len(self.encoders(leaving=True)) == 1, c.scale_down_timeout, "the leaving encoders gone")
        self.mark("left_gone")
        self.hold(c.tail_seconds)
        self.record.spilled.update(self.spill_counters())
        self.phase = "end"


# `make bench-autoscale`'s step (bench/autoscale.py): 1 to 4 encoders at a target of 1 item per encoder, and a
# step of 4 clients with 2 never-seen images each (8 items wanted at once: eight encoders' worth, the 4 of
# maxReplicas needed), so that the first decision can ask for every encoder the load needs. The small target
# keeps that load cheap on a shared CPU: 4 CPU encoders and the consumer must start and serve beside it.
BIG_STEP = LoopConfig(
    target_per_pod=1,
    max_replicas=4,
    step=Phase(clients=4, images=2, pause=0.0),
    light_seconds=20,
    share_seconds=20,
    second_ready_timeout=900,
    all_serving_timeout=900,
)


KEDA_API = "keda.sh/v1alpha1"
# The woken encoder's way from KEDA's activation to the router's first request: TIMELINE, with KEDA's
# activation (the encoder Deployment set from 0 to 1, seen by the loop) in place of the HPA's decision.
KEDA_TIMELINE = (
    ("activated", "KEDA activates the tier (encoder Deployment 0 → 1, as the loop's 1 s poll sees it)"),
    *TIMELINE[1:],
)
# The KEDA loop: light load is one client, one image every 2 s, so the demand (one raw item at a time) is
# never above the activation threshold of 1 and the tier stays at zero; the step (16 items at once) wakes it.
KEDA_LOOP = LoopConfig(
    engine="KEDA",
    light=Phase(clients=1, images=1, pause=2.0),
    light_seconds=40,
    share_seconds=30,
    tail_seconds=20,
    scale_up_timeout=120,
    second_ready_timeout=720,
    scale_down_timeout=300,
)


def start_keda(m: Mission) -> None:
    """KEDA's operator and metrics server on the mission's cluster (in the node's network namespace,
    `cluster.start_part("keda")`), then the operator restarted and back. The operator's watches are fixed
    when it starts (kopf's resource scanning is off): one started before KEDA's CRDs were installed, as
    the mission cluster's was, would restart itself to watch ScaledObjects within its poll interval
    (controller/served_kinds.py); a rollout restart does it at once."""
    m.cluster.start_part("keda")
    ns = m.system.ns

    def restarted() -> bool:
        status = m.system.kubectl(
            "-n", ns, "rollout", "status", "deployment/epd-operator", "--timeout=50s", check=False
        )
        return status.returncode == 0

    m.system.kubectl("-n", ns, "rollout", "restart", "deployment/epd-operator")
    wait_for(restarted, 300, "the operator restarted", interval=1)


class _KedaLoop(_Loop):
    """The loop from zero and back: idle at zero, light load served raw, the step wakes the tier and
    its HPA may take it to 2, light load again while KEDA takes it back to zero."""

    def __init__(self, m: Mission, pipeline: Pipeline, config: LoopConfig, tmp: Path, say: Callable[[str], None]):
        super().__init__(m, pipeline, config, tmp, say)
        self.hpa_name = f"keda-hpa-{m.name}-encoder"  # KEDA's own HPA
        self.ready_mark = "first_ready"

    def scaled_object(self) -> dict[str, Any]:
        return self.m.kube.get(KEDA_API, "ScaledObject", self.encoder_deployment) or {}

    def keda_conditions(self) -> dict[str, str]:
        conditions = (self.scaled_object().get("status") or {}).get("conditions") or []
        return {c["type"]: c["status"] for c in conditions}

    def active(self) -> bool | None:
        return {"True": True, "False": False}.get(self.keda_conditions().get("Active", ""))

    def timeline_name(self) -> str:
        return self.record.first_encoder

    def summary(self) -> dict[str, Any]:
        """The EPDDeployment's phase, encoder tier and conditions, and the ScaledObject's conditions."""
        epd = self.m.kube.get(EPD_API, "EPDDeployment", self.m.name) or {}
        status = epd.get("status") or {}
        return {
            "phase": status.get("phase"),
            "encoder": (status.get("tiers") or {}).get("encoder"),
            "conditions": {
                c["type"]: {k: c.get(k) for k in ("status", "reason", "message")}
                for c in status.get("conditions") or []
            },
            "scaled_object": self.keda_conditions(),
        }

    def at_zero(self) -> bool:
        summary = self.summary()
        return (
            int(self.deployment().get("spec", {}).get("replicas", -1)) == 0
            and not self.encoders(leaving=True)
            and summary["phase"] == "Ready"
            and (summary["encoder"] or {}).get("reason") == "ScaledToZero"
        )

    def serving(self) -> dict[str, Any] | None:
        """An encoder the router has sent work to (its vLLM counter moved from 0: each is a new pod)."""
        for pod in self.encoders():
            if is_ready(pod) and self.count(pod) > 0:
                return pod
        return None

    def deploy(self) -> None:
        manifest = self.tmp / "epd-local-cpu-keda.yaml"
        manifest.write_text(yaml.safe_dump_all(autoscaled_example(self.config)))
        self.m.kube.kubectl("apply", "-f", str(manifest))
        started = time.monotonic()
        self.wait(lambda: all_ready(self.m, ("decode", "router")), 900, "the EPDDeployment Ready")
        self.wait(self.at_zero, 300, f"the encoder tier at zero; ScaledObject {self.scaled_object().get('status')}")
        self.say(f"EPDDeployment Ready, encoders at zero, {time.monotonic() - started:.0f} s after kubectl apply")
        self.wait(
            lambda: self.epd_condition("AutoscalingActive").get("status") == "True",
            120,
            f"AutoscalingActive from KEDA's verdict; ScaledObject {self.scaled_object().get('status')}",
        )
        self.record.statuses["idle"] = self.summary()

    def run(self, client: subprocess.Popen[str]) -> None:
        c = self.config

        def phase(name: str, load: Phase) -> None:
            self.start_phase(client, name, load)

        def replicas() -> int:
            return int(self.deployment()["spec"].get("replicas") or 0)

        self.record.marks["load_start"] = time.time()
        phase("light", c.light)
        self.hold(c.light_seconds)
        self.record.statuses["raw_items_at_light_end"] = self.m.metric(
            "router", "epd_router_items_total", port=9090, outcome="fallback"
        )

        phase("step", c.step)
        self.wait(lambda: replicas() >= 1, c.scale_up_timeout, "KEDA activating the encoder tier")
        self.mark("activated")
        self.record.statuses["activated"] = self.summary()
        first = self.wait(
            lambda: min(self.encoders(), key=lambda p: p["metadata"]["creationTimestamp"], default=None),
            60,
            "an encoder pod",
        )
        self.record.first_encoder = first["metadata"]["name"]
        self.record.timeline["activated"] = self.record.marks["activated"]
        pod = self.wait(self.serving, c.second_ready_timeout, "an encoder answering the router")
        self.mark("first_serving")
        if pod["metadata"]["name"] != self.record.first_encoder:  # the later pod served first: follow it
            self.record.first_encoder = pod["metadata"]["name"]
            self.record.timeline = {"activated": self.record.marks["activated"]}
        self.record.marks["first_ready"] = self.record.marks["first_serving"]  # until its own condition is read
        self.record.timeline["router_first_request"] = self.record.marks["first_serving"]
        self.wait(lambda: "endpointslice_ready" in self.record.timeline, 30, "the EndpointSlice listing it")
        self.settle_timeline()
        self.record.marks["first_ready"] = self.record.timeline.get("ready", self.record.marks["first_serving"])

        # Its HPA takes the tier on from 1: to 2 when the load per encoder is above the target.
        try:
            self.wait(lambda: replicas() == 2, c.second_timeout, "KEDA's HPA asking for 2")
        except AssertionError:
            self.say(f"the load did not ask for a second encoder: {self.hpa().get('status')}")
        else:
            self.mark("scaled_up")
            self.record.scaled_up_hpa = self.hpa().get("status") or {}
            second = self.wait(
                lambda: next((p for p in self.encoders() if p["metadata"]["name"] != self.record.first_encoder), None),
                60,
                "a second encoder pod",
            )
            self.record.second_encoder = second["metadata"]["name"]

            def second_serving() -> bool:
                pod = next((p for p in self.encoders() if p["metadata"]["name"] == self.record.second_encoder), None)
                return pod is not None and is_ready(pod) and self.count(pod) > 0

            self.wait(second_serving, c.second_ready_timeout, "the second encoder answering the router")
            self.mark("second_serving")
            self.record.counts_at_second_serving = {p["metadata"]["name"]: self.count(p) for p in self.encoders()}
        self.hold(c.share_seconds)
        self.record.counts_at_step_end = {p["metadata"]["name"]: self.count(p) for p in self.encoders() if is_ready(p)}
        self.record.spilled = {f"step_{k}": v for k, v in self.spill_counters().items()}

        phase("light_after", c.light)
        self.wait(lambda: replicas() == 0, c.scale_down_timeout, "KEDA taking the tier back to zero")
        self.mark("scaled_down")
        leaving = [p["metadata"]["name"] for p in self.encoders(leaving=True)]
        self.record.leaving_encoder = ",".join(leaving)
        self.wait(lambda: not self.encoders(leaving=True), c.scale_down_timeout, "the last encoder gone")
        self.mark("left_gone")
        self.wait(self.at_zero, 120, "the EPDDeployment reporting the tier at zero again")
        self.record.statuses["zero_again"] = self.summary()
        self.hold(c.tail_seconds)
        self.record.spilled.update(self.spill_counters())
        self.record.statuses["events"] = sorted(
            {
                e.get("reason", "")
                for e in self.m.kube.list("v1", "Event")
                if (e.get("involvedObject") or {}).get("name") == self.m.name
            }
        )
        self.phase = "end"


def _quantity(value: str) -> float:
    if value.endswith("m"):
        return float(value[:-1]) / 1000
    return float(value)


def run_loops(
    m: Mission,
    pipeline: Pipeline,
    configs: list[LoopConfig],
    tmp: Path,
    say: Callable[[str], None] = print,
    done: Callable[[list[LoopRecord]], None] = lambda records: None,
) -> list[LoopRecord]:
    """`run_loop` once per config, each on a fresh EPDDeployment (removed after its run); `done` gets the
    records so far after each run (the benchmark writes them, so that a run cut short keeps the earlier ones)."""
    records: list[LoopRecord] = []
    for i, config in enumerate(configs):
        run = tmp / f"run-{i}"
        run.mkdir(exist_ok=True)
        say(f"run {i + 1} of {len(configs)}: spill-over {'on' if config.spill_over else 'off'}")
        try:
            records.append(run_loop(m, pipeline, config, run, say))
        finally:
            remove(m, m.name)
        done(records)
    return records


def run_loop(
    m: Mission, pipeline: Pipeline, config: LoopConfig, tmp: Path, say: Callable[[str], None] = print
) -> LoopRecord:
    """Deploy the autoscaled example, run the loop, and return what happened (raises when a step of
    the loop does not happen within its bound)."""
    loop = (_KedaLoop if config.engine == "KEDA" else _Loop)(m, pipeline, config, tmp, say)
    loop.deploy()
    records = tmp / "requests.jsonl"
    try:
        with load_clients(m, records, tmp / "load-client.log", SERVED) as client:
            loop.run(client)
    finally:
        loop.mark("load_end")
        loop.sample(force=True)
        record = loop.record
        if records.exists():
            record.requests = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
        start, end = record.marks["load_start"] - 5, record.marks["load_end"]
        with contextlib.suppress(AssertionError, KeyError, json.JSONDecodeError):
            ns = m.kube.ns
            record.series = {
                **{
                    f"inflight:{k}": v
                    for k, v in pipeline.range(
                        f'sum(epd_router_endpoint_inflight{{namespace="{ns}",role="encoder"}}) by (backend_pod)',
                        start,
                        end,
                    ).items()
                },
                **{
                    f"waiting:{k}": v
                    for k, v in pipeline.range(
                        f'sum(vllm:num_requests_waiting{{namespace="{ns}"}}) by (pod)', start, end
                    ).items()
                },
                **{
                    f"spilled:{k}": v
                    for k, v in pipeline.range(
                        f'sum(epd_router_spilled_items_total{{namespace="{ns}"}})', start, end
                    ).items()
                },
                **{
                    f"success:{k}": v
                    for k, v in pipeline.range(
                        f'sum(vllm:request_success_total{{namespace="{ns}"}}) by (pod)', start, end
                    ).items()
                },
            }
    return record
