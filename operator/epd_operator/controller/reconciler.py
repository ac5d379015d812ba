"""One reconcile pass over one EPDDeployment, and the workers that run passes from the queue.

Level-triggered: a pass reads the EPDDeployment and its children as last seen by the watches (the
cache, controller/cache.py: no API reads), decides from what it sees (never from the event that woke
it), and writes only differences. Watch events, the resync timer and a restart all just queue keys:

- an EPDDeployment whose generation we have not reconciled yet (create, spec update, first sight
  after a start) -> a FULL pass: validate, render, apply what drifted, prune, refresh status;
- a child Deployment, HPA or ScaledObject changed -> a STATUS pass: refresh `.status` only. Drift in children is
  repaired on the resync timer (and on spec changes), not on every child event, so a controller or
  webhook that fights us over a field costs one write per resync instead of a hot loop; a deleted
  child Deployment or HPA gets a FULL pass at once;
- a pod changed -> a STATUS pass; while consumers wait for an encoder of a new generation
  (controller/rollout.py), an encoder pod of that generation turning Ready gets a FULL pass, so they
  move as soon as one is Ready (and only then: a full pass dry-runs its plan on the server);
- every `resync_seconds` -> a FULL pass for every known EPDDeployment.

A full pass marks its generation reconciled before it writes the status, so the watch event of its
own status write queues nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from typing import Any

from ..api.labels import INSTANCE_LABEL, MANAGED_BY, MANAGED_BY_LABEL, ROLE_LABEL
from ..api.router import DEFAULT_ROUTER_IMAGE
from ..api.spec import KIND, EPDDeployment, Topology
from ..api.status import EPDDeploymentStatus
from ..api.validation import FieldError, SpecError, parse_epd
from ..kube import CHILD_RESOURCES, EPD, POD, REQUEST_ERRORS, Kube
from ..render import render
from ..render.generation import compatibility_generation
from ..render.naming import ENCODER
from . import apply, rollout
from . import status as status_rules
from .cache import Cache
from .events import post_event, utcnow
from .metrics import Metrics
from .pods import pod_trouble, unschedulable_reason
from .workqueue import FULL, STATUS, WorkQueue

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)
# A tier's workload: a Deployment, or a LeaderWorkerSet for a multi-node tier.
WORKLOAD_KINDS = ("Deployment", "LeaderWorkerSet")
# How often each kind the cache holds is listed once per namespace, to catch deletions a watch that
# had to list again never reported (cache.py). Not per pass: at 1,000 EPDDeployments a resync reads nothing.
AUDIT_SECONDS = 600.0
# The autoscalers a tier may have: our HPA, or KEDA's ScaledObject (engine KEDA; KEDA's own HPA is KEDA's).
AUTOSCALER_KINDS = ("HorizontalPodAutoscaler", "ScaledObject")
STATUS_KINDS = (*WORKLOAD_KINDS, *AUTOSCALER_KINDS)  # what a status pass reports on


def failure(exc: Exception) -> str:
    """What went wrong, in words: a request timeout's exception has none of its own."""
    if str(exc):
        return str(exc)
    return "no answer from the API server in time" if isinstance(exc, TimeoutError) else type(exc).__name__


def router_endpoint(objects: list[dict[str, Any]], epd_name: str) -> str | None:
    """The in-cluster URL of the router Service (the Service named like the EPDDeployment)."""
    for obj in objects:
        meta = obj["metadata"]
        if obj["kind"] == "Service" and meta["name"] == epd_name:
            port = obj["spec"]["ports"][0]["port"]
            return f"http://{meta['name']}.{meta['namespace']}.svc" + ("" if port == 80 else f":{port}")
    return None


