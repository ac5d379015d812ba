"""What the reconciler reads: the EPDDeployments, their children and their pods, fed by kopf's watches.

A pass reads memory only, never the API server: the watches kopf already runs (label-selected on the
server, so only the operator's own objects arrive) feed this store. Reading the API server instead
would cost nine requests per EPDDeployment per resync at rest (a GET of it, a LIST of every child kind).

- Keyed by (kind, namespace, name); children and pods are indexed by the EPDDeployment they belong
  to, through the operator's instance label (api/labels.py), which the watches' selector guarantees.
- Writes go through it too (`record`, `forget`): a pass that just created a child must see it on the
  next pass even if the watch event is still on its way, and a child it pruned must not come back.
- An event older than what is held is ignored. resourceVersions are opaque to clients by contract;
  every API server in the tested range uses etcd revisions (integers), so they are compared when
  both are integers, and otherwise the latest arrival wins (the watch's own order).
- A watch that lists again (after a 410 Gone) replays what exists, never what was deleted in the
  gap, so the reconciler lists each kind now and then (`replace_kind`, every `AUDIT_SECONDS`, not per
  pass) and drops what is gone.
- Bounded: objects are held as compact JSON without managedFields (except who applies a
  Deployment's replicas, which the HPA handover reads) and without kubectl's last-applied copy;
  pods keep only their metadata, phase, conditions and what their container statuses say about
  trouble (state, last exit, readiness; messages cut at `MAX_POD_MESSAGE`). A read decodes a
  private copy, so a pass can change what it reads without corrupting the store.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ..api.labels import INSTANCE_LABEL

ObjectKey = tuple[str, str, str]  # (kind, namespace, name)
Owner = tuple[str, str]  # (namespace, EPDDeployment name)

POD_KIND = "Pod"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
MAX_TOMBSTONES = 4096
MAX_POD_MESSAGE = 1000  # characters of a container state's message kept (an Event takes 1024)


def _revision(obj: dict[str, Any]) -> int | None:
    try:
        return int(obj["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return None


def _replicas_owners(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The managedFields entries that own spec.replicas, reduced to that (apply.manages_replicas)."""
    kept: list[dict[str, Any]] = []
    for entry in entries:
        if "f:replicas" in ((entry.get("fieldsV1") or {}).get("f:spec") or {}):
            kept.append(
                {
                    "manager": entry.get("manager"),
                    "operation": entry.get("operation"),
                    "fieldsV1": {"f:spec": {"f:replicas": {}}},
                }
            )
    return kept


def _container_state(state: dict[str, Any] | None) -> dict[str, Any]:
    """A container state (waiting, running, terminated) reduced to its reason, message and exit code."""
    kept: dict[str, Any] = {}
    for phase, detail in (state or {}).items():
        detail = detail or {}
        reduced = {k: detail[k] for k in ("reason", "exitCode") if detail.get(k) is not None}
        message = str(detail.get("message") or "")
        if message:
            reduced["message"] = message if len(message) <= MAX_POD_MESSAGE else message[: MAX_POD_MESSAGE - 1] + "…"
        kept[phase] = reduced
    return kept


