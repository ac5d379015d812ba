"""From rendered objects to the few API writes that make the cluster match them.

Pure planning (`plan`) is separated from the writes (`execute`) so the decisions — what to apply,
what drifted, what to prune, when to hand replicas over to an HPA — are tested without an API.

Zero writes in steady state: an object is applied only when it is missing, when what we would
apply changed (a hash of it is kept in an annotation, which also catches fields we stopped
setting), or when the live object no longer carries what we applied (someone edited it). A no-op
server-side apply would still be a write request, so "apply everything, let the server sort it
out" is not an option.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import hashlib
import json
from typing import Any

from ..api.labels import APPLIED_HASH_ANNOTATION as APPLIED_HASH
from ..api.quantity import parse_quantity
from ..api.spec import API_VERSION, KIND
from ..kube import FIELD_MANAGER, ApiError, Kube, child_resource

# Field manager that keeps a Deployment's replicas alive while an HPA takes them over (below).
HANDOVER_MANAGER = "epd-operator-hpa-handover"

ObjKey = tuple[str, str]  # (kind, name)


def key_of(obj: dict[str, Any]) -> ObjKey:
    return obj["kind"], obj["metadata"]["name"]


def owner_reference(epd: dict[str, Any]) -> dict[str, Any]:
    meta = epd["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def applied_hash(obj: dict[str, Any]) -> str:
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:20]


def adopt(obj: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
    """The object as we apply it: owned by the EPDDeployment and stamped with its own hash."""
    adopted = copy.deepcopy(obj)
    meta = adopted.setdefault("metadata", {})
    meta["ownerReferences"] = [owner]
    meta.setdefault("annotations", {})[APPLIED_HASH] = applied_hash(adopted)
    return adopted


def is_owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj.get("metadata", {}).get("ownerReferences") or [])


# ----------------------------------------------------------------------------- drift


def _same_scalar(want: Any, have: Any) -> bool:
    if want == have and type(want) is type(have):
        return True
    if isinstance(want, bool) or isinstance(have, bool):
        return False
    # The API server normalises quantities and int-or-strings ("1" for 1, "500m" for "0.5").
    if isinstance(want, (int, float, str)) and isinstance(have, (int, float, str)):
        if str(want) == str(have):
            return True
        try:
            return parse_quantity(str(want)) == parse_quantity(str(have))
        except (ValueError, ArithmeticError):
            return False
    return False


# Keys by which the API server merges the lists we render (their `x-kubernetes-list-map-keys`):
# container and Service ports are keyed by port number, mounts by path, the rest by name.
_LIST_KEYS = ("name", "mountPath", "containerPort", "port")


def _merge_key(items: list[Any]) -> str | None:
    if not items or not all(isinstance(item, dict) for item in items):
        return None
    for key in _LIST_KEYS:
        if all(key in item for item in items) and len({item[key] for item in items}) == len(items):
            return key
    return None


def _drift(want: Any, have: Any, path: str, out: list[str]) -> None:
    if isinstance(want, dict):
        if not isinstance(have, dict):
            if want or have is not None:  # an empty map is omitted by the server too
                out.append(path or "<root>")
            return
        for key, value in want.items():
            _drift(value, have.get(key), f"{path}.{key}" if path else key, out)
    elif isinstance(want, list):
        have = have if isinstance(have, list) else ([] if have is None else None)
        key = _merge_key(want)
        if key is not None and have is not None:
            # A keyed list (containers, env, ports, volumes...) is merged by server-side apply: items
            # other managers add (`kubectl set env`, a mesh's sidecar) stay after our apply and are
            # not ours to judge, so only our own items are compared, found by their key.
            found = {item.get(key): item for item in have if isinstance(item, dict)}
            for w in want:
                h = found.get(w[key])
                if h is None:
                    out.append(f"{path}[{key}={w[key]}]")
                else:
                    _drift(w, h, f"{path}[{key}={w[key]}]", out)
            return
        if have is None or len(have) != len(want):
            out.append(path)
            return
        for index, (w, h) in enumerate(zip(want, have, strict=True)):
            _drift(w, h, f"{path}[{index}]", out)
    elif want is None or (have is None and want in (False, 0, "")):
        # Go's `omitempty` drops zero values, so the server never shows them back.
        return
    elif not _same_scalar(want, have):
        out.append(path)


def drift(desired: dict[str, Any], live: dict[str, Any]) -> list[str]:
    """Paths where `live` no longer carries what we apply. The server may add defaults and other
    managers may add fields (both fine); only our own values count."""
    out: list[str] = []
    want_meta = desired.get("metadata", {})
    have_meta = live.get("metadata", {})
    for part in ("labels", "annotations"):
        _drift(want_meta.get(part) or {}, have_meta.get(part) or {}, f"metadata.{part}", out)
    for ref in want_meta.get("ownerReferences") or []:
        if not is_owned_by(live, ref["uid"]):
            out.append("metadata.ownerReferences")
    for key, value in desired.items():
        if key not in ("apiVersion", "kind", "metadata", "status"):
            _drift(value, live.get(key), key, out)
    return out


# ----------------------------------------------------------------------------- HPA handover


def manages_replicas(live: dict[str, Any], manager: str = FIELD_MANAGER) -> bool:
    """Whether `manager` is the applier of `spec.replicas` on a live Deployment. Without
    managedFields we cannot tell, and assume so: the handover is harmless when unneeded."""
    entries = live.get("metadata", {}).get("managedFields")
    if entries is None:
        return True
    for entry in entries:
        if (
            entry.get("manager") == manager
            and entry.get("operation") == "Apply"
            and "f:replicas" in ((entry.get("fieldsV1") or {}).get("f:spec") or {})
        ):
            return True
    return False


def needs_replicas_handover(desired: dict[str, Any], live: dict[str, Any] | None) -> bool:
    """A tier that just became autoscaled stops applying `spec.replicas`. Server-side apply then
    removes the field if we were its only manager, and the Deployment falls back to 1 replica
    until the HPA reacts. So before that apply, a second manager applies the live value (the
    documented "transfer ownership to the HPA" recipe); the HPA's own writes take it from there."""
    return (
        live is not None
        and desired["kind"] in ("Deployment", "LeaderWorkerSet")
        and "replicas" not in desired.get("spec", {})
        and "replicas" in live.get("spec", {})
        and manages_replicas(live)
    )