def tier_inputs(objects: list[dict[str, Any]], live: list[dict[str, Any]]) -> dict[str, status_rules.TierInput]:
    """Each tier's live Deployment and HPA. With `objects` (a valid spec) the tiers are the rendered
    ones; without (a refused spec) they are whatever tier Deployments still run."""
    live_by_key = {apply.key_of(obj): obj for obj in live}
    source = objects or live
    tiers = {}
    for obj in source:
        role = obj["metadata"].get("labels", {}).get(ROLE_LABEL)
        if obj["kind"] not in WORKLOAD_KINDS or role not in status_rules.TIERS:
            continue
        name = obj["metadata"]["name"]
        hpa = live_by_key.get(("HorizontalPodAutoscaler", name))
        planned = obj.get("spec", {}).get("replicas")
        if planned is None:
            # An autoscaled workload is created without replicas: the Deployment (or LWS) starts at 1.
            planned = next(
                (
                    max(1, o["spec"].get("minReplicas", o["spec"].get("minReplicaCount", 1)))
                    for o in objects
                    if apply.key_of(o) in {(kind, name) for kind in AUTOSCALER_KINDS}
                ),
                1,
            )
        tiers[role] = status_rules.TierInput(
            live_by_key.get((obj["kind"], name)), hpa, planned, scaled_object=live_by_key.get(("ScaledObject", name))
        )
    return tiers


@dataclasses.dataclass(frozen=True)
class Seen:
    """What a pass starts from: the EPDDeployment as cached, its spec parsed and rendered (or the
    fields that refuse it), and the status it last published."""

    body: dict[str, Any]
    namespace: str
    name: str
    epd: EPDDeployment | None  # None: the spec is refused (`errors`)
    objects: list[dict[str, Any]]  # rendered; empty for a refused spec
    errors: list[FieldError] | None
    previous: EPDDeploymentStatus | None

    @property
    def meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = self.body["metadata"]
        return meta


# Defaults of `--resync-seconds` and `--workers` (controller/main.py).
RESYNC_SECONDS = 120.0  # a full pass over every EPDDeployment at least this often, events or not
WORKERS = 4  # EPDDeployments reconciled at once