def _container_statuses(statuses: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [
        {
            "name": c.get("name"),
            "ready": bool(c.get("ready")),
            "state": _container_state(c.get("state")),
            "lastState": _container_state(c.get("lastState")),
        }
        for c in statuses or []
    ]


def slim(obj: dict[str, Any]) -> dict[str, Any]:
    """The parts of an object a reconcile reads (a shallow rebuild: the input is not changed)."""
    meta = dict(obj.get("metadata") or {})
    managed = meta.pop("managedFields", None)
    if managed and obj.get("kind") == "Deployment":
        meta["managedFields"] = _replicas_owners(managed)
    annotations = meta.get("annotations")
    if annotations and LAST_APPLIED in annotations:
        meta["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    if obj.get("kind") == POD_KIND:
        keep = ("name", "namespace", "uid", "resourceVersion", "labels", "deletionTimestamp")
        status = obj.get("status") or {}
        slim_status: dict[str, Any] = {"conditions": status.get("conditions") or []}
        if status.get("phase"):
            slim_status["phase"] = status["phase"]
        for field in ("initContainerStatuses", "containerStatuses"):
            if status.get(field):
                slim_status[field] = _container_statuses(status[field])
        return {
            "apiVersion": "v1",  # core/v1, the only Pod there is (a list's items carry none)
            "kind": POD_KIND,
            "metadata": {k: meta[k] for k in keep if k in meta},
            "status": slim_status,
        }
    return {**obj, "metadata": meta}


class Cache:
    def __init__(self) -> None:
        self._data: dict[ObjectKey, bytes] = {}
        self.bytes = 0  # of the JSON held: what a metric reports, to show the store stays bounded
        self._revisions: dict[ObjectKey, int | None] = {}
        self._owners: dict[ObjectKey, Owner] = {}
        self._owned: dict[Owner, set[ObjectKey]] = {}
        # uid -> key of objects this process deleted whose DELETED event has not come yet: a late
        # event from before the delete must not bring them back.
        self._deleted: dict[str, ObjectKey] = {}

    def __len__(self) -> int:
        return len(self._data)

    # ---------------------------------------------------------------- feeding

    def observe(self, event_type: str | None, obj: dict[str, Any]) -> None:
        """A watch event (type None: an object from kopf's initial listing)."""
        if event_type == "DELETED":
            uid = obj["metadata"].get("uid")
            self._deleted.pop(uid, None)
            key = self._key(obj)
            if self._newer_or_same(key, obj):
                self._drop(key)
        else:
            self.record(obj)

    def record(self, obj: dict[str, Any]) -> None:
        """An object as the server returned it (a watch event or the answer to our write)."""
        meta = obj["metadata"]
        if meta.get("uid") in self._deleted:
            return
        key = self._key(obj)
        revision = _revision(obj)
        if key in self._revisions:
            held = self._revisions[key]
            if held is not None and revision is not None and revision <= held:
                return  # older, or what we hold already (our write, then its own watch event)
        data = json.dumps(slim(obj), separators=(",", ":")).encode()
        self.bytes += len(data) - len(self._data.get(key, b""))
        self._data[key] = data
        self._revisions[key] = revision
        instance = (meta.get("labels") or {}).get(INSTANCE_LABEL)
        owner = (meta["namespace"], instance) if instance else None
        previous = self._owners.get(key)
        if previous != owner:
            if previous is not None:
                self._unindex(key, previous)
            if owner is not None:
                self._owners[key] = owner
                self._owned.setdefault(owner, set()).add(key)

    def forget(self, obj: dict[str, Any]) -> None:
        """An object this process deleted (its DELETED event may come after the next pass)."""
        uid = obj["metadata"].get("uid")
        if uid:
            self._deleted[uid] = self._key(obj)
            if len(self._deleted) > MAX_TOMBSTONES:  # DELETED events a watch gap swallowed
                del self._deleted[next(iter(self._deleted))]
        self._drop(self._key(obj))

    def replace_kind(self, kind: str, namespace: str, items: list[dict[str, Any]], revision: str) -> set[Owner]:
        """A fresh LIST of `kind` in `namespace` (at `revision`): what it shows is recorded, and what it
        lacks is dropped unless held at a later revision (created since). This catches the deletions a
        watch that had to list again never reports. Returns whose objects were dropped: the children's
        EPDDeployments, and (namespace, name) of dropped EPDDeployments."""
        listed = set()
        for obj in items:
            self.record(obj)
            listed.add(self._key(obj))
        at = int(revision) if revision.isdigit() else None
        dropped: set[Owner] = set()
        for key in [k for k in self._data if k[0] == kind and k[1] == namespace and k not in listed]:
            held = self._revisions.get(key)
            if at is not None and held is not None and held > at:
                continue
            dropped.add(self._owners.get(key) or (namespace, key[2]))
            self._drop(key)
        return dropped

    # ---------------------------------------------------------------- reading

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        data = self._data.get((kind, namespace, name))
        return None if data is None else json.loads(data)

    def owned(self, namespace: str, instance: str, kinds: Iterable[str]) -> list[dict[str, Any]]:
        """The objects of these kinds labelled as belonging to the EPDDeployment `instance`."""
        wanted = set(kinds)
        keys = sorted(k for k in self._owned.get((namespace, instance), ()) if k[0] in wanted)
        return [json.loads(self._data[k]) for k in keys]

    def pods(self, namespace: str, instance: str, selector: dict[str, str]) -> list[dict[str, Any]]:
        """The EPDDeployment's pods whose labels include `selector` (a Deployment's matchLabels)."""
        return [
            pod
            for pod in self.owned(namespace, instance, [POD_KIND])
            if all(pod["metadata"]["labels"].get(k) == v for k, v in selector.items())  # indexed by a label
        ]

    # ---------------------------------------------------------------- internals

    @staticmethod
    def _key(obj: dict[str, Any]) -> ObjectKey:
        meta = obj["metadata"]
        return obj["kind"], meta["namespace"], meta["name"]  # every kind the operator caches is namespaced

    def _newer_or_same(self, key: ObjectKey, obj: dict[str, Any]) -> bool:
        held, revision = self._revisions.get(key), _revision(obj)
        return held is None or revision is None or revision >= held

    def _drop(self, key: ObjectKey) -> None:
        self.bytes -= len(self._data.pop(key, b""))
        self._revisions.pop(key, None)
        owner = self._owners.pop(key, None)
        if owner is not None:
            self._unindex(key, owner)

    def _unindex(self, key: ObjectKey, owner: Owner) -> None:
        owned = self._owned.get(owner)
        if owned is not None:
            owned.discard(key)
            if not owned:
                del self._owned[owner]
        if self._owners.get(key) == owner:
            del self._owners[key]