def replicas_handover(live: dict[str, Any]) -> dict[str, Any]:
    meta = live["metadata"]
    return {
        "apiVersion": live["apiVersion"],
        "kind": live["kind"],
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "spec": {"replicas": live["spec"]["replicas"]},
    }


# ----------------------------------------------------------------------------- engine switch
#
# A tier's autoscaler is our HPA (engine HPA) or KEDA's ScaledObject (engine KEDA). Switching engines
# creates the one and prunes the other, in this order:
# - the old autoscaler goes first: KEDA's validating webhook (installed by its chart by default) refuses a
#   ScaledObject whose target an HPA it does not own scales ("is already managed by the hpa"), and two
#   autoscalers on one target fight (the HPA controller calls it AmbiguousSelector);
# - a tier KEDA scaled to zero gets `minReplicas` before its new HPA exists: an HPA whose target has 0
#   replicas disables itself ("scaling is disabled since the replica count of the target is zero") and
#   would leave the tier at zero for good.
# Both happen in one pass; the tier keeps its replicas in between (nothing else writes them).

AUTOSCALERS = ("HorizontalPodAutoscaler", "ScaledObject")


def scale_target(autoscaler: dict[str, Any]) -> ObjKey | None:
    """The (kind, name) an HPA or ScaledObject scales."""
    ref = (autoscaler.get("spec") or {}).get("scaleTargetRef") or {}
    return (ref["kind"], ref["name"]) if ref.get("kind") and ref.get("name") else None


def replaced_autoscaler(desired: dict[str, Any], live: list[dict[str, Any]], owner_uid: str) -> dict[str, Any] | None:
    """The live autoscaler of ours, of the other engine, that scales what a new `desired` autoscaler will."""
    if desired["kind"] not in AUTOSCALERS:
        return None
    target = scale_target(desired)
    for obj in live:
        if (
            obj["kind"] in AUTOSCALERS
            and obj["kind"] != desired["kind"]
            and scale_target(obj) == target
            and is_owned_by(obj, owner_uid)
        ):
            return obj
    return None


def wake_for_hpa(hpa: dict[str, Any], live_target: dict[str, Any] | None) -> dict[str, Any] | None:
    """What to apply (as HANDOVER_MANAGER, forced: KEDA wrote the 0) so that a tier at zero starts its new
    HPA's life at `minReplicas`; None when its target is not at zero."""
    if live_target is None or (live_target.get("spec") or {}).get("replicas") != 0:
        return None
    meta = live_target["metadata"]
    return {
        "apiVersion": live_target["apiVersion"],
        "kind": live_target["kind"],
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "spec": {"replicas": hpa["spec"]["minReplicas"]},  # rendered always, at least 1
    }


# ----------------------------------------------------------------------------- plan