class Reconciler:
    def __init__(
        self,
        kube: Kube,
        metrics: Metrics,
        *,
        identity: str,
        resync_seconds: float = RESYNC_SECONDS,
        workers: int = WORKERS,
        router_image: str = DEFAULT_ROUTER_IMAGE,
        prometheus_address: str | None = None,
    ):
        self.kube = kube
        self.router_image = router_image
        self.prometheus_address = prometheus_address  # what KEDA load triggers query when a spec names none
        self.metrics = metrics
        self.identity = identity
        self.resync_seconds = resync_seconds
        self.workers = workers
        self.queue: WorkQueue[tuple[str, str]] = WorkQueue()
        self.cache = Cache()
        metrics.cache_objects.set_function(lambda: len(self.cache))
        metrics.cache_bytes.set_function(lambda: self.cache.bytes)
        self.known: dict[Key, str] = {}  # key -> uid of every EPDDeployment seen and not deleted
        self._reconciled: dict[Key, tuple[str, int | None]] = {}  # key -> (uid, generation) last fully reconciled
        self._last_error: dict[Key, str] = {}
        self._held: dict[Key, list[rollout.Held]] = {}  # consumers waiting for an encoder of their new generation

    # ---------------------------------------------------------------- triggers (from watch events)

    def epd_event(self, event_type: str | None, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        self.cache.observe(event_type, body)
        if event_type == "DELETED":
            # Children go with the owner references; nothing to clean up here.
            self.metrics.forget(*key)
            self.known.pop(key, None)
            self._reconciled.pop(key, None)
            self._last_error.pop(key, None)
            self._held.pop(key, None)
        else:
            self.known[key] = meta["uid"]
            if self._reconciled.get(key) != (meta["uid"], meta.get("generation")):
                self.queue.add(key, FULL)
        self.metrics.managed.set(len(self.known))

    def child_event(self, event_type: str | None, body: dict[str, Any]) -> None:
        """A watched child changed: refresh the status. A deleted child is restored at once (a full
        pass), since nothing else would bring a tier back before the next resync."""
        self.cache.observe(event_type, body)
        meta = body["metadata"]
        instance = meta.get("labels", {}).get(INSTANCE_LABEL)
        owned = any(
            ref.get("kind") == KIND and ref.get("name") == instance for ref in meta.get("ownerReferences") or []
        )
        key = (meta["namespace"], instance)
        if owned and key in self.known:
            self.queue.add(key, FULL if event_type == "DELETED" else STATUS)

    def pod_event(self, event_type: str | None, body: dict[str, Any]) -> None:
        """A tier's pod changed: cached for the unready tiers' explanation (the scheduler's or the
        kubelet's reason), and the status refreshed, since the Deployment may not change when a pod
        turns unschedulable or its container fails. An encoder pod that ends a hold on consumers
        (rollout.releases) gets a full pass, which applies them."""
        self.cache.observe(event_type, body)
        meta = body["metadata"]
        key = (meta["namespace"], meta.get("labels", {}).get(INSTANCE_LABEL, ""))
        if key in self._reconciled:  # before its first full pass there is no status to refresh
            release = event_type != "DELETED" and rollout.releases(self._held.get(key, []), body)
            self.queue.add(key, FULL if release else STATUS)

    def resume(self) -> None:
        """Leading again after standing by: another replica (or nobody) acted meanwhile, so every
        EPDDeployment gets a full pass over what the watches kept in the cache."""
        for key in self.known:
            self.queue.add(key, FULL)

    # ---------------------------------------------------------------- running

    async def run(self) -> None:
        """Workers plus the resync timer, until cancelled."""
        tasks = [asyncio.create_task(self._worker(), name=f"epd-worker-{i}") for i in range(self.workers)]
        tasks.append(asyncio.create_task(self._resync(), name="epd-resync"))
        tasks.append(asyncio.create_task(self._audits(), name="epd-cache-audit"))
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.queue.close()

    async def _resync(self) -> None:
        while True:
            # Jitter spreads the passes of many operators (and restarts) over time.
            await asyncio.sleep(self.resync_seconds * random.uniform(0.9, 1.1))
            for key in list(self.known):
                self.queue.add(key, FULL)

    async def _audits(self) -> None:
        while True:
            await asyncio.sleep(AUDIT_SECONDS * random.uniform(0.9, 1.1))
            await self.audit()

    async def audit(self) -> None:
        """List every cached kind once per namespace with EPDDeployments; drop what the cache holds
        but the server no longer has, and give its EPDDeployment a full pass."""
        for namespace in sorted({ns for ns, _ in self.known}):
            for resource in (EPD, *CHILD_RESOURCES.values(), POD):
                selector = None if resource is EPD else f"{MANAGED_BY_LABEL}={MANAGED_BY}"
                try:
                    items, revision = await self.kube.list_with_version(resource, namespace, label_selector=selector)
                except REQUEST_ERRORS as exc:
                    log.warning("cache audit of %s in %s failed: %s", resource.plural, namespace, failure(exc))
                    continue
                for key in self.cache.replace_kind(resource.kind, namespace, items, revision):
                    if key in self.known:
                        log.info("%s/%s: %s deleted unseen by the watch; full pass", *key, resource.kind)
                        self.queue.add(key, FULL)

    async def _worker(self) -> None:
        while True:
            key, level = await self.queue.get()
            kind = "full" if level == FULL else "status"
            started = time.monotonic()
            try:
                result = await (self.full_pass(key) if level == FULL else self.status_pass(key))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a failed pass is retried; one bad object must not stop the others
                delay = self.queue.retry(key, level)
                self.metrics.errors.labels(kind=kind).inc()
                self.metrics.reconciles.labels(kind=kind, result="error").inc()
                log.warning(
                    "reconcile of %s/%s failed (retry in %.1fs): %s",
                    *key,
                    delay,
                    failure(exc),
                    exc_info=not isinstance(exc, REQUEST_ERRORS),
                )
                await self._report_failure(key, exc)
            else:
                self.queue.succeeded(key)
                self._last_error.pop(key, None)
                self.metrics.reconciles.labels(kind=kind, result=result).inc()
            finally:
                self.metrics.duration.labels(kind=kind).observe(time.monotonic() - started)
                self.queue.done(key)

    async def _report_failure(self, key: Key, exc: Exception) -> None:
        message = failure(exc)
        if self._last_error.get(key) == message:
            return  # one Event per distinct failure, not one per retry
        self._last_error[key] = message
        body = self.cache.get(KIND, *key)
        if body is not None:
            await post_event(self.kube, body, "Warning", "ReconcileFailed", message, instance=self.identity)

    # ---------------------------------------------------------------- one pass

    async def full_pass(self, key: Key) -> str:
        """Validate, render, apply what drifted, prune, then report. Returns the result label for
        metrics (success | invalid | gone)."""
        seen = self._read(key)
        if seen is None:
            return "gone"
        refused: list[str] = []
        if seen.errors is None:
            live, refused = await self._apply(seen)
        else:  # nothing is applied for a refused spec: report on what still runs, and hold nothing
            self._held.pop(key, None)
            live = self.cache.owned(seen.namespace, seen.name, STATUS_KINDS)
        # Marked before the status is written: the watch event of that write must not queue this generation
        # for a second full pass (and dry run). A report that fails is retried as a full pass by the worker.
        self._reconciled[key] = (seen.meta["uid"], seen.meta.get("generation"))
        return await self._report(seen, live, observed=seen.meta.get("generation"), refused=refused)

    async def status_pass(self, key: Key) -> str:
        """Report on the children as they are: no apply, no dry run, only `.status` (and the Events of
        its transitions) is written. Returns the result label for metrics (success | invalid | gone)."""
        seen = self._read(key)
        if seen is None:
            return "gone"
        live = self.cache.owned(seen.namespace, seen.name, STATUS_KINDS)
        # Without a dry run, a refusal the API server gave this generation still stands.
        return await self._report(
            seen,
            live,
            observed=status_rules.observed_by_status_pass(seen.previous),
            refused=status_rules.standing_refusal(seen.previous, seen.meta.get("generation")),
        )

    def _read(self, key: Key) -> Seen | None:
        """The EPDDeployment as cached, parsed and rendered; None when it is gone or going."""
        body = self.cache.get(KIND, *key)
        if body is None:
            self.known.pop(key, None)
            self.metrics.forget(*key)
            return None
        if body["metadata"].get("deletionTimestamp"):
            return None  # garbage collection removes the children
        epd: EPDDeployment | None
        try:
            epd = parse_epd({k: v for k, v in body.items() if k != "status"})
            objects = render(
                epd, default_router_image=self.router_image, default_prometheus_address=self.prometheus_address
            )
            errors: list[FieldError] | None = None
        except SpecError as exc:
            epd, objects, errors = None, [], exc.errors
        namespace, name = key
        return Seen(body, namespace, name, epd, objects, errors, status_rules.parse_status(body.get("status")))

    async def _apply(self, seen: Seen) -> tuple[list[dict[str, Any]], list[str]]:
        """Plan the rendered objects against the owned children and execute the plan unless the API
        server refuses it on a dry run: the children as they now are, and the refusals."""
        owner = apply.owner_reference(seen.body)
        desired = [apply.adopt(obj, owner) for obj in seen.objects]
        live = self.cache.owned(seen.namespace, seen.name, CHILD_RESOURCES)
        todo = apply.plan(desired, live, seen.meta["uid"])
        if not todo:
            self._held.pop((seen.namespace, seen.name), None)
            return live, []
        # The dry run judges the whole plan, held consumers included: a spec is applied whole or not at all.
        refused = await apply.refused_by_server(self.kube, todo)
        if refused:
            self._held.pop((seen.namespace, seen.name), None)
        else:
            live, refused = await self._converge(seen.body, self._hold_consumers(seen, todo, desired, live), live)
        return live, refused

    def _hold_consumers(
        self, seen: Seen, todo: apply.Plan, desired: list[dict[str, Any]], live: list[dict[str, Any]]
    ) -> apply.Plan:
        """`todo` less the consumers that wait for an encoder of their new generation (rollout.py)."""
        encoders = self.cache.pods(seen.namespace, seen.name, {ROLE_LABEL: ENCODER})
        held = rollout.held_consumers(desired, live, encoders)
        key = (seen.namespace, seen.name)
        if not held:
            self._held.pop(key, None)
            return todo
        self._held[key] = held
        kept = {(h.kind, h.name) for h in held}
        return dataclasses.replace(todo, applies=[a for a in todo.applies if apply.key_of(a.desired) not in kept])

    async def _report(self, seen: Seen, live: list[dict[str, Any]], *, observed: int | None, refused: list[str]) -> str:
        """Derive the status from `live` children, publish it if it changed, and export the phase
        and generations as metrics; returns success, or invalid for a refused spec."""
        namespace, name = seen.namespace, seen.name
        topology: Topology | None
        endpoint: str | None
        if seen.epd is not None:
            topology, endpoint = seen.epd.spec.topology, router_endpoint(seen.objects, name)
        else:  # the children of the last accepted spec keep running: keep describing them
            topology, endpoint = status_rules.last_described(seen.previous)
        tiers = tier_inputs(seen.objects, live)
        self._explain_unready(namespace, name, tiers)
        generations = status_rules.generations(
            self.cache.pods(namespace, name, {}),
            compatibility_generation(seen.epd) if seen.epd is not None else None,
        )
        new = status_rules.derive_status(
            tiers=tiers,
            topology=topology,
            endpoint=endpoint,
            observed_generation=observed,
            spec_errors=seen.errors,
            previous=seen.previous,
            now=utcnow(),
            refused=refused,
            generations=generations,
            held=self._held.get((namespace, name), []) if seen.epd is not None else [],
        )
        await self._publish(seen.body, seen.previous, new)
        self.metrics.set_phase(namespace, name, new.phase)
        self.metrics.set_generations(
            namespace, name, {g.name: {tier: g.readyPods.get(tier, 0) for tier in g.pods} for g in generations}
        )
        return "invalid" if seen.errors else "success"

    def _explain_unready(self, namespace: str, name: str, tiers: dict[str, status_rules.TierInput]) -> None:
        """For tiers not ready (short of ready pods, or rolling out), the scheduler's reason for a pod
        it cannot place, the kubelet's reason for a pod it cannot run, and a multi-node tier's groups
        that are not ready."""
        for role, tier in list(tiers.items()):
            dep = tier.deployment
            if dep is None or status_rules.tier_state(tier).ready:
                continue
            # The instance's pods (cache.pods) of the tier's role: what a tier Deployment selects, and a
            # LeaderWorkerSet's leaders and workers (it has no selector of its own).
            pods = self.cache.pods(namespace, name, {ROLE_LABEL: role})
            groups = status_rules.unready_groups_of(dep, pods)
            tiers[role] = dataclasses.replace(
                tier, unschedulable=unschedulable_reason(pods), trouble=pod_trouble(pods), unready_groups=groups
            )

    async def _converge(
        self, body: dict[str, Any], todo: apply.Plan, live: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], list[str]]:
        """Execute the plan: the children as they now are, and the refusal of an object the server
        refused when written (an admission webhook that judges only real writes), reported like the
        dry run's, not retried as a failure."""
        meta = body["metadata"]
        for step in todo.applies:
            if step.why == "drift":
                self.metrics.drift.labels(kind=step.desired["kind"]).inc()
            log.info("%s/%s: %s", meta["namespace"], meta["name"], step.describe())
        for obj in todo.prunes:
            log.info("%s/%s: pruning %s %s", meta["namespace"], meta["name"], obj["kind"], obj["metadata"]["name"])
        try:
            touched, refused = await apply.execute(self.kube, todo), []
        except apply.ApplyRefused as stopped:
            touched, refused, todo = stopped.touched, [stopped.problem], stopped.done
            log.warning("%s/%s: %s", meta["namespace"], meta["name"], stopped.problem)
        for obj in todo.prunes:
            self.cache.forget(obj)
        for written in touched.values():
            if written is not None:
                self.cache.record(written)  # the next pass may run before the watch event arrives
        applied = [s.describe() for s in todo.applies]
        if applied:
            await post_event(self.kube, body, "Normal", "Applied", "; ".join(applied), instance=self.identity)
        if todo.prunes:
            pruned = ", ".join(f"{o['kind']} {o['metadata']['name']}" for o in todo.prunes)
            await post_event(
                self.kube, body, "Normal", "Pruned", f"{pruned} deleted (no longer in the spec)", instance=self.identity
            )
        merged = {apply.key_of(obj): obj for obj in live}
        for obj_key, current in touched.items():
            if current is None:
                merged.pop(obj_key, None)
            else:
                merged[obj_key] = current
        return list(merged.values()), refused

    async def _publish(
        self, body: dict[str, Any], previous: EPDDeploymentStatus | None, new: EPDDeploymentStatus
    ) -> None:
        document = status_rules.status_document(new)
        if previous is not None and status_rules.status_document(previous) == document:
            return  # steady state: nothing changed, nothing written
        meta = body["metadata"]
        # Recorded, so a pass before the watch event compares with what it just wrote.
        self.cache.record(await self.kube.patch_status(EPD, meta["namespace"], meta["name"], document))
        for t in status_rules.transitions(previous, new):
            await post_event(self.kube, body, t.type, t.reason, t.message, instance=self.identity)
