"""Run the real `epd-operator` for tests: as a subprocess (the console script) or in-process.

    async with OperatorProcess(kubeconfig, "--namespace", "default") as op:
        await op.wait_for_role("leader")
        ...                                   # op.metric("epd_operator_reconciles_total", kind="full")

The subprocess listens on free loopback ports, and is stopped with SIGTERM (then SIGKILL after a
timeout) on exit; its output is kept for assertion messages. Everything is async because the API
emulator usually runs in the test's own event loop, which a blocking wait would freeze.
"""
from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import kopf
from prometheus_client.parser import text_string_to_metric_families

from epd_operator.controller.main import Options, run
from epd_operator.controller.metrics import Metrics
from tests.support.render_examples import SHARED_STORAGE, example_document

if TYPE_CHECKING:
    from tests.support.apiserver import StrictKubernetesEmulator


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def operator_command() -> list[str]:
    """The installed console script next to this interpreter, else the module."""
    script = Path(sys.executable).parent / "epd-operator"
    return [str(script)] if script.exists() else [sys.executable, "-m", "epd_operator.controller.main"]


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0 when there are none)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


class OperatorProcess:
    def __init__(self, kubeconfig: str | os.PathLike[str], *args: str, env: dict[str, str] | None = None,
                 lease_duration: float = 2.0, stop_timeout: float = 15.0):
        self.liveness_port, self.metrics_port = free_port(), free_port()
        self.args = [*operator_command(), *args, "--bind-address", "127.0.0.1",
                     "--liveness-port", str(self.liveness_port), "--metrics-port", str(self.metrics_port)]
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
            *self.args, env=self.env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL)
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
            except asyncio.TimeoutError:
                self.process.kill()
                await self.process.wait()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        return self.process.returncode

    async def _get(self, port: int, path: str) -> tuple[int, str]:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}{path}", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                return resp.status, await resp.text()

    async def healthz(self) -> dict[str, Any] | None:
        """The /healthz answer, or None while the process does not serve yet."""
        try:
            status, text = await self._get(self.liveness_port, "/healthz")
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
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
        await wait_until(reached, timeout, lambda: f"epd-operator never became {role}:\n{self.output}",
                         alive=lambda: self.returncode is None)


async def wait_until(condition: Any, timeout: float = 15.0, message: Any = "condition not met",
                     alive: Any = lambda: True, interval: float = 0.05) -> None:
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
async def operator_in_process(server_url: str, *args: str, metrics: Metrics | None = None) -> AsyncIterator[Metrics]:
    """The operator's `run()` in this process (kopf in-process), stopped on exit.

    It gets a thread and an event loop of its own: when kopf stops it cancels every task created
    in its loop after it started, which in the test's loop would include the test's own tasks."""
    from epd_operator.controller.main import parse_args

    options: Options = parse_args([*args, "--bind-address", "127.0.0.1", "--liveness-port", str(free_port()),
                                   "--metrics-port", str(free_port())])
    metrics = metrics or Metrics()
    started: asyncio.Future[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = asyncio.get_running_loop().create_future()
    caller = asyncio.get_running_loop()

    async def operator_main() -> int:
        stop = asyncio.Event()
        caller.call_soon_threadsafe(started.set_result, (asyncio.get_running_loop(), stop))
        return await run(options, stop=stop, metrics=metrics,
                         credentials=lambda: kopf.ConnectionInfo(server=server_url, insecure=True))

    thread = asyncio.ensure_future(asyncio.to_thread(asyncio.run, operator_main()))
    loop, stop = await asyncio.wait_for(started, 10)
    try:
        yield metrics
    finally:
        loop.call_soon_threadsafe(stop.set)
        assert await asyncio.wait_for(thread, 30) == 0


# ----------------------------------------------------------------------------- the cluster side
# What a real cluster's controllers would do around the operator (no kubelet or deployment
# controller runs against the emulator), through its HTTP API.

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "serving.epd.dev_epddeployments.yaml"
EPD_API = "serving.epd.dev/v1alpha1"
NS = "default"


def epd_crd() -> dict[str, Any]:
    import yaml

    return yaml.safe_load(CRD_FILE.read_text(encoding="utf-8"))


def relaxed_epd_crd() -> dict[str, Any]:
    """The CRD with its spec schema switched off: a cluster whose CRD is older than the operator,
    the one way a spec the operator refuses can reach it."""
    crd = epd_crd()
    version = crd["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    schema["properties"]["spec"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    schema.pop("x-kubernetes-validations", None)
    return crd


async def api_request(server_url: str, method: str, path: str, body: Any = None, *,
                      content_type: str = "application/merge-patch+json", manager: str = "test") -> tuple[int, Any]:
    """One request to the API as client `manager` (the emulator names field managers by user agent)."""
    headers = {"Content-Type": content_type, "User-Agent": f"{manager}/v0"}
    async with aiohttp.ClientSession() as session:
        async with session.request(method, server_url + path, data=None if body is None else json.dumps(body),
                                   headers=headers) as resp:
            text = await resp.text()
            return resp.status, (json.loads(text) if text else None)


def deployment_path(namespace: str, name: str, sub: str = "") -> str:
    return f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}" + (f"/{sub}" if sub else "")


async def set_deployment_ready(server_url: str, namespace: str, name: str, ready: int | None = None,
                               *, generation: int | None = None, **extra: Any) -> None:
    """What the deployment controller and kubelets report once `ready` pods (default: all) run
    the latest template: observedGeneration, replicas, updated/ready/available counts."""
    status, dep = await api_request(server_url, "GET", deployment_path(namespace, name))
    assert status == 200, dep
    desired = dep["spec"].get("replicas", 1)
    ready = desired if ready is None else ready
    st = {"observedGeneration": generation or dep["metadata"]["generation"], "replicas": desired,
          "updatedReplicas": desired, "readyReplicas": ready, "availableReplicas": ready, **extra}
    status, body = await api_request(server_url, "PATCH", deployment_path(namespace, name, "status"), {"status": st},
                                     manager="kube-controller-manager")
    assert status == 200, body


async def scale_deployment(server_url: str, namespace: str, name: str, replicas: int,
                           manager: str = "kube-controller-manager") -> None:
    """Scale through the /scale subresource, as the HPA controller (or `kubectl scale`) does."""
    status, body = await api_request(server_url, "PATCH", deployment_path(namespace, name, "scale"),
                                     {"spec": {"replicas": replicas}}, manager=manager)
    assert status == 200, body


# ----------------------------------------------------------------------------- EPDDeployments in tests

CHILD_KINDS = [("v1", "ConfigMap"), ("v1", "Service"), ("v1", "ServiceAccount"), ("apps/v1", "Deployment"),
               ("autoscaling/v2", "HorizontalPodAutoscaler"), ("policy/v1", "PodDisruptionBudget"),
               ("rbac.authorization.k8s.io/v1", "Role"), ("rbac.authorization.k8s.io/v1", "RoleBinding")]


def epd_doc(example: str = SHARED_STORAGE, name: str = "vl", **spec_changes: Any) -> dict[str, Any]:
    """An example EPDDeployment in the test namespace; `spec_changes` set top-level spec fields."""
    doc = copy.deepcopy(example_document(example))
    doc["metadata"] = {"name": name, "namespace": NS}
    for key, value in spec_changes.items():
        if value is None:
            doc["spec"].pop(key, None)
        else:
            doc["spec"][key] = value
    return doc


def children(apiserver: StrictKubernetesEmulator, name: str = "vl") -> dict[tuple[str, str], dict[str, Any]]:
    found = {}
    for api_version, kind in CHILD_KINDS:
        for obj in apiserver.list_objects(api_version, kind, NS):
            if obj["metadata"].get("labels", {}).get("app.kubernetes.io/instance") == name:
                found[(kind, obj["metadata"]["name"])] = obj
    return found


def epd(apiserver: StrictKubernetesEmulator, name: str = "vl") -> dict[str, Any]:
    obj = apiserver.get_object(EPD_API, "EPDDeployment", name, NS)
    assert obj is not None
    return obj


def deployment(apiserver: StrictKubernetesEmulator, name: str) -> dict[str, Any] | None:
    return apiserver.get_object("apps/v1", "Deployment", name, NS)


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_), {})


