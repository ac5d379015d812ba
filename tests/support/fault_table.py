"""The fault table on real pods: what each fault costs a client of the router Service, in figures.

One EPDDeployment (examples/epd-local-cpu.yaml with two encoders, two prefill+decode pods and two
routers) serves steady load from chat clients in the real node's network namespace: every request
carries an image never sent before and opens a new connection to the router Service's ClusterIP
(kube-proxy picks a router per connection). The faults come one after another, each once the
previous one has recovered; a request belongs to a fault's row when it overlaps the row's window
(from the fault until the cluster says it has recovered, plus a settle period). Per row: requests
sent, failed (by status or error), p99 latency, seconds to recover, and what the row checks besides.

The rows that take the encoder autoscaler's metric source away (:data:`METRIC_ROWS`: Prometheus, then
prometheus-adapter, stopped for a minute under load) run on a deployment of their own: the encoder tier
autoscaled on its demand by the HPA, read through Prometheus and prometheus-adapter as the autoscaling
loop runs them (tests/support/autoscale_loop.py's metrics pipeline), the load keeping it above its
minimum.

Shared by tests/node/test_faults.py (the whole table; tests/support/fault_checks.py asserts each row's
expectation), tests/node/test_mission_loop.py (the rows that restart no vLLM pod, on the mission's own
deployment) and `make bench-faults` (bench/faults.py writes bench/results/faults.md and .json).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from dev.builds.images import VLLM_CPU_IMAGE, VLLM_STUB_IMAGE, build_vllm_stub, operator_image
from dev.cluster.local import LocalCluster
from epd_operator.api.labels import GENERATION_LABEL as GENERATION
from tests.support.autoscale_loop import Pipeline, metrics_pipeline
from tests.support.cluster import EPD_API, wait_for
from tests.support.mission import Mission, all_ready, describe, load_clients
from tests.support.real_node import is_ready

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "epd-local-cpu.yaml"
SERVED = "tiny-vl"
ROLES = ("encoder", "decode", "router")
SECOND = "tiny-vl-second"  # the EPDDeployment applied while the operator is killed
MISSING_IMAGE = "localhost/epd-does-not-exist:1"
# The admission policy that holds the second EPDDeployment's apply half-done (FaultTable.hold_deployments).
HOLD = "epd-faults-hold-second"
ADMISSION_API = "/apis/admissionregistration.k8s.io/v1"
OPERATOR_METRICS_PORT = 9090  # charts/epd-operator values: metrics.port


@dataclass
class Row:
    """One fault's figures. `window` is [fault, recovered + settle] in Unix seconds."""

    name: str
    fault: str
    expectation: str
    start: float = 0.0
    recovered: float | None = None
    end: float = 0.0
    sent: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    failed_started_before: int = 0  # failed requests that had started before the fault
    p99_ms: float | None = None
    recover_s: float | None = None
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def failures(self) -> int:
        return sum(self.failed.values())


class RowFailed(Exception):
    """A row did not complete; its Row carries the error."""


@dataclass
class FaultRecord:
    rows: list[Row] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    load: dict[str, Any] = field(default_factory=dict)

    def row(self, name: str) -> Row:
        return next(r for r in self.rows if r.name == name)

    def to_json(self) -> dict[str, Any]:
        return {"rows": [asdict(r) for r in self.rows], "requests": self.requests, "load": self.load}


def record_from_json(data: dict[str, Any]) -> FaultRecord:
    return FaultRecord([Row(**r) for r in data["rows"]], data["requests"], data.get("load", {}))


def _kind_of_failure(request: dict[str, Any]) -> str:
    if request["status"]:
        return f"HTTP {request['status']}"
    return (request.get("error") or "no answer").split(":", 1)[0]


def figures(row: Row, requests: list[dict[str, Any]]) -> None:
    """Fill a row's request figures from the clients' records (a request counts when it overlaps the window)."""
    mine = [r for r in requests if r["start"] <= row.end and r["end"] >= row.start]
    row.sent = len(mine)
    failed = [r for r in mine if r["status"] != 200]
    row.failed = dict(Counter(_kind_of_failure(r) for r in failed))
    row.failed_started_before = sum(1 for r in failed if r["start"] < row.start)
    latencies = sorted((r["end"] - r["start"]) * 1000 for r in mine if r["status"] == 200)
    row.p99_ms = round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1) if latencies else None
    row.recover_s = round(row.recovered - row.start, 1) if row.recovered is not None else None


