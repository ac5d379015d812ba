"""Leader election on a coordination.k8s.io/v1 Lease, the way client-go's leaderelection does it.

Why a Lease and not kopf peering: peering needs its own cluster-scoped CRD, and replicas with equal
priority do not elect one of them; a Lease is what every Kubernetes controller uses, and
`kubectl get lease` shows who leads.

Safety: a candidate takes an expired Lease only after it has watched the *same* record for a full
lease duration on its own monotonic clock (clock skew between nodes does not matter), and writes
with the Lease's resourceVersion, so of two candidates only one write wins. The leader stops acting
if it could not renew within `renew_deadline` (< lease duration) of its last renewal, i.e. before
any candidate may take over, and is a candidate again (controller/main.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import math
import time

from ..kube import LEASE, REQUEST_ERRORS, ApiError, Kube

log = logging.getLogger(__name__)


def _micro_time() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclasses.dataclass
class LeaseElector:
    kube: Kube
    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    # When the Lease's record last changed, and this replica's last successful write: set before any read.
    _observed_at: float = dataclasses.field(init=False, repr=False)
    _last_renewal: float = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.renew_interval = self.lease_duration / 3
        self.renew_deadline = self.lease_duration * 2 / 3
        self.retry_interval = max(self.lease_duration / 10, 0.05)
        self.is_leader = False
        self._observed: tuple[str, str] | None = None  # (holder, resourceVersion) of the Lease last read

    async def _try_acquire_or_renew(self) -> bool:
        """True when we hold the Lease after this call; raises when the API could not be asked."""
        lease = await self.kube.get(LEASE, self.namespace, self.name)
        now = _micro_time()
        duration = max(1, math.ceil(self.lease_duration))
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {
                    "holderIdentity": self.identity,
                    "leaseDurationSeconds": duration,
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": 0,
                },
            }
            try:
                await self.kube.create(LEASE, self.namespace, body)
            except ApiError as exc:
                if exc.status == 409:
                    return False  # another candidate created it first
                raise
            return self._held()
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        # Every write of a Lease gets a new resourceVersion: a record that keeps it for a lease duration was not renewed.
        record = (holder, lease["metadata"]["resourceVersion"])
        if record != self._observed:
            self._observed, self._observed_at = record, time.monotonic()
        if holder and holder != self.identity:
            expired = time.monotonic() - self._observed_at >= spec.get("leaseDurationSeconds", duration)
            if not expired:
                return False
        ours = holder == self.identity
        lease["spec"] = {
            **spec,
            "holderIdentity": self.identity,
            "leaseDurationSeconds": duration,
            "renewTime": now,
            "acquireTime": spec.get("acquireTime") if ours else now,
            "leaseTransitions": (spec.get("leaseTransitions") or 0) + (0 if ours or not holder else 1),
        }
        try:
            await self.kube.replace(LEASE, self.namespace, lease)
        except ApiError as exc:
            if exc.status == 409:
                return False  # someone wrote it since we read it
            raise
        return self._held()

    def _held(self) -> bool:
        self._last_renewal = time.monotonic()
        return True

    async def acquire(self) -> None:
        """Wait until this candidate leads (cancel to give up)."""
        announced = False
        while True:
            try:
                if await self._try_acquire_or_renew():
                    self.is_leader = True
                    log.info("leading: holding Lease %s/%s as %s", self.namespace, self.name, self.identity)
                    return
            except REQUEST_ERRORS as exc:
                log.warning("leader election: %s", exc)
            if not announced:
                log.info(
                    "standing by: Lease %s/%s is held by %s",
                    self.namespace,
                    self.name,
                    self._observed[0] if self._observed else "?",
                )
                announced = True
            await asyncio.sleep(self.renew_interval)

    async def hold(self) -> None:
        """Renew until leadership is lost, then return (the caller must stop acting at once)."""
        while True:
            await asyncio.sleep(self.renew_interval)
            deadline = self._last_renewal + self.renew_deadline
            while True:
                try:
                    if await asyncio.wait_for(self._try_acquire_or_renew(), max(deadline - time.monotonic(), 0.01)):
                        break
                    log.error(
                        "leadership lost: Lease %s/%s now held by %s",
                        self.namespace,
                        self.name,
                        self._observed[0] if self._observed else "?",
                    )
                    self.is_leader = False
                    return
                except (TimeoutError, *REQUEST_ERRORS) as exc:
                    log.warning("could not renew the Lease: %s", str(exc) or type(exc).__name__)
                if time.monotonic() >= deadline:
                    log.error("leadership lost: the Lease was not renewed within %.1fs", self.renew_deadline)
                    self.is_leader = False
                    return
                await asyncio.sleep(self.retry_interval)

    async def release(self) -> None:
        """Hand the Lease back on a clean stop, so a standby takes over at once, not after expiry."""
        if not self.is_leader:
            return
        self.is_leader = False
        try:
            lease = await self.kube.get(LEASE, self.namespace, self.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"] = {
                **lease["spec"],
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "renewTime": _micro_time(),
            }
            await self.kube.replace(LEASE, self.namespace, lease)
            log.info("released Lease %s/%s", self.namespace, self.name)
        except REQUEST_ERRORS as exc:
            log.warning("could not release the Lease (a standby takes over when it expires): %s", exc)
