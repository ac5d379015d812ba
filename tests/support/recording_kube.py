"""A stand-in for `epd_operator.kube.Kube` that records the writes the operator's apply step makes.

Only for the order and arguments of the calls `controller.apply` makes (what a unit test can judge);
what the API server does with them is tested against the real control plane in tests/integration.
"""

from __future__ import annotations

from typing import Any, cast

from epd_operator.kube import ApiError, Kube


class RecordingKube:
    def __init__(self, refuse: dict[tuple[str, str], ApiError] | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.refuse = refuse or {}  # (kind, name) -> the error a dry run of it raises

    async def apply(
        self, obj: dict[str, Any], *, field_manager: str = "epd-operator", force: bool = True, dry_run: bool = False
    ) -> dict[str, Any]:
        key = (obj["kind"], obj["metadata"]["name"])
        self.calls.append(("apply", key, field_manager, force, dry_run))
        if dry_run and key in self.refuse:
            raise self.refuse[key]
        return {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(len(self.calls))}}

    async def delete(self, resource: Any, namespace: str | None, name: str, *, uid: str | None = None) -> bool:
        self.calls.append(("delete", resource.kind, namespace, name, uid))
        return True


def as_kube(recording: RecordingKube) -> Kube:
    """The stand-in where the controller's functions take a Kube: it has every method they call."""
    return cast(Kube, recording)
