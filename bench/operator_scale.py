"""Operator scale: the real `epd-operator` against a real kube-apiserver, N EPDDeployments at once.

The emulator (tests/support/apiserver.py) runs in this process and records every request
it serves; the operator is a subprocess pinned to its own core, leader election off (a
single replica, so no Lease renewals in the write count). The N custom resources are
POSTed concurrently, as `kubectl apply -f dir/` would. Measured: time until every one
reports status for its generation, the operator's API requests (and writes) per CR during
that wave, its writes over three idle resync periods (target 0), CPU and peak RSS.
"""

from __future__ import annotations

import asyncio
import copy
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml

from .overhead import ROUTER_CORE
from .procs import cpu_seconds, free_port, peak_rss_mib, start
from .report import Target, table

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "examples" / "epd-shared-storage.yaml"
NAMESPACE = "bench"
USER_AGENT = "epd-bench"
PLURAL_PATH = f"/apis/serving.epd.dev/v1alpha1/namespaces/{NAMESPACE}/epddeployments"


@dataclass(frozen=True)
class Plan:
    deployments: int = 200
    resync_seconds: float = 5.0
    idle_resyncs: int = 3
    status_timeout: float = 300.0


FULL = Plan()
QUICK = Plan(deployments=50, resync_seconds=3.0)


@dataclass
class ScaleResult:
    plan: Plan
    seconds_to_all_status: float
    seconds_to_first_status: float
    requests: int
    writes: int
    idle_writes: list[str]
    idle_requests: int
    idle_reconciles: float
    operator_cpu_s: float
    peak_rss_mib: float

    @property
    def requests_per_cr(self) -> float:
        return self.requests / self.plan.deployments

    @property
    def writes_per_cr(self) -> float:
        return self.writes / self.plan.deployments


def _sample(name: str) -> dict:
    obj = copy.deepcopy(yaml.safe_load(SAMPLE.read_text()))
    obj["metadata"] = {"name": name, "namespace": NAMESPACE}
    return obj


def _reported(obj: dict) -> bool:
    status = obj.get("status") or {}
    return bool(status.get("phase")) and status.get("observedGeneration") == obj["metadata"].get("generation")


async def _measure(plan: Plan, log_dir: Path, progress) -> ScaleResult:
    import ssl

    from epd_operator.local.cluster import LocalCluster
    from tests.support.cluster import epd_crd, install_crd
    from tests.support.faults import FaultProxy
    from tests.support.operator_run import metric_value, operator_command

    with LocalCluster(log_dir / "k8s", apiserver_only=True) as cluster, FaultProxy(cluster) as proxy:
        install_crd(cluster, epd_crd())
        cluster.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                       "metadata": {"name": NAMESPACE}})
        # The operator goes through the recording proxy; the benchmark's own requests go around it.
        kubeconfig = log_dir / "bench-kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "bench",
            "clusters": [{"name": "bench", "cluster": {"server": proxy.url}}],
            "users": [{"name": "bench", "user": {"token": cluster.admin_token}}],
            "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench", "namespace": NAMESPACE}}]}))
        metrics_port = free_port()
        op = start(
            "epd-operator-scale",
            [*operator_command(), "--namespace", NAMESPACE, "--no-leader-election",
             "--resync-seconds", str(plan.resync_seconds), "--bind-address", "127.0.0.1",
             "--liveness-port", str(free_port()), "--metrics-port", str(metrics_port)],
            ROUTER_CORE, log_dir, env={"KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"},
        )
        context = ssl.create_default_context(cafile=str(cluster.pki / "ca.crt"))
        headers = {"User-Agent": USER_AGENT, "Authorization": f"Bearer {cluster.admin_token}"}
        try:
            async with aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(ssl=context)) as session:
                async def metric(name: str, **labels: str) -> float:
                    async with session.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
                        return metric_value(await r.text(), name, **labels)

                await _until(lambda: _serves(session, metrics_port), 60, op, "the operator never served /metrics")
                await asyncio.sleep(1.0)  # let its watches start before the wave

                def operator_requests(since: int) -> list[tuple[str, str]]:
                    return proxy.requests[since:]

                mark = len(proxy.requests)
                cpu0 = cpu_seconds(op.pid)
                t0 = time.monotonic()
                names = [f"bench-{i:03d}" for i in range(plan.deployments)]
                answers = await asyncio.gather(*(
                    session.post(cluster.server + PLURAL_PATH, json=_sample(n)) for n in names
                ))
                bad = [a.status for a in answers if a.status != 201]
                for a in answers:
                    a.release()
                if bad:
                    raise RuntimeError(f"creating EPDDeployments failed: statuses {sorted(set(bad))}")
                first = None
                deadline = t0 + plan.status_timeout
                while True:
                    objs = cluster.request("GET", PLURAL_PATH)["items"]
                    done = sum(1 for o in objs if _reported(o))
                    if done and first is None:
                        first = time.monotonic() - t0
                    if done == plan.deployments:
                        break
                    if time.monotonic() > deadline or not op.alive():
                        raise RuntimeError(f"{done}/{plan.deployments} EPDDeployments reported status "
                                           f"after {time.monotonic() - t0:.0f}s:\n{op.log_tail()}")
                    await asyncio.sleep(0.2)
                all_status = time.monotonic() - t0
                wave = operator_requests(mark)
                progress(f"  {plan.deployments} EPDDeployments reported status in {all_status:.2f}s, "
                         f"{len(wave) / plan.deployments:.1f} API requests per CR")

                # Idle: let the wave's follow-ups drain (no operator write for one resync period), then watch.
                quiet_since = len(proxy.requests)
                settle_deadline = time.monotonic() + 6 * plan.resync_seconds
                while time.monotonic() < settle_deadline:
                    await asyncio.sleep(plan.resync_seconds)
                    if not any(m != "GET" for m, _ in operator_requests(quiet_since)):
                        break
                    quiet_since = len(proxy.requests)
                idle_mark = len(proxy.requests)
                reconciles0 = await metric("epd_operator_reconciles_total")
                await asyncio.sleep(plan.idle_resyncs * plan.resync_seconds + 0.5)
                idle = operator_requests(idle_mark)
                reconciles = await metric("epd_operator_reconciles_total") - reconciles0
                cpu = cpu_seconds(op.pid) - cpu0
                rss = peak_rss_mib(op.pid)
        finally:
            op.stop()
    return ScaleResult(
        plan, seconds_to_all_status=all_status, seconds_to_first_status=first or all_status,
        requests=len(wave), writes=sum(1 for m, _ in wave if m != "GET"),
        idle_writes=[f"{m} {p}" for m, p in idle if m != "GET"], idle_requests=len(idle),
        idle_reconciles=reconciles, operator_cpu_s=cpu, peak_rss_mib=rss,
    )