def fault_example(
    name: str, replicas: dict[str, int], encoder_autoscaling: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """examples/epd-local-cpu.yaml under another name, with these pods per tier (and an autoscaled
    encoder tier, when given)."""
    docs = list(yaml.safe_load_all(EXAMPLE.read_text()))
    epd = next(d for d in docs if d["kind"] == "EPDDeployment")
    epd["metadata"]["name"] = name
    for role, n in replicas.items():
        epd["spec"][role]["replicas"] = n
    if encoder_autoscaling is not None:
        epd["spec"]["encoder"]["autoscaling"] = encoder_autoscaling
    return docs


def event_count(event: dict[str, Any]) -> int:
    """How often an Event happened: its count, or its series' (Events written through events.k8s.io)."""
    return int(event.get("count") or (event.get("series") or {}).get("count") or 1)


def _restarts(pod: dict[str, Any]) -> int:
    return sum(c.get("restartCount", 0) for c in (pod.get("status") or {}).get("containerStatuses") or [])


def _quiet(fn: Callable[[], Any]) -> Callable[[], Any]:
    """A condition that counts an API error (the API server restarting) as not yet."""

    def call() -> Any:
        try:
            return fn()
        except Exception:  # any failure to read is "not yet"
            return None

    return call


class FaultTable:
    def __init__(
        self,
        m: Mission,
        tmp: Path,
        say: Callable[[str], None],
        replicas: dict[str, int],
        settle: float = 10.0,
        encoder_autoscaling: dict[str, Any] | None = None,
    ) -> None:
        self.m, self.tmp, self.say, self.replicas, self.settle = m, tmp, say, replicas, settle
        self.encoder_autoscaling = encoder_autoscaling
        self.record = FaultRecord()
        self.cluster: LocalCluster = m.cluster
        self.pipeline: Pipeline | None = None  # Prometheus and prometheus-adapter, for an autoscaled encoder tier

    # -- what the cluster says

    def deployment(self, role: str, name: str | None = None) -> dict[str, Any]:
        return self.m.kube.get("apps/v1", "Deployment", f"{name or self.m.name}-{role}") or {}

    def settled(self, role: str, name: str | None = None) -> bool:
        """Every pod of the tier's Deployment is of its current template, Ready, and none is terminating."""
        dep = self.deployment(role, name)
        spec, status = dep.get("spec", {}), dep.get("status", {})
        want = int(spec.get("replicas") or 0)
        pods = self.m.kube.pods(**{"app.kubernetes.io/instance": name or self.m.name, "serving.epd.dev/role": role})
        return (
            status.get("observedGeneration") == dep.get("metadata", {}).get("generation")
            and status.get("updatedReplicas") == want
            and status.get("readyReplicas") == want
            and status.get("replicas") == want
            and len(pods) == want
            and all(is_ready(p) and not p["metadata"].get("deletionTimestamp") for p in pods)
        )

    def all_settled(self) -> bool:
        """The operator has reported the EPDDeployment's current spec Ready and every tier has settled on it."""
        return all(self.settled(role) for role in ROLES) and all_ready(self.m)

    def uids(self) -> dict[str, str]:
        return {p["metadata"]["name"]: p["metadata"]["uid"] for p in self.m.kube.pods()}

    def restarts(self) -> dict[str, int]:
        return {p["metadata"]["name"]: _restarts(p) for p in self.m.kube.pods()}

    def pull_attempts(self, image: str) -> int:
        """How often the kubelet has started pulling `image` for a pod of this namespace (its Pulling Events)."""
        return sum(
            event_count(e)
            for e in self.m.kube.events(kind="Pod")
            if e.get("reason") == "Pulling" and f'"{image}"' in (e.get("message") or "")
        )

    def router_metric(self, name: str, **labels: str) -> float:
        return sum(self.m.pod_metric(p, name, 9090, **labels) for p in self.m.pods("router"))

    def router_requests(self) -> dict[str, float]:
        """Requests each router pod has answered, by pod name (its own counter)."""
        return {
            p["metadata"]["name"]: self.m.pod_metric(p, "epd_router_requests_total", 9090)
            for p in self.m.pods("router")
        }

    def every_router_serving(self, before: dict[str, float]) -> bool:
        """Every router pod has answered requests through the Service since ``before`` (the counts then):
        kube-proxy sends new connections to each, as the router rows assume. A router just scaled up is
        Ready some seconds before the node's rules send it anything."""
        now = self.router_requests()
        return set(now) == set(before) and all(now[name] > before[name] for name in now)

    def operator_pod(self) -> dict[str, Any] | None:
        pods = self.m.system.list("v1", "Pod", labels={"app.kubernetes.io/name": "epd-operator"})
        return next((p for p in pods if is_ready(p) and not p["metadata"].get("deletionTimestamp")), None)

    def operator_metrics(self) -> str:
        """The Ready operator pod's own /metrics."""
        pod = self.operator_pod()
        assert pod is not None, "no operator pod is Ready"
        status, text = self.m.in_node(f"http://{pod['status']['podIP']}:{OPERATOR_METRICS_PORT}/metrics", timeout=10)
        assert status == 200, text[:300]
        return text

    def operator_leads(self) -> bool:
        from tests.support.prom import metric_value

        return metric_value(self.operator_metrics(), "epd_operator_leader") == 1

    def operator_passes(self) -> float:
        """Reconcile passes the operator has made, full and status (its own counter)."""
        from tests.support.prom import metric_value

        return metric_value(self.operator_metrics(), "epd_operator_reconciles_total")

    def passes_since(self, passes: float) -> bool:
        return self.operator_passes() > passes

    def operator_writes(self) -> dict[str, float]:
        """The operator's mutating API requests so far by verb and kind (its own counter), Leases apart."""
        from tests.support.prom import samples

        writes: Counter[str] = Counter()
        for sample in samples(self.operator_metrics()):
            if sample.name == "epd_operator_api_writes_total" and sample.labels.get("kind") != "Lease":
                writes[f"{sample.labels.get('verb')} {sample.labels.get('kind')}"] += int(sample.value)
        return dict(writes)

    def wait(self, condition: Callable[[], Any], timeout: float, what: str) -> Any:
        def tick() -> Any:
            if self.pipeline is not None:
                self.pipeline.discover()  # Prometheus scrapes the pods there are now
            return condition()

        return wait_for(_quiet(tick), timeout, lambda: f"{what} within {timeout:.0f} s\n{describe(self.m)}", 1)

    # -- the run

    def deploy(self) -> None:
        manifest = self.tmp / "epd-local-cpu-faults.yaml"
        manifest.write_text(yaml.safe_dump_all(fault_example(self.m.name, self.replicas, self.encoder_autoscaling)))
        self.m.kube.kubectl("apply", "-f", str(manifest))
        started = time.monotonic()
        self.wait(self.all_settled, 1200, f"the EPDDeployment with {self.replicas} pods Ready")
        self.say(f"{self.replicas} pods Ready {time.monotonic() - started:.0f} s after kubectl apply")
        node = self.cluster.real_node()
        node.load_image(build_vllm_stub())
        # A second name for each image: an image change of every tier that needs no new build.
        for image in (VLLM_CPU_IMAGE, operator_image()):
            node.ctr("images", "tag", "--force", image, f"{image}-rollout")

    @contextlib.contextmanager
    def row(self, name: str, fault: str, expectation: str) -> Iterator[Row]:
        row = Row(name, fault, expectation, start=time.time())
        self.say(f"fault: {fault}")
        try:
            yield row
        except Exception as exc:  # a bound or a step of the row failed: recorded, and the table goes on
            row.facts["error"] = f"{type(exc).__name__}: {exc}"[:3000]
            row.end = time.time()
            self.record.rows.append(row)
            self.say(f"  failed: {row.facts['error'][:300]}")
            raise RowFailed(name) from exc
        if row.recovered is None:
            row.recovered = time.time()
        self.say(f"  recovered after {row.recovered - row.start:.0f} s")
        time.sleep(self.settle)
        row.end = time.time()
        self.record.rows.append(row)

    def delete_pods(self, pods: list[dict[str, Any]]) -> None:
        names = [p["metadata"]["name"] for p in pods]
        self.m.kube.kubectl("-n", self.m.kube.ns, "delete", "pod", *names, "--wait=false")

    def encoder_pod_deleted(self) -> None:
        with self.row(
            "encoder_pod_deleted", "one of two encoder pods deleted", "0 failed (the other encoder takes its images)"
        ) as row:
            self.delete_pods(self.m.pods("encoder")[:1])
            self.wait(lambda: self.settled("encoder"), 900, "the encoder tier back to two Ready pods")
            row.recovered = time.time()

    def all_encoders_deleted(self) -> None:
        fallback = self.router_metric("epd_router_encoder_fallback_requests_total")
        with self.row(
            "all_encoders_deleted",
            "every encoder pod deleted",
            "0 failed (the consumer encodes the images itself), recovery when they return",
        ) as row:
            self.delete_pods(self.m.pods("encoder"))
            self.wait(lambda: self.settled("encoder"), 900, "the encoder tier back to two Ready pods")
            row.recovered = time.time()
        row.facts["fallback_requests"] = self.router_metric("epd_router_encoder_fallback_requests_total") - fallback

    def decode_pod_deleted(self) -> None:
        with self.row(
            "decode_pod_deleted",
            "one of two prefill+decode pods deleted",
            "only requests already running on it may fail; none that started after",
        ) as row:
            self.delete_pods(self.m.pods("decode")[:1])
            self.wait(lambda: self.settled("decode"), 900, "the decode tier back to two Ready pods")
            row.recovered = time.time()

    def router_pod_deleted(self) -> None:
        with self.row(
            "router_pod_deleted",
            "one of two router pods deleted",
            "failed requests at most those in flight on it; new connections go to the survivor",
        ) as row:
            self.delete_pods(self.m.pods("router")[:1])
            self.wait(lambda: self.settled("router"), 300, "the router tier back to two Ready pods")
            row.recovered = time.time()

    def rolling_image_change(self) -> None:
        before = self.uids()
        fallback = self.router_metric("epd_router_encoder_fallback_requests_total", reason="no_encoder_in_generation")
        seen_generations: set[str] = set()

        def rolled() -> bool:
            for p in self.m.kube.pods(**{"app.kubernetes.io/instance": self.m.name}):
                if gen := p["metadata"]["labels"].get(GENERATION):
                    seen_generations.add(gen)
            return self.all_settled() and not set(self.uids().values()) & set(before.values())

        with self.row(
            "rolling_image_change",
            "an image change of every tier at once (vLLM and router images)",
            "0 failed; an encoder of one generation never paired with a consumer of another",
        ) as row:
            self.patch(
                {"spec": {"image": f"{VLLM_CPU_IMAGE}-rollout", "router": {"image": f"{operator_image()}-rollout"}}}
            )
            self.wait(rolled, 1800, "every tier rolled to the new images")
            row.recovered = time.time()
        row.facts["generations_seen"] = len(seen_generations)
        # While a generation has no encoder yet, its consumers get the images raw (counted), never an
        # encoder of the other generation.
        row.facts["no_encoder_in_generation"] = (
            self.router_metric("epd_router_encoder_fallback_requests_total", reason="no_encoder_in_generation")
            - fallback
        )

    def missing_image(self) -> None:
        fallback = self.router_metric("epd_router_encoder_fallback_requests_total", reason="no_encoder_in_generation")
        with self.row(
            "missing_image",
            "the encoder tier changed to an image that does not exist on the node",
            "0 failed (the running encoders stay); the tier's status and one Event name the pull error",
        ) as row:
            before = self.m.pods("decode")[0]["metadata"]["labels"].get(GENERATION, "")
            self.patch({"spec": {"encoder": {"image": MISSING_IMAGE}}})

            def named() -> str | None:
                epd = self.m.kube.get(EPD_API, "EPDDeployment", self.m.name) or {}
                tier = (epd.get("status") or {}).get("tiers", {}).get("encoder") or {}
                text = f"{tier.get('reason', '')}: {tier.get('message', '')}"
                return text if "ImagePull" in text else None

            def warnings() -> list[dict[str, Any]]:
                return [
                    e
                    for e in self.m.kube.events(kind="EPDDeployment", name=self.m.name)
                    if e.get("type") == "Warning" and "ImagePull" in (e.get("reason") or "")
                ]

            row.facts["status"] = self.wait(named, 300, "the encoder tier's status naming the pull error")[:300]
            self.wait(warnings, 60, "a Warning Event naming the pull error")
            # The kubelet's retries (ErrImagePull, ImagePullBackOff, a pull again) must not add Events: two
            # more of its pulls after the Warning, each after a back-off.
            pulls = self.pull_attempts(MISSING_IMAGE)
            self.wait(
                lambda: self.pull_attempts(MISSING_IMAGE) >= pulls + 2, 300, "two more pulls of the missing image"
            )
            row.facts["pulls_after_warning"] = self.pull_attempts(MISSING_IMAGE) - pulls
            row.facts["warning_events"] = sum(event_count(e) for e in warnings())
            row.facts["ready_encoders_while_failing"] = sum(1 for p in self.m.pods("encoder") if is_ready(p))
            # Encoders first: the consumers keep the generation they run until an encoder of the new one is Ready.
            row.facts["consumer_generations_while_failing"] = sorted(
                {p["metadata"]["labels"].get(GENERATION, "") for p in self.m.pods("decode")}
            )
            row.facts["generation_before"] = before
            self.patch({"spec": {"encoder": {"image": None}}})
            self.wait(self.all_settled, 1200, "every tier back on its generation")
            row.recovered = time.time()
        # Requests a consumer got raw because its generation had no encoder: none while the consumers wait.
        row.facts["no_encoder_in_generation"] = (
            self.router_metric("epd_router_encoder_fallback_requests_total", reason="no_encoder_in_generation")
            - fallback
        )

    def children(self, name: str, desired: list[dict[str, Any]]) -> set[tuple[str, str]]:
        """(kind, name) of every object of the kinds in `desired` that belongs to the EPDDeployment `name`."""
        return {
            (kind, obj["metadata"]["name"])
            for api, kind in {(o["apiVersion"], o["kind"]) for o in desired}
            for obj in self.m.kube.list(api, kind, labels={"app.kubernetes.io/instance": name})
        }

    def hold_deployments(self) -> None:
        """Until :meth:`release_deployments`: the API server refuses to write (not to dry-run) a Deployment
        of the second EPDDeployment, so the operator's apply of it stops after the objects it applies
        before the Deployments (ConfigMap, ServiceAccount, RBAC, Services) and it retries. Returns once
        the API server enforces it (it compiles a new policy in the background)."""
        policy = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": HOLD},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": ["apps"],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE", "UPDATE"],
                            "resources": ["deployments"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": (
                            f"(has(request.dryRun) && request.dryRun) || !object.metadata.name.startsWith('{SECOND}-')"
                        ),
                        "message": "held by the fault table until the operator is killed",
                    }
                ],
            },
        }
        binding = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": HOLD},
            "spec": {
                "policyName": HOLD,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.m.kube.ns}}
                },
            },
        }
        for kind, obj in (("validatingadmissionpolicies", policy), ("validatingadmissionpolicybindings", binding)):
            self.m.kube.ok("POST", f"{ADMISSION_API}/{kind}", obj, content_type="application/json")
        probe: dict[str, Any] = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": f"{SECOND}-hold-probe"},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": "hold-probe"}},
                "template": {
                    "metadata": {"labels": {"app": "hold-probe"}},
                    "spec": {"containers": [{"name": "c", "image": VLLM_STUB_IMAGE}]},
                },
            },
        }
        path = f"/apis/apps/v1/namespaces/{self.m.kube.ns}/deployments"

        def refused() -> bool:
            status, answer = self.m.kube.request("POST", path, probe, content_type="application/json")
            if status < 300:  # not enforced yet: the probe was created
                self.m.kube.delete("apps/v1", "Deployment", probe["metadata"]["name"])
                return False
            assert "held by the fault table" in json.dumps(answer), answer
            return True

        self.wait(refused, 60, "the API server enforcing the hold on the second EPDDeployment's Deployments")

    def release_deployments(self) -> None:
        for kind in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
            self.m.kube.request("DELETE", f"{ADMISSION_API}/{kind}/{HOLD}")

    def lease_holder(self) -> str | None:
        """Who holds the operator's leader Lease (epd-operator, in its namespace): `<pod name>_<suffix>`."""
        lease = self.m.system.get("coordination.k8s.io/v1", "Lease", "epd-operator") or {}
        return (lease.get("spec") or {}).get("holderIdentity")

    def operator_killed_mid_apply(self) -> None:
        from epd_operator.api.validation import parse_epd
        from epd_operator.render import render

        docs = fault_example(SECOND, {role: 1 for role in ROLES})
        epd = next(d for d in docs if d["kind"] == "EPDDeployment")
        epd["spec"]["image"] = VLLM_STUB_IMAGE  # starts in a second: the row is about the operator
        desired = render(parse_epd({**epd, "metadata": {**epd["metadata"], "namespace": self.m.kube.ns}}))
        want = {(o["kind"], o["metadata"]["name"]) for o in desired}
        with self.row(
            "operator_killed_mid_apply",
            "the operator pod killed with a new EPDDeployment half applied (an admission policy refuses its "
            "Deployments until the kill)",
            "after its restart: converged, nothing duplicated, nothing half-applied; the serving deployment unaffected",
        ) as row:
            old = self.operator_pod()
            assert old is not None
            self.hold_deployments()
            try:
                self.m.kube.create(epd)
                # Its first child exists: the operator is applying; the hold keeps the apply partial.
                self.wait(lambda: self.children(SECOND, desired), 120, "the operator applying the new EPDDeployment")
                self.m.system.kubectl(
                    "-n", self.m.system.ns, "delete", "pod", old["metadata"]["name"], "--grace-period=0", "--force"
                )
                present = self.children(SECOND, desired)
                row.facts["applied_at_kill"] = sorted(f"{k}/{n}" for k, n in present)
                row.facts["missing_at_kill"] = sorted(f"{k}/{n}" for k, n in want - present)

                # The hold ends once the restarted operator leads (the killed one's Lease has expired): only
                # it can complete the apply.
                def restarted_leads() -> str | None:
                    new = self.operator_pod()
                    if new is None or new["metadata"]["uid"] == old["metadata"]["uid"]:
                        return None
                    holder = self.lease_holder() or ""
                    return holder if holder.rpartition("_")[0] == new["metadata"]["name"] else None

                row.facts["leader_at_release"] = self.wait(restarted_leads, 300, "the restarted operator leading")
                row.facts["missing_at_release"] = sorted(f"{k}/{n}" for k, n in want - self.children(SECOND, desired))
            finally:
                self.release_deployments()
            second = Mission(self.cluster, self.m.kube, self.m.system, SECOND)
            self.wait(
                lambda: all_ready(second) and all(self.settled(role, SECOND) for role in ROLES),
                600,
                "the restarted operator converging the new EPDDeployment",
            )
            row.recovered = time.time()
            # What the operator applies for it, from the same render(), each object once and whole.
            row.facts["missing"] = sorted(
                f"{o['kind']}/{o['metadata']['name']}"
                for o in desired
                if self.m.kube.get(o["apiVersion"], o["kind"], o["metadata"]["name"]) is None
            )
            row.facts["unexpected"] = sorted(f"{k}/{n}" for k, n in self.children(SECOND, desired) - want)
            row.facts["pods_per_tier"] = {role: len(second.pods(role)) for role in ROLES}
        self.m.kube.kubectl("-n", self.m.kube.ns, "delete", "epddeployment", SECOND, "--wait=false")
        self.wait(
            lambda: not self.m.kube.pods(**{"app.kubernetes.io/instance": SECOND}), 300, "the second deployment gone"
        )

    def control_plane_restarted(self) -> None:
        writes = self.operator_writes()
        restarts = self.restarts()
        operator = self.operator_pod() or {}
        with self.row(
            "control_plane_restarted",
            "kube-apiserver and etcd restarted",
            "0 failed (the routers serve from their last endpoints); the operator resumes without a write storm",
        ) as row:
            down = self.cluster.restart_control_plane()
            row.facts["api_down_s"] = round(down, 1)
            # An operator that cannot renew its Lease within its deadline stands by until the API server
            # answers, then leads again (its pod Ready throughout, unless it crashed): wait for both.
            self.wait(lambda: self.all_settled() and self.operator_pod(), 900, "the cluster and the operator back")
            row.recovered = time.time()
            # What the operator writes once its watches are back: it leads again (a full pass over every
            # EPDDeployment is queued then), and answers a Deployment's and a Pod's change made after the
            # outage (a pass after each, which follows any pass queued before it).
            self.wait(lambda: self.operator_leads(), 300, "the operator leading again")
            [router, *_] = self.m.pods("router")
            for i, target in enumerate((f"deployment/{self.m.name}-router", f"pod/{router['metadata']['name']}")):
                passes = self.operator_passes()
                self.m.kube.kubectl(
                    "-n", self.m.kube.ns, "annotate", "--overwrite", target, f"faults.epd.dev/after-restart={i}"
                )
                self.wait(partial(self.passes_since, passes), 120, f"the operator's pass after {target}")
            after = self.operator_writes()
            now = self.operator_pod() or {}
            restarted = _restarts(now) != _restarts(operator) or now.get("metadata", {}).get("uid") != operator.get(
                "metadata", {}
            ).get("uid")
            row.facts["operator_restarted"] = restarted
            # A restarted operator's counter starts at zero: everything it shows was written since.
            row.facts["operator_writes"] = {
                k: v - (0 if restarted else writes.get(k, 0))
                for k, v in after.items()
                if v != (0 if restarted else writes.get(k, 0))
            }
            row.facts["container_restarts"] = sum(self.restarts().values()) - sum(restarts.values())

    def kubelet_restarted(self) -> None:
        uids, restarts = self.uids(), self.restarts()
        with self.row(
            "kubelet_restarted",
            "the node's kubelet restarted",
            "0 failed; the running pods keep serving, none restarted",
        ) as row:
            node = self.cluster.real_node().name
            self.cluster.real_node().restart_kubelet()
            restarted = datetime.now(UTC)  # the old kubelet has exited: a later heartbeat is the new one's

            def heartbeat() -> datetime | None:
                """The node's Lease renewal, when the new kubelet has renewed it."""
                lease = self.m.kube.get("coordination.k8s.io/v1", "Lease", node, namespace="kube-node-lease") or {}
                renewed = (lease.get("spec") or {}).get("renewTime")
                return (
                    datetime.fromisoformat(renewed) if renewed and datetime.fromisoformat(renewed) > restarted else None
                )

            def node_ready() -> datetime | None:
                obj = self.m.kube.get("v1", "Node", node) or {}
                conditions = obj.get("status", {}).get("conditions") or []
                ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
                # A short restart leaves the old kubelet's Ready in place: the Lease the new one renewed says it reports.
                beat = heartbeat()
                return beat if beat is not None and ready and self.all_settled() else None

            beat = self.wait(node_ready, 300, "the node Ready again, with a heartbeat of the restarted kubelet")
            row.facts["heartbeat_after_restart_s"] = round((beat - restarted).total_seconds(), 1)
            row.recovered = time.time()
            row.facts["pods_replaced"] = sorted(n for n, u in uids.items() if self.uids().get(n) != u)
            row.facts["container_restarts"] = sum(self.restarts().values()) - sum(restarts.values())

    # -- the encoder autoscaler's metric source lost (METRIC_ROWS)

    def epd_condition(self, kind: str) -> dict[str, Any]:
        epd = self.m.kube.get(EPD_API, "EPDDeployment", self.m.name) or {}
        return next((c for c in (epd.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})

    def autoscaling_events(self) -> Counter[tuple[str, str, str]]:
        """The EPDDeployment's autoscaling Events so far: (type, reason, message) -> how often (the operator
        posts each as an Event of its own, so the same words may be several)."""
        posted: Counter[tuple[str, str, str]] = Counter()
        for e in self.m.kube.events(kind="EPDDeployment", name=self.m.name):
            if e.get("reason") in ("AutoscalingInactive", "AutoscalingActive"):
                posted[(e.get("type", ""), e.get("reason", ""), e.get("message", ""))] += event_count(e)
        return posted

    def hpa_scaling_active(self) -> dict[str, Any]:
        hpa = self.m.kube.get("autoscaling/v2", "HorizontalPodAutoscaler", f"{self.m.name}-encoder") or {}
        conditions = (hpa.get("status") or {}).get("conditions") or []
        return next(
            (
                {k: c.get(k) for k in ("status", "reason", "message")}
                for c in conditions
                if c["type"] == "ScalingActive"
            ),
            {},
        )

    def autoscaled_steady(self) -> bool:
        """The encoder HPA reads its metric and has scaled the tier to its maximum under the load, every pod
        Ready: the state the metric rows start from (and must keep)."""
        assert self.encoder_autoscaling is not None
        dep = self.deployment("encoder")
        return (
            int(dep.get("spec", {}).get("replicas") or 0) == self.encoder_autoscaling["maxReplicas"]
            and self.all_settled()
            and self.epd_condition("AutoscalingActive").get("status") == "True"
        )

    def prometheus_lost(self) -> None:
        self.metric_source_lost(
            "prometheus_lost",
            "prometheus",
            "Prometheus stopped for a minute under load (the encoder HPA's demand comes from it through "
            "prometheus-adapter)",
            "0 failed; the status and a Warning Event name what is missing; the encoder tier keeps its replicas; "
            "autoscaling active again on its own once Prometheus is back",
        )

    def adapter_lost(self) -> None:
        self.metric_source_lost(
            "adapter_lost",
            "adapter",
            "prometheus-adapter (the custom metrics API's server) stopped for a minute under load",
            "0 failed; the status and a Warning Event name what is missing; the encoder tier keeps its replicas; "
            "autoscaling active again on its own once the adapter is back",
        )

    def metric_source_lost(self, name: str, process: str, fault: str, expectation: str) -> None:
        """Stop one process of the metrics pipeline for METRIC_OUTAGE seconds under load, start it again,
        and record what the EPDDeployment said meanwhile and what the encoder tier did (a 1 s poll)."""
        pipeline = self.pipeline
        assert pipeline is not None, f"{name} needs the metrics pipeline: run_table with an autoscaled encoder tier"
        events = self.autoscaling_events()
        spilled = self.router_metric("epd_router_spilled_items_total")
        raw = self.router_metric("epd_router_encoder_fallback_requests_total")
        before = int(self.deployment("encoder")["spec"]["replicas"])
        seen: list[tuple[float, int, int]] = []  # (Unix time, the encoder Deployment's replicas, its ready pods)

        def sample() -> bool:
            """Record the encoder tier now; False, so that `sample() or condition` reads the condition."""
            dep = self.deployment("encoder")
            seen.append(
                (time.time(), int(dep["spec"].get("replicas") or 0), int(dep["status"].get("readyReplicas") or 0))
            )
            return False

        def inactive() -> dict[str, Any] | None:
            sample()
            said = self.epd_condition("AutoscalingActive")
            return said if said.get("status") == "False" else None

        back = pipeline.prometheus_ready if process == "prometheus" else pipeline.adapter_available
        with self.row(name, fault, expectation) as row:
            pipeline.stop(process)
            said = self.wait(inactive, 120, "the EPDDeployment saying its autoscaling is inactive")
            row.facts["inactive_after_s"] = round(time.time() - row.start, 1)
            row.facts["reason"], row.facts["status"] = said.get("reason"), said.get("message", "")
            row.facts["hpa_while_lost"] = self.hpa_scaling_active()
            self.wait(lambda: sample() or time.time() >= row.start + METRIC_OUTAGE, METRIC_OUTAGE + 60, "the outage")
            pipeline.start(process)
            restarted = time.time()
            self.wait(lambda: sample() or back(), 300, f"{process} serving again")
            row.facts["serving_again_after_s"] = round(time.time() - restarted, 1)
            self.wait(
                lambda: sample() or self.epd_condition("AutoscalingActive").get("status") == "True",
                300,
                "the EPDDeployment saying its autoscaling is active again",
            )
            row.recovered = time.time()
            row.facts["active_again_after_s"] = round(row.recovered - restarted, 1)
            row.facts["outage_s"] = round(restarted - row.start, 1)
        after = self.autoscaling_events()
        posted = {key: n - events.get(key, 0) for key, n in after.items() if n > events.get(key, 0)}
        row.facts["warning_events"] = sorted(m for (t, _, m), n in posted.items() for _ in range(n) if t == "Warning")
        row.facts["normal_events"] = sum(n for (t, _, _), n in posted.items() if t == "Normal")
        row.facts["replicas_before"] = before
        row.facts["replicas_seen"] = sorted({r for t, r, _ in seen if t <= row.recovered})
        row.facts["ready_min"] = min((ready for t, _, ready in seen if t <= row.recovered), default=0)
        row.facts["spilled_items"] = self.router_metric("epd_router_spilled_items_total") - spilled
        row.facts["raw_requests"] = self.router_metric("epd_router_encoder_fallback_requests_total") - raw

    def patch(self, body: dict[str, Any]) -> None:
        self.m.kube.ok("PATCH", f"/apis/{EPD_API}/namespaces/{self.m.kube.ns}/epddeployments/{self.m.name}", body)


# Every row, in the order they run, and the pods per tier they need.
ROWS = (
    "encoder_pod_deleted",
    "all_encoders_deleted",
    "decode_pod_deleted",
    "router_pod_deleted",
    "rolling_image_change",
    "missing_image",
    "operator_killed_mid_apply",
    "control_plane_restarted",
    "kubelet_restarted",
)
EVERY_TIER_TWICE = {"encoder": 2, "decode": 2, "router": 2}
# The rows that restart no vLLM pod, on one encoder, one prefill+decode pod and two routers: minutes
# rather than tens of minutes on two cores. The mission loop runs them on the example it has applied
# (applied again with two routers, only the router tier changes); the whole table is `-m long`.
QUICK_ROWS = ("router_pod_deleted", "operator_killed_mid_apply", "control_plane_restarted", "kubelet_restarted")
QUICK_REPLICAS = {"encoder": 1, "decode": 1, "router": 2}
# The rows that take the encoder autoscaler's metric source away, on a deployment of their own: one
# prefill+decode pod and one router, the encoder tier autoscaled by its HPA on its demand (1 to 2 encoders
# at a target of 1 item each; steady load of METRIC_CLIENTS clients keeps it at 2, the default 5 min
# scale-down window keeps it from flapping), each source away for METRIC_OUTAGE seconds.
METRIC_ROWS = ("prometheus_lost", "adapter_lost")
METRIC_REPLICAS = {"decode": 1, "router": 1}
METRIC_AUTOSCALING: dict[str, Any] = {"minReplicas": 1, "maxReplicas": 2, "load": {"targetPerPod": 1}}
METRIC_CLIENTS = 3
METRIC_OUTAGE = 60.0
ALL_ROWS = (*ROWS, *METRIC_ROWS)


def record_document(record: FaultRecord, started: datetime, since: float, **more: Any) -> dict[str, Any]:
    """A run's faults.json: its record, when it started, its wall time (since `since`, a time.monotonic()
    reading) and the load average at its end; `more` adds fields (bench/faults.py: the commit)."""
    return {
        "started": started.isoformat(),
        **more,
        "wall": time.monotonic() - since,
        "load_average": list(os.getloadavg()),
        "record": record.to_json(),
    }


def run_recorded(
    m: Mission,
    tmp: Path,
    say: Callable[[str], None],
    rows: tuple[str, ...],
    replicas: dict[str, int],
    **table: Any,
) -> FaultRecord:
    """:func:`run_table`, its record also written to ``tmp/faults.json`` (``python -m bench.faults
    --from-record`` turns it into the results table)."""
    started, t = datetime.now(UTC), time.monotonic()
    record = run_table(m, tmp, say=say, rows=rows, replicas=replicas, **table)
    (tmp / "faults.json").write_text(json.dumps(record_document(record, started, t), indent=1))
    say(f"fault record (python -m bench.faults --from-record): {tmp / 'faults.json'}")
    return record


def run_table(
    m: Mission,
    tmp: Path,
    say: Callable[[str], None] = print,
    rows: tuple[str, ...] = ROWS,
    replicas: dict[str, int] = EVERY_TIER_TWICE,
    clients: int = 2,
    pause: float = 0.2,
    encoder_autoscaling: dict[str, Any] | None = None,
) -> FaultRecord:
    """Deploy the example with these pods per tier (and an autoscaled encoder tier with Prometheus and
    prometheus-adapter beside it, when given), run these faults one after another under steady load, and
    return the figures."""
    table = FaultTable(m, tmp, say, replicas, encoder_autoscaling=encoder_autoscaling)
    with contextlib.ExitStack() as stack:
        if encoder_autoscaling is not None:
            table.pipeline = stack.enter_context(metrics_pipeline(m, tmp))
        table.deploy()
        table.record.load = {"clients": clients, "images_per_request": 1, "pause_s": pause, "replicas": replicas}
        if encoder_autoscaling is not None:
            table.record.load["encoder_autoscaling"] = encoder_autoscaling
        records = tmp / "fault-requests.jsonl"
        with load_clients(m, records, tmp / "fault-load-client.log", SERVED) as client:
            assert client.stdin is not None
            routers = table.router_requests()
            client.stdin.write(f"steady {clients} 1 {pause}\n")
            client.stdin.flush()
            table.wait(
                lambda: table.every_router_serving(routers), 300, "the router Service sending requests to every router"
            )
            if encoder_autoscaling is not None:
                table.wait(table.autoscaled_steady, 900, "the encoder HPA scaling the tier to its maximum on the load")
                table.say(f"encoder tier autoscaled to {encoder_autoscaling['maxReplicas']}, every pod Ready")
            time.sleep(table.settle)
            for name in rows:
                with contextlib.suppress(RowFailed):  # the row says why; the next one runs
                    getattr(table, name)()
    table.record.requests = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
    for row in table.record.rows:
        figures(row, table.record.requests)
    return table.record


def run_metric_rows(
    m: Mission, tmp: Path, say: Callable[[str], None], rows: tuple[str, ...] = METRIC_ROWS
) -> FaultRecord:
    """The metric-source rows on their own deployment (:data:`METRIC_ROWS`)."""
    return run_table(m, tmp, say, rows, METRIC_REPLICAS, clients=METRIC_CLIENTS, encoder_autoscaling=METRIC_AUTOSCALING)
