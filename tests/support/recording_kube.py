"""A stand-in for `epd_operator.kube.Kube` that records the writes the operator's apply step makes.

Only for the order and arguments of the calls the controller makes (what a unit test can judge): the
apply step's writes and dry runs, a pass's status write and its Events. What the API server does with
them is tested against the real control plane in tests/integration.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from epd_operator.kube import ApiError, Kube


class RecordingKube:
    def __init__(
        self,
        refuse: dict[tuple[str, str], ApiError] | None = None,
        refuse_writes: dict[tuple[str, str], ApiError] | None = None,
    ) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.refuse = refuse or {}  # (kind, name) -> the error a dry run of it raises
        # (kind, name) -> the error its real write raises, the dry run having passed (a webhook that judges writes)
        self.refuse_writes = refuse_writes or {}
        self.lingering: dict[tuple[str, str], int] = {}  # (kind, name) -> reads that still find it (a finalizer)
        # (kind, namespace, name) -> the object as the server holds it, for answers that return it whole
        self.stored: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        # Called with the object a status write returns, before the write returns: a watch event that
        # arrives while the pass that wrote it still runs.
        self.on_status: Callable[[dict[str, Any]], None] | None = None

    async def apply(
        self, obj: dict[str, Any], *, field_manager: str = "epd-operator", force: bool = True, dry_run: bool = False
    ) -> dict[str, Any]:
        key = (obj["kind"], obj["metadata"]["name"])
        self.calls.append(("apply", key, field_manager, force, dry_run))
        if dry_run and key in self.refuse:
            raise self.refuse[key]
        if not dry_run and key in self.refuse_writes:
            raise self.refuse_writes[key]
        return {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(len(self.calls))}}

    async def delete(self, resource: Any, namespace: str | None, name: str, *, uid: str | None = None) -> bool:
        self.calls.append(("delete", resource.kind, namespace, name, uid))
        return True

    async def get(self, resource: Any, namespace: str | None, name: str) -> dict[str, Any] | None:
        """What `stored` holds; a deleted object is gone at once unless `lingering` holds a count of reads to go."""
        self.calls.append(("get", resource.kind, namespace, name))
        left = self.lingering.get((resource.kind, name), 0)
        if left:
            self.lingering[(resource.kind, name)] = left - 1
            return {"metadata": {"name": name, "deletionTimestamp": "2026-01-01T00:00:00Z"}}
        return self.stored.get((resource.kind, namespace, name))

    async def patch_status(
        self, resource: Any, namespace: str | None, name: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        """The stored object with this status, at a new resourceVersion (as the server answers)."""
        self.calls.append(("patch_status", resource.kind, namespace, name, status))
        stored = self.stored[(resource.kind, namespace, name)]
        revision = str(int(stored["metadata"].get("resourceVersion") or 0) + 1)
        stored = {**stored, "metadata": {**stored["metadata"], "resourceVersion": revision}, "status": status}
        self.stored[(resource.kind, namespace, name)] = stored
        if self.on_status is not None:
            self.on_status(stored)
        return stored

    async def create(self, resource: Any, namespace: str | None, obj: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("create", resource.kind, namespace, obj))
        return obj

    def dry_runs(self) -> int:
        return sum(1 for call in self.calls if call[0] == "apply" and call[4])

    def statuses(self) -> list[dict[str, Any]]:
        """Every status written, in order."""
        return [call[4] for call in self.calls if call[0] == "patch_status"]


def as_kube(recording: RecordingKube) -> Kube:
    """The stand-in where the controller's functions take a Kube: it has every method they call."""
    return cast(Kube, recording)