def events(apiserver: StrictKubernetesEmulator, name: str = "vl") -> list[tuple[str, str, str]]:
    return [(e["type"], e["reason"], e["message"]) for e in apiserver.list_objects("v1", "Event", NS)
            if e["involvedObject"]["name"] == name and e["involvedObject"]["kind"] == "EPDDeployment"]


async def posted(apiserver: StrictKubernetesEmulator, type_: str, reason: str, text: str = "", name: str = "vl") -> str:
    """Wait for an Event about the EPDDeployment (posted right after the change it reports)."""
    def find() -> str | None:
        return next((m for t, r, m in events(apiserver, name) if (t, r) == (type_, reason) and text in m), None)
    await wait_until(find, 10, lambda: f"no {type_} {reason} event with {text!r}: {events(apiserver, name)}")
    return find() or ""


def full_passes(metrics: Metrics) -> float:
    return metric_value(metrics.exposition().decode(), "epd_operator_reconciles_total", kind="full")


async def resyncs(metrics: Metrics, count: int = 3) -> None:
    """Wait until the operator has made `count` more full passes (timer-driven resyncs)."""
    target = full_passes(metrics) + count
    await wait_until(lambda: full_passes(metrics) >= target, 15, f"fewer than {count} resync passes")


async def create(url: str, doc: dict[str, Any]) -> dict[str, Any]:
    status, body = await api_request(url, "POST", f"/apis/{EPD_API}/namespaces/{NS}/epddeployments", doc,
                                     content_type="application/json", manager="kubectl")
    assert status == 201, body
    return body


async def patch_spec(url: str, spec: dict[str, Any], name: str = "vl") -> dict[str, Any]:
    status, body = await api_request(url, "PATCH", f"/apis/{EPD_API}/namespaces/{NS}/epddeployments/{name}",
                                     {"spec": spec}, manager="kubectl")
    assert status == 200, body
    return body


async def phase(apiserver: StrictKubernetesEmulator, expected: str, name: str = "vl") -> None:
    await wait_until(lambda: epd(apiserver, name).get("status", {}).get("phase") == expected, 10,
                     lambda: f"phase never became {expected}: {epd(apiserver, name).get('status')}")


async def observed(apiserver: StrictKubernetesEmulator, generation: int, name: str = "vl") -> None:
    """Wait until the operator has reconciled `generation` of the EPDDeployment (it writes status last)."""
    await wait_until(lambda: epd(apiserver, name).get("status", {}).get("observedGeneration") == generation, 10,
                     lambda: f"generation {generation} not reconciled: {epd(apiserver, name).get('status')}")


async def deployed(apiserver: StrictKubernetesEmulator, *names: str) -> None:
    await wait_until(lambda: all(deployment(apiserver, n) for n in names), 10, f"{names} were not all created")


