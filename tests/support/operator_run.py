"""Run the real `epd-operator` for tests: as a subprocess (the console script) or in-process.

    async with OperatorProcess(kubeconfig, "--namespace", "default") as op:
        await op.wait_for_role("leader")
        ...                                   # op.metric("epd_operator_reconciles_total", kind="full")

The subprocess listens on free loopback ports, and is stopped with SIGTERM (then SIGKILL after a
timeout) on exit; its output is kept for assertion messages. Everything is async because an operator
run in-process (`operator_in_process`) shares the test's own event loop, which a blocking wait would freeze.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from dev.ports import free_port
from epd_operator.controller.main import Options, run
from epd_operator.controller.metrics import Metrics
from epd_operator.kube import CredentialSource
from tests.support.prom import metric_value
from tests.support.render_examples import SHARED_STORAGE, example_document

if TYPE_CHECKING:
    from tests.support.cluster import KubeView


def operator_command() -> list[str]:
    """The installed console script next to this interpreter, else the module."""
    script = Path(sys.executable).parent / "epd-operator"
    return [str(script)] if script.exists() else [sys.executable, "-m", "epd_operator.controller.main"]


class OperatorProcess:
    def __init__(
        self,
        kubeconfig: str | os.PathLike[str],
        *args: str,
        env: dict[str, str] | None = None,
        lease_duration: float = 2.0,
        stop_timeout: float = 15.0,
    ):
        self.liveness_port, self.metrics_port = free_port(), free_port()
        self.args = [
            *operator_command(),
            *args,
            "--bind-address",
            "127.0.0.1",
            "--liveness-port",
            str(self.liveness_port),
            "--metrics-port",
            str(self.metrics_port),
        ]
        if "--lease-duration" not in args:
            self.args += ["--lease-duration", str(lease_duration)]
        self.env = {**(env or os.environ), "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"}
        self.stop_timeout = stop_timeout
        self.process: asyncio.subprocess.Process | None = None
        self._output: list[str] = []
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> OperatorProcess:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            *self.args,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
        )
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        async for line in self.process.stdout:
            self._output.append(line.decode(errors="replace"))

    @property
    def output(self) -> str:
        return "".join(self._output)

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode

    async def stop(self, sig: int = signal.SIGTERM) -> int | None:
        """Signal the process and wait for it (SIGKILL after `stop_timeout`); returns its status."""
        if self.process is None:
            return None
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)
            try:
                await asyncio.wait_for(self.process.wait(), self.stop_timeout)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        return self.process.returncode

    async def _get(self, port: int, path: str) -> tuple[int, str]:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}{path}", timeout=aiohttp.ClientTimeout(total=5)) as resp,
        ):
            return resp.status, await resp.text()

    async def healthz(self) -> dict[str, Any] | None:
        """The /healthz answer, or None while the process does not serve yet."""
        try:
            status, text = await self._get(self.liveness_port, "/healthz")
        except (TimeoutError, aiohttp.ClientError, OSError):
            return None
        return {"http_status": status, **json.loads(text)}

    async def metrics_text(self) -> str:
        return (await self._get(self.metrics_port, "/metrics"))[1]

    async def metric(self, name: str, **labels: str) -> float:
        return metric_value(await self.metrics_text(), name, **labels)

    async def wait_for_role(self, role: str, timeout: float = 30.0) -> None:
        """Wait until /healthz reports `role` (standby | leader); fail early if the process exits."""

        async def reached() -> bool:
            health = await self.healthz()
            return health is not None and health.get("role") == role

        await wait_until(
            reached,
            timeout,
            lambda: f"epd-operator never became {role}:\n{self.output}",
            alive=lambda: self.returncode is None,
        )


async def wait_until(
    condition: Any,
    timeout: float = 15.0,
    message: Any = "condition not met",
    alive: Any = lambda: True,
    interval: float = 0.05,
) -> None:
    """Poll `condition` (sync or async) until truthy. `message` may be a callable (evaluated late)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if not alive() or loop.time() > deadline:
            raise AssertionError(message() if callable(message) else message)
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def operator_in_process(
    kube: KubeView | CredentialSource, *args: str, metrics: Metrics | None = None
) -> AsyncIterator[Metrics]:
    """The operator's `run()` in this process (kopf in-process), stopped on exit.

    It gets a thread and an event loop of its own: when kopf stops it cancels every task created
    in its loop after it started, which in the test's loop would include the test's own tasks."""
    from epd_operator.controller.main import parse_args

    options: Options = parse_args(
        [*args, "--bind-address", "127.0.0.1", "--liveness-port", str(free_port()), "--metrics-port", str(free_port())]
    )
    metrics = metrics or Metrics()
    credentials = kube if callable(kube) else kube.credentials
    started: asyncio.Future[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = (
        asyncio.get_running_loop().create_future()
    )
    caller = asyncio.get_running_loop()

    async def operator_main() -> int:
        stop = asyncio.Event()
        caller.call_soon_threadsafe(started.set_result, (asyncio.get_running_loop(), stop))
        return await run(options, stop=stop, metrics=metrics, credentials=credentials)

    thread = asyncio.ensure_future(asyncio.to_thread(asyncio.run, operator_main()))
    loop, stop = await asyncio.wait_for(started, 10)
    try:
        yield metrics
    finally:
        # Its loop is closed already when it stopped by itself (an optional kind appeared: served_kinds.py).
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(stop.set)
        assert await asyncio.wait_for(thread, 30) == 0


# ----------------------------------------------------------------------------- EPDDeployments in tests
# Reads and writes go to the real API server of ``tests/support/cluster.py`` through a KubeView.

EPD_API = "serving.epd.dev/v1alpha1"

CHILD_KINDS = [
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("v1", "ServiceAccount"),
    ("apps/v1", "Deployment"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"),
    ("policy/v1", "PodDisruptionBudget"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
]
OPTIONAL_CHILD_KINDS = [("gateway.networking.k8s.io/v1", "HTTPRoute")]  # where the Gateway API is installed


def epd_doc(
    example: str = SHARED_STORAGE, name: str = "vl", namespace: str | None = None, **spec_changes: Any
) -> dict[str, Any]:
    """An example EPDDeployment; `spec_changes` set top-level spec fields (None removes one)."""
    doc = copy.deepcopy(example_document(example))
    doc["metadata"] = {"name": name, **({"namespace": namespace} if namespace else {})}
    for key, value in spec_changes.items():
        if value is None:
            doc["spec"].pop(key, None)
        else:
            doc["spec"][key] = value
    return doc


def epd_path(kube: KubeView, name: str = "vl") -> str:
    return f"/apis/{EPD_API}/namespaces/{kube.ns}/epddeployments/{name}"


def children(kube: KubeView, name: str = "vl") -> dict[tuple[str, str], dict[str, Any]]:
    found = {}
    for api_version, kind in CHILD_KINDS:
        for obj in kube.list(api_version, kind, labels={"app.kubernetes.io/instance": name}):
            found[(kind, obj["metadata"]["name"])] = obj
    return found


def epd(kube: KubeView, name: str = "vl") -> dict[str, Any]:
    obj = kube.get(EPD_API, "EPDDeployment", name)
    assert obj is not None, f"EPDDeployment {name} is gone"
    return obj


def deployment(kube: KubeView, name: str) -> dict[str, Any]:
    obj = kube.get("apps/v1", "Deployment", name)
    assert obj is not None, f"Deployment {name} is gone"
    return obj


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_), {})


def events(kube: KubeView, name: str = "vl") -> list[tuple[str, str, str]]:
    return [(e["type"], e["reason"], e["message"]) for e in kube.events(kind="EPDDeployment", name=name)]


async def posted(kube: KubeView, type_: str, reason: str, text: str = "", name: str = "vl", timeout: float = 20) -> str:
    """Wait for an Event about the EPDDeployment (posted right after the change it reports)."""

    def find() -> str | None:
        return next((m for t, r, m in events(kube, name) if (t, r) == (type_, reason) and text in m), None)

    await wait_until(find, timeout, lambda: f"no {type_} {reason} event with {text!r}: {events(kube, name)}")
    return find() or ""


def full_passes(metrics: Metrics) -> float:
    return metric_value(metrics.exposition().decode(), "epd_operator_reconciles_total", kind="full")


def writes(metrics: Metrics) -> float:
    """Mutating requests the operator sent (Lease renewals included when leader election is on)."""
    return metric_value(metrics.exposition().decode(), "epd_operator_api_writes_total")


async def resyncs(metrics: Metrics, count: int = 3) -> None:
    """Wait until the operator has made `count` more full passes (timer-driven resyncs)."""
    target = full_passes(metrics) + count
    await wait_until(lambda: full_passes(metrics) >= target, 45, f"fewer than {count} resync passes")


async def create(kube: KubeView, doc: dict[str, Any]) -> dict[str, Any]:
    return dict(
        kube.ok("POST", f"/apis/{EPD_API}/namespaces/{kube.ns}/epddeployments", doc, content_type="application/json")
    )


async def patch_spec(kube: KubeView, spec: dict[str, Any], name: str = "vl") -> dict[str, Any]:
    return dict(kube.ok("PATCH", epd_path(kube, name), {"spec": spec}))


async def phase(kube: KubeView, expected: str, name: str = "vl", timeout: float = 30) -> None:
    await wait_until(
        lambda: epd(kube, name).get("status", {}).get("phase") == expected,
        timeout,
        lambda: f"phase never became {expected}: {epd(kube, name).get('status')}",
    )


async def observed(kube: KubeView, generation: int, name: str = "vl") -> None:
    """Wait until the operator has reconciled `generation` of the EPDDeployment (it writes status last)."""
    await wait_until(
        lambda: epd(kube, name).get("status", {}).get("observedGeneration") == generation,
        20,
        lambda: f"generation {generation} not reconciled: {epd(kube, name).get('status')}",
    )


async def deployed(kube: KubeView, *names: str) -> None:
    await wait_until(
        lambda: all(kube.get("apps/v1", "Deployment", n) for n in names), 20, f"{names} were not all created"
    )


def resource_versions(kube: KubeView, name: str = "vl") -> dict[tuple[str, str], str]:
    return {k: o["metadata"]["resourceVersion"] for k, o in children(kube, name).items()}