@dataclasses.dataclass(frozen=True)
class Apply:
    desired: dict[str, Any]
    why: str  # "create" | "update" (our config changed) | "drift" (someone changed the live object)
    drifted: tuple[str, ...] = ()
    handover: dict[str, Any] | None = None
    # Engine switch (above): the live autoscaler this one replaces, deleted before this apply (an HPA that
    # replaces a ScaledObject first wakes a tier at zero: `wake_for_hpa`, read when the ScaledObject is gone).
    replaces: dict[str, Any] | None = None

    def describe(self) -> str:
        kind, name = key_of(self.desired)
        if self.why == "create":
            return f"{kind} {name} created"
        if self.why == "drift":
            return f"{kind} {name} restored ({', '.join(self.drifted[:3])} had been changed)"
        return f"{kind} {name} updated"


@dataclasses.dataclass(frozen=True)
class Plan:
    applies: list[Apply]
    prunes: list[dict[str, Any]]

    def __bool__(self) -> bool:
        return bool(self.applies or self.prunes)


def plan(desired: list[dict[str, Any]], live: list[dict[str, Any]], owner_uid: str) -> Plan:
    """What to write so the children of one EPDDeployment become `desired` (already adopted)."""
    live_by_key = {key_of(obj): obj for obj in live}
    applies = []
    for obj in desired:
        current = live_by_key.get(key_of(obj))
        handover = replicas_handover(current) if current and needs_replicas_handover(obj, current) else None
        replaces = replaced_autoscaler(obj, live, owner_uid) if current is None else None
        if replaces is not None:
            applies.append(Apply(obj, "create", replaces=replaces))
        elif current is None:
            applies.append(Apply(obj, "create"))
        elif (
            current["metadata"].get("annotations", {}).get(APPLIED_HASH) != obj["metadata"]["annotations"][APPLIED_HASH]
        ):
            applies.append(Apply(obj, "update", handover=handover))
        else:
            paths = drift(obj, current)
            if paths:
                applies.append(Apply(obj, "drift", tuple(paths), handover))
    wanted = {key_of(obj) for obj in desired}
    prunes = [obj for obj in live if key_of(obj) not in wanted and is_owned_by(obj, owner_uid)]
    return Plan(applies, prunes)


# Kinds the spec cannot shape beyond names (no pass-through fields), so the server cannot refuse
# them over a user's input. RBAC objects are also the ones a dry run cannot judge alone: a
# RoleBinding's escalation check reads its Role, which a dry run of the Role did not create.
UNSHAPED_KINDS = frozenset({"ServiceAccount", "Role", "RoleBinding"})


def admission_denial(error: ApiError) -> bool:
    """An admission webhook (or ValidatingAdmissionPolicy) denied the request. The API server reports a
    webhook's denial with the status code the webhook chose (controller-runtime's, KEDA's included, say
    403) and the message `admission webhook "<name>" denied the request: <the webhook's words>`
    (k8s.io/apiserver admission/plugin/webhook/errors.ToStatusErr); a policy's as `... denied request: ...`."""
    message = error.body.get("message") if isinstance(error.body, dict) else None
    if not isinstance(message, str) or error.status < 400 or error.status >= 500:
        return False
    return (message.startswith("admission webhook ") and " denied the request" in message) or (
        "ValidatingAdmissionPolicy " in message and " denied request" in message
    )


def refusal(error: ApiError) -> bool:
    """The server refused the object itself (invalid value, unknown field, an admission webhook's or
    policy's denial): sending it again cannot succeed until the spec (or the cluster's policy) changes.
    Anything else (RBAC, conflicts, 5xx, 429, a webhook that could not be called) is retried and evented."""
    return error.status in (400, 422) or admission_denial(error)


async def refused_by_server(kube: Kube, todo: Plan) -> list[str]:
    """Server-side dry-run of every apply in `todo`: the server's words for each object it would
    refuse. Checked before anything is written, so a spec that yields one bad object changes nothing
    (no tier rolled with half of a change)."""
    problems = []
    for step in todo.applies:
        if step.desired["kind"] in UNSHAPED_KINDS:
            continue
        try:
            await kube.apply(step.desired, dry_run=True)
        except ApiError as exc:
            kind, name = key_of(step.desired)
            resource = child_resource(step.desired)
            if exc.status == 404 and resource.optional:
                problems.append(
                    f"{kind} {name}: this cluster does not serve {step.desired['apiVersion']} {kind} "
                    f"({resource.when_missing})"
                )
                continue
            if not refusal(exc):
                raise
            if step.replaces is not None and admission_denial(exc):
                # Judged against the cluster as it is, with the autoscaler this plan deletes first
                # (KEDA's "already managed by the hpa"): judged again, for real, when it is created.
                continue
            message = exc.body.get("message") if isinstance(exc.body, dict) else str(exc)
            problems.append(f"{kind} {name}: {message}")
    return problems