async def _serves(session: aiohttp.ClientSession, port: int) -> bool:
    try:
        async with session.get(f"http://127.0.0.1:{port}/metrics") as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


async def _until(check, timeout: float, proc, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline or not proc.alive():
            raise RuntimeError(f"{message}:\n{proc.log_tail()}")
        await asyncio.sleep(0.1)


def run(plan: Plan, log_dir: Path, progress=print) -> ScaleResult:
    return asyncio.run(_measure(plan, log_dir, progress))


def targets(result: ScaleResult) -> list[Target]:
    n = len(result.idle_writes)
    return [Target(
        "operator scale", f"API writes during {result.plan.idle_resyncs} idle resyncs ({result.plan.deployments} CRs)",
        "0", str(n), n == 0,
    )]


def markdown(r: ScaleResult) -> str:
    from epd_operator.local.cluster import NEWEST as K8S

    p = r.plan
    intro = (
        f"The real `epd-operator` (one process pinned to core {ROUTER_CORE}, leader election off, "
        f"`--resync-seconds {p.resync_seconds:g}`) against a real kube-apiserver {K8S} with its etcd (no "
        f"controllers: children never become ready, and the status reached is the one for unready children). "
        f"{p.deployments} EPDDeployments (examples/epd-shared-storage.yaml, renamed) POSTed concurrently. "
        "Requests are the operator's own, counted by a recording proxy in front of the API server "
        "(tests/support/faults.py; the benchmark's own requests go around it)."
    )
    rows = [
        ["EPDDeployments created at once", p.deployments],
        ["seconds until the first reports status", r.seconds_to_first_status],
        ["seconds until all report status (observedGeneration = generation)", r.seconds_to_all_status],
        ["operator API requests per CR (creation wave)", r.requests_per_cr],
        ["operator API writes per CR (creation wave)", r.writes_per_cr],
        [f"operator API requests during {p.idle_resyncs} idle resyncs", r.idle_requests],
        ["reconcile passes during the idle window (metric)", r.idle_reconciles],
        [f"operator API writes during {p.idle_resyncs} idle resyncs (target 0)", len(r.idle_writes)],
        ["operator CPU seconds (wave + idle)", r.operator_cpu_s],
        ["operator peak RSS MiB", r.peak_rss_mib],
    ]
    parts = [intro, table(["measure", "value"], rows)]
    if r.idle_writes:
        parts.append("Idle writes seen:\n\n" + "\n".join(f"- `{w}`" for w in r.idle_writes[:20]))
    return "\n\n".join(parts)
