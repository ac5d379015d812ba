"""Operator scale: the real `epd-operator` against a real kube-apiserver, N EPDDeployments at once.

    python -m bench.operator_scale [--deployments 1000] [--out bench/results/operator-scale.md]

A local kube-apiserver with its etcd (dev/cluster/local.py, no controllers) behind the
recording proxy (tests/support/faults.py), which counts every request the operator sends by verb and
resource, as RBAC names them. The operator is a subprocess (leader election off: a single replica, so
no Lease renewals among the writes) pinned to its own core; its RSS is read from /proc. The N custom
resources are POSTed concurrently, as `kubectl apply -f dir/` would. Measured:

- the creation wave: time until every one reports status for its generation, requests by verb and
  resource;
- full resyncs at rest (every EPDDeployment passed through once per resync, counted by the
  operator's reconcile metric): requests by verb and resource per resync and per EPDDeployment
  (target: no writes, no reads), seconds and CPU per resync;
- memory: RSS after start, at rest with N EPDDeployments and their children cached, and the peak.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import ssl
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml

from dev.ports import free_port

from .overhead import ROUTER_CORE
from .procs import commit, cpu_model, cpu_seconds, peak_rss_mib, start
from .report import Target, table

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "examples" / "epd-shared-storage.yaml"
RESULTS = Path(__file__).with_name("results") / "operator-scale.md"
NAMESPACE = "bench"
USER_AGENT = "epd-bench"
PLURAL_PATH = f"/apis/serving.epd.dev/v1alpha1/namespaces/{NAMESPACE}/epddeployments"
WRITES = ("create", "update", "patch", "delete")
PASS_SECONDS = "epd_operator_reconcile_duration_seconds_sum"
CREATE_CONCURRENCY = 64  # POSTs in flight: as kubectl's parallel apply, without 1,000 sockets at once


@dataclass(frozen=True)
class Plan:
    deployments: int = 1000
    resync_seconds: float = 30.0
    resyncs: int = 2  # full resyncs measured at rest
    status_timeout: float = 1200.0


FULL = Plan()
QUICK = Plan(deployments=50, resync_seconds=3.0)


@dataclass
class ScaleResult:
    plan: Plan
    seconds_to_all_status: float
    seconds_to_first_status: float
    wave: Counter[tuple[str, str]]
    resync: Counter[tuple[str, str]]  # over plan.resyncs full resyncs
    resync_seconds_each: float  # the N passes of one resync, timer wait excluded
    resync_cpu_s_each: float  # the operator's CPU over a resync period, timer wait included
    wave_cpu_s: float
    rss_start_mib: float
    rss_rest_mib: float
    peak_rss_mib: float
    cache_objects: int
    cache_mib: float

    def resync_count(self, verbs: tuple[str, ...]) -> int:
        return sum(n for (verb, _), n in self.resync.items() if verb in verbs)

    @property
    def resync_writes(self) -> int:
        return self.resync_count(WRITES)

    @property
    def resync_reads(self) -> int:
        return self.resync_count(("get", "list"))


def _sample(name: str) -> dict:
    obj = copy.deepcopy(yaml.safe_load(SAMPLE.read_text()))
    obj["metadata"] = {"name": name, "namespace": NAMESPACE}
    return obj


def _reported(obj: dict) -> bool:
    status = obj.get("status") or {}
    return bool(status.get("phase")) and status.get("observedGeneration") == obj["metadata"].get("generation")


def rss_mib(pid: int) -> float:
    """Current resident memory (VmRSS) of one process."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _measure(plan: Plan, log_dir: Path, progress) -> ScaleResult:
    from dev.cluster.local import LocalCluster
    from tests.support.cluster import epd_crd, install_crd
    from tests.support.faults import FaultProxy, api_verb
    from tests.support.operator_run import metric_value, operator_command

    def counted(since: int) -> Counter[tuple[str, str]]:
        # A server-side dry run (the operator's check before it writes) persists nothing: not a write.
        return Counter(
            (verb + (" (dry run)" if "dryRun=" in query else ""), resource)
            for method, query in proxy.queries[since:]
            for verb, resource in [api_verb(method, query)]
        )

    with LocalCluster(log_dir / "k8s", apiserver_only=True) as cluster, FaultProxy(cluster) as proxy:
        install_crd(cluster, epd_crd())
        cluster.request(
            "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        )
        # The operator goes through the recording proxy; the benchmark's own requests go around it.
        kubeconfig = log_dir / "bench-kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "bench",
                    "clusters": [{"name": "bench", "cluster": {"server": proxy.url}}],
                    "users": [{"name": "bench", "user": {"token": cluster.admin_token}}],
                    "contexts": [
                        {"name": "bench", "context": {"cluster": "bench", "user": "bench", "namespace": NAMESPACE}}
                    ],
                }
            )
        )
        metrics_port = free_port()
        op = start(
            "epd-operator-scale",
            [
                *operator_command(),
                "--namespace",
                NAMESPACE,
                "--no-leader-election",
                "--resync-seconds",
                str(plan.resync_seconds),
                "--bind-address",
                "127.0.0.1",
                "--liveness-port",
                str(free_port()),
                "--metrics-port",
                str(metrics_port),
            ],
            ROUTER_CORE,
            log_dir,
            env={"KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"},
            prioritise=False,
        )
        context = ssl.create_default_context(cafile=str(cluster.pki / "ca.crt"))
        headers = {"User-Agent": USER_AGENT, "Authorization": f"Bearer {cluster.admin_token}"}
        try:
            async with aiohttp.ClientSession(
                headers=headers, connector=aiohttp.TCPConnector(ssl=context, limit=CREATE_CONCURRENCY)
            ) as session:

                async def metric(name: str, **labels: str) -> float:
                    async with session.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
                        return metric_value(await r.text(), name, **labels)

                async def full_passes() -> float:
                    return await metric("epd_operator_reconciles_total", kind="full")

                async def writes_since(mark: int) -> int:
                    return sum(n for (verb, _), n in counted(mark).items() if verb in WRITES)

                await _until(lambda: _serves(session, metrics_port), 60, op, "the operator never served /metrics")
                await asyncio.sleep(2.0)  # its watches listed (nothing yet) and started
                rss_start = rss_mib(op.pid)

                mark = len(proxy.queries)
                cpu0 = cpu_seconds(op.pid)
                t0 = time.monotonic()
                names = [f"bench-{i:04d}" for i in range(plan.deployments)]

                async def post(name: str) -> int:
                    async with session.post(cluster.server + PLURAL_PATH, json=_sample(name)) as answer:
                        return answer.status

                statuses = await asyncio.gather(*(post(n) for n in names))
                bad = [s for s in statuses if s != 201]
                if bad:
                    raise RuntimeError(f"creating EPDDeployments failed: statuses {sorted(set(bad))}")
                progress(f"  {plan.deployments} EPDDeployments created in {time.monotonic() - t0:.1f}s")
                first = None
                deadline = t0 + plan.status_timeout
                last_report = t0
                while True:
                    objs = cluster.request("GET", PLURAL_PATH)["items"]
                    done = sum(1 for o in objs if _reported(o))
                    if done and first is None:
                        first = time.monotonic() - t0
                    if done == plan.deployments:
                        break
                    if time.monotonic() > deadline or not op.alive():
                        raise RuntimeError(
                            f"{done}/{plan.deployments} EPDDeployments reported status "
                            f"after {time.monotonic() - t0:.0f}s:\n{op.log_tail()}"
                        )
                    if time.monotonic() - last_report > 30:
                        last_report = time.monotonic()
                        progress(f"  {done}/{plan.deployments} report status after {last_report - t0:.0f}s")
                    await asyncio.sleep(1.0)
                all_status = time.monotonic() - t0
                wave = counted(mark)
                wave_cpu = cpu_seconds(op.pid) - cpu0
                progress(
                    f"  all reported status in {all_status:.1f}s, {wave.total() / plan.deployments:.1f} "
                    "API requests per CR"
                )

                # At rest: a whole resync (N full passes) that writes nothing. The creation wave's
                # last follow-ups (a status pass after a write) may still be queued before it.
                settle_deadline = time.monotonic() + 6 * plan.resync_seconds + plan.status_timeout / 4
                while True:
                    quiet_since, passes0 = len(proxy.queries), await full_passes()
                    while await full_passes() < passes0 + plan.deployments:
                        if time.monotonic() > settle_deadline or not op.alive():
                            raise RuntimeError(f"no quiet resync before the deadline:\n{op.log_tail()}")
                        await asyncio.sleep(0.5)
                    if await writes_since(quiet_since) == 0:
                        break
                progress("  at rest; measuring full resyncs")

                rss_rest = rss_mib(op.pid)
                # N full passes per resync. Their time is the operator's own sum of pass durations: at
                # rest a pass never waits on the API, so passes run back to back on the event loop.
                mark, cpu_started = len(proxy.queries), cpu_seconds(op.pid)
                passes0, seconds0 = await full_passes(), await metric(PASS_SECONDS, kind="full")
                while await full_passes() < passes0 + plan.resyncs * plan.deployments:
                    if not op.alive():
                        raise RuntimeError(f"the operator died:\n{op.log_tail()}")
                    await asyncio.sleep(0.2)
                busy = await metric(PASS_SECONDS, kind="full") - seconds0
                cpu_busy = cpu_seconds(op.pid) - cpu_started
                resync = counted(mark)
                rss_rest = max(rss_rest, rss_mib(op.pid))
                cache_objects, cache_bytes = (
                    await metric("epd_operator_cache_objects"),
                    await metric("epd_operator_cache_bytes"),
                )
                peak = peak_rss_mib(op.pid)
        finally:
            op.stop()
    return ScaleResult(
        plan,
        seconds_to_all_status=all_status,
        seconds_to_first_status=first or all_status,
        wave=wave,
        resync=resync,
        resync_seconds_each=busy / plan.resyncs,
        resync_cpu_s_each=cpu_busy / plan.resyncs,
        wave_cpu_s=wave_cpu,
        rss_start_mib=rss_start,
        rss_rest_mib=rss_rest,
        peak_rss_mib=peak,
        cache_objects=int(cache_objects),
        cache_mib=cache_bytes / 2**20,
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
    p = result.plan
    what = f"({p.deployments} CRs at rest, {p.resyncs} full resyncs)"
    return [
        Target(
            "operator scale",
            f"API writes per resync {what}",
            "0",
            f"{result.resync_writes / p.resyncs:g}",
            result.resync_writes == 0,
        ),
        Target(
            "operator scale",
            f"API reads (GET/LIST) per resync {what}",
            "O(1), ideally 0",
            f"{result.resync_reads / p.resyncs:g}",
            result.resync_reads == 0,
        ),
    ]


def _by_verb(counts: Counter[tuple[str, str]], per: float) -> str:
    rows = [
        [verb, resource, n, n / per] for (verb, resource), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ]
    return table(["verb", "resource", "requests", "per EPDDeployment"], rows) if rows else "(none)"


def markdown(r: ScaleResult) -> str:
    from dev.cluster.local import NEWEST as K8S

    p = r.plan
    n = p.deployments
    intro = (
        f"The real `epd-operator` (one process pinned to core {ROUTER_CORE}, normal priority, leader election off, "
        f"`--resync-seconds {p.resync_seconds:g}`) against a real kube-apiserver {K8S} with its etcd (no "
        "controllers: children never become ready, and the status reached is the one for unready children). "
        f"{n} EPDDeployments (examples/epd-shared-storage.yaml, renamed; {(r.cache_objects - n) / n:g} children "
        "each) POSTed concurrently. Requests are the operator's own, counted by verb and resource by "
        "a recording proxy in front of the API server (tests/support/faults.py; the benchmark's own requests go "
        "around it). The reconciler reads the EPDDeployments, their children and pods from a cache fed by its "
        "label-selected watches (operator/epd_operator/controller/cache.py), so a resync at rest should send "
        "nothing at all; watches are long-lived GETs and counted as `watch`."
    )
    rows = [
        ["EPDDeployments", n],
        ["seconds until the first reports status", r.seconds_to_first_status],
        ["seconds until all report status (observedGeneration = generation)", r.seconds_to_all_status],
        ["operator API requests per EPDDeployment, creation wave", r.wave.total() / n],
        [
            "operator API writes per EPDDeployment, creation wave (server-side dry runs not counted)",
            sum(c for (v, _), c in r.wave.items() if v in WRITES) / n,
        ],
        ["operator CPU seconds, creation wave", r.wave_cpu_s],
        [f"API writes per full resync at rest (mean of {p.resyncs}; target 0)", r.resync_writes / p.resyncs],
        ["API reads (GET + LIST) per full resync at rest", r.resync_reads / p.resyncs],
        ["API requests of any verb per full resync at rest", r.resync.total() / p.resyncs],
        [
            f"seconds of reconcile passes per full resync ({n} passes, operator's duration histogram)",
            r.resync_seconds_each,
        ],
        ["operator CPU seconds per resync period (passes, timer wait and watches)", r.resync_cpu_s_each],
        ["operator RSS MiB after start (nothing cached)", r.rss_start_mib],
        [f"operator RSS MiB at rest ({n} EPDDeployments and their children cached)", r.rss_rest_mib],
        ["operator RSS KiB per EPDDeployment at rest (above the start)", (r.rss_rest_mib - r.rss_start_mib) * 1024 / n],
        ["operator peak RSS MiB (VmHWM)", r.peak_rss_mib],
        ["objects in the reconciler's cache at rest (metric epd_operator_cache_objects)", r.cache_objects],
        ["their size in MiB (compact JSON, metric epd_operator_cache_bytes)", r.cache_mib],
    ]
    return "\n\n".join(
        [
            intro,
            table(["measure", "value"], rows),
            "### Requests during the creation wave",
            _by_verb(r.wave, n),
            f"### Requests during {p.resyncs} full resyncs at rest",
            _by_verb(r.resync, n * p.resyncs),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.operator_scale", description=__doc__.splitlines()[0])
    parser.add_argument("--deployments", type=int, default=FULL.deployments, help="EPDDeployments (default 1000)")
    parser.add_argument(
        "--resync-seconds", type=float, default=FULL.resync_seconds, help="the operator's --resync-seconds (default 30)"
    )
    parser.add_argument("--resyncs", type=int, default=FULL.resyncs, help="full resyncs measured at rest (default 2)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"results file (default {RESULTS.relative_to(REPO)})")
    args = parser.parse_args(argv)
    plan = Plan(deployments=args.deployments, resync_seconds=args.resync_seconds, resyncs=args.resyncs)
    log_dir = Path(os.environ.get("EPD_BENCH_LOGS", "/tmp")) / f"epd-operator-scale-{os.getpid()}"
    log_dir.mkdir(parents=True, exist_ok=True)
    started, load = time.monotonic(), os.getloadavg()[0]
    result = run(plan, log_dir, progress=lambda m: print(m, file=sys.stderr, flush=True))
    from datetime import UTC, datetime

    header = (
        "# Operator scale\n\n"
        f"Written by `python -m bench.operator_scale --deployments {plan.deployments} --resync-seconds "
        f"{plan.resync_seconds:g} --resyncs {plan.resyncs}` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC in "
        f"{(time.monotonic() - started) / 60:.1f} min. Machine: {len(os.sched_getaffinity(0))} usable cores "
        f"({cpu_model()}), commit `{commit()}`, load average (1 min) {load:.2f} at the start (other work shared "
        "the machine: times are upper bounds; request counts and memory do not depend on it).\n\n"
        "## Targets\n\n"
        + table(
            ["target", "goal", "measured", "verdict"],
            [[t.name, t.goal, t.measured, f"**{t.verdict}**"] for t in targets(result)],
        )
    )
    args.out.write_text(header + "\n\n## Measured\n\n" + markdown(result) + "\n")
    print(f"wrote {args.out} (logs in {log_dir})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