# What an object refused when written (not on the dry run) says besides the server's words: what came
# before it in the plan is applied. An admission webhook may judge only real writes: KEDA's skips its
# checks of the target's resource requests on a dry run.
REFUSED_WHEN_WRITTEN = "refused when written, after what came before it in the plan was applied"


class ApplyRefused(Exception):
    """The server refused an object of the plan when it was written: the refusal, in the dry run's
    form, what was written before it (as `execute` returns it) and the part of the plan that was done."""

    def __init__(self, problem: str, touched: dict[ObjKey, dict[str, Any] | None], todo: Plan) -> None:
        super().__init__(problem)
        self.problem = problem
        self.touched = touched
        # An engine switch's old autoscaler, deleted before its replacement was refused, is a prune done.
        self.done = Plan(
            [step for step in todo.applies if key_of(step.desired) in touched],
            [obj for obj in todo.prunes if key_of(obj) in touched],
        )


def _refused(desired: dict[str, Any], error: ApiError) -> str:
    kind, name = key_of(desired)
    message = error.body.get("message") if isinstance(error.body, dict) else str(error)
    return f"{kind} {name}: {message} ({REFUSED_WHEN_WRITTEN})"


# KEDA's webhook reads HPAs from its informer cache: for a moment after the old HPA is deleted it may still
# see it. A replacement denied by an admission webhook is tried again this often before the pass gives up.
REPLACEMENT_TRIES = 10
REPLACEMENT_RETRY_S = 1.0
# A ScaledObject being deleted keeps KEDA's scale loop running until KEDA's finalizer is done (it may still
# take an idle tier to zero): a tier is woken for its HPA only once the ScaledObject is gone, waited for
# this long at most (then woken anyway), read this often.
REPLACED_GONE_S = 30.0
REPLACED_POLL_S = 0.5


async def _delete(kube: Kube, obj: dict[str, Any]) -> None:
    meta = obj["metadata"]
    await kube.delete(child_resource(obj), meta["namespace"], meta["name"], uid=meta.get("uid"))


async def _gone(kube: Kube, obj: dict[str, Any]) -> None:
    meta, deadline = obj["metadata"], asyncio.get_running_loop().time() + REPLACED_GONE_S
    while await kube.get(child_resource(obj), meta["namespace"], meta["name"]) is not None:
        if asyncio.get_running_loop().time() > deadline:
            return
        await asyncio.sleep(REPLACED_POLL_S)


async def _target(kube: Kube, autoscaler: dict[str, Any]) -> dict[str, Any] | None:
    """The live object an autoscaler scales, as the server has it now."""
    ref = autoscaler["spec"]["scaleTargetRef"]
    target = {"apiVersion": ref["apiVersion"], "kind": ref["kind"]}
    return await kube.get(child_resource(target), autoscaler["metadata"]["namespace"], ref["name"])


async def _create_replacement(kube: Kube, step: Apply) -> dict[str, Any]:
    for _ in range(REPLACEMENT_TRIES - 1):
        try:
            return await kube.apply(step.desired)
        except ApiError as exc:
            if not admission_denial(exc):
                raise
        await asyncio.sleep(REPLACEMENT_RETRY_S)
    return await kube.apply(step.desired)  # the last try: its denial is the refusal


async def execute(kube: Kube, todo: Plan) -> dict[ObjKey, dict[str, Any] | None]:
    """Apply, then prune (so a replacement exists before what it replaces goes), except for an engine
    switch, whose old autoscaler goes first (above). Returns the live state of every touched object
    (None for pruned ones). An object the server refuses when written stops the plan: `ApplyRefused`."""
    touched: dict[ObjKey, dict[str, Any] | None] = {}
    for step in todo.applies:
        try:
            if step.replaces is not None:
                await _delete(kube, step.replaces)
                touched[key_of(step.replaces)] = None
                if step.replaces["kind"] == "ScaledObject":
                    await _gone(kube, step.replaces)
                    wake = wake_for_hpa(step.desired, await _target(kube, step.desired))
                    if wake is not None:
                        await kube.apply(wake, field_manager=HANDOVER_MANAGER, force=True)
                touched[key_of(step.desired)] = await _create_replacement(kube, step)
                continue
            if step.handover is not None:
                await kube.apply(step.handover, field_manager=HANDOVER_MANAGER, force=False)
            touched[key_of(step.desired)] = await kube.apply(step.desired)
        except ApiError as exc:
            if not refusal(exc):
                raise
            raise ApplyRefused(_refused(step.desired, exc), touched, todo) from exc
    for obj in todo.prunes:
        if key_of(obj) in touched:  # an engine switch deleted it already
            continue
        await _delete(kube, obj)
        touched[key_of(obj)] = None
    return touched
