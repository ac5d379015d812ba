"""`epd-operator`: the EPDDeployment operator process.

    epd-operator --namespace inference            # watch one namespace (repeatable)
    epd-operator --all-namespaces                 # watch the whole cluster

It serves liveness on `--liveness-port` (`/healthz`) and Prometheus metrics on `--metrics-port`
(`/metrics`) from the start, waits for the leader Lease when leader election is on (the default:
two replicas never both act), then runs kopf's watches and the reconciler until SIGTERM. A leader
that loses its Lease (another replica took it, or the API server did not answer before its renew
deadline) stops writing at once and stands by in the same process, its watches kept: when the Lease
is free again, or still its own once the API server answers, it leads again without a restart.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import threading
import uuid
from collections.abc import Awaitable, Sequence
from typing import Any

import kopf
from aiohttp import web

from .. import __version__
from ..api.router import DEFAULT_ROUTER_IMAGE
from ..kube import CredentialsError, CredentialSource, Kube, closing_connections, load_credentials
from .handlers import build_registry, build_settings
from .leader import LeaseElector
from .metrics import CONTENT_TYPE, Metrics
from .reconciler import RESYNC_SECONDS, WORKERS, Reconciler
from .served_kinds import POLL_SECONDS, first_served, missing

log = logging.getLogger("epd_operator")


@dataclasses.dataclass
class Options:
    namespaces: list[str]
    all_namespaces: bool
    liveness_port: int = 8080
    metrics_port: int = 9090
    bind_address: str = "0.0.0.0"
    resync_seconds: float = RESYNC_SECONDS
    workers: int = WORKERS
    leader_election: bool = True
    leader_election_namespace: str | None = None
    leader_election_id: str = "epd-operator"
    lease_duration: float = 15.0
    identity: str = ""
    router_image: str = DEFAULT_ROUTER_IMAGE
    keda_prometheus_address: str | None = None
    optional_kinds_poll_seconds: float = POLL_SECONDS
    verbose: bool = False


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="epd-operator",
        description="Kubernetes operator for EPDDeployments (vLLM Encoder/Prefill/Decode disaggregated serving).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument(
        "-n",
        "--namespace",
        dest="namespaces",
        action="append",
        default=[],
        metavar="NS",
        help="watch EPDDeployments in this namespace (repeatable)",
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch EPDDeployments in every namespace")
    parser.add_argument("--liveness-port", type=int, default=8080, help="port of /healthz (default 8080)")
    parser.add_argument("--metrics-port", type=int, default=9090, help="port of /metrics (default 9090)")
    parser.add_argument("--bind-address", default="0.0.0.0", help="address of the probe and metrics servers")
    parser.add_argument(
        "--resync-seconds",
        type=float,
        default=RESYNC_SECONDS,
        help=f"re-check every EPDDeployment's children this often; drift is repaired (default {RESYNC_SECONDS:g})",
    )
    parser.add_argument(
        "--workers", type=int, default=WORKERS, help=f"EPDDeployments reconciled concurrently (default {WORKERS})"
    )
    parser.add_argument(
        "--no-leader-election",
        dest="leader_election",
        action="store_false",
        help="act without holding the Lease (only for a single replica)",
    )
    parser.add_argument(
        "--leader-election-namespace",
        help="namespace of the Lease (default: the pod's namespace, else the kubeconfig context's, else 'default')",
    )
    parser.add_argument("--leader-election-id", default="epd-operator", help="name of the Lease (default epd-operator)")
    parser.add_argument(
        "--lease-duration",
        type=float,
        default=15.0,
        help="seconds a standby waits on a silent leader before taking over (default 15)",
    )
    parser.add_argument(
        "--identity",
        default="",
        help="this replica's name in the Lease (default: POD_NAME or host, plus a random suffix)",
    )
    parser.add_argument(
        "--router-image",
        default=os.environ.get("EPD_ROUTER_IMAGE") or DEFAULT_ROUTER_IMAGE,
        help="image of the router and cache-janitor pods when a spec names none "
        f"(default: $EPD_ROUTER_IMAGE, else {DEFAULT_ROUTER_IMAGE}); the chart passes the operator's own image",
    )
    parser.add_argument(
        "--keda-prometheus-address",
        default=os.environ.get("EPD_KEDA_PROMETHEUS_ADDRESS") or None,
        metavar="URL",
        help="the Prometheus a KEDA-scaled tier's load trigger queries when its spec names none "
        "(autoscaling.keda.prometheusAddress; default: $EPD_KEDA_PROMETHEUS_ADDRESS); the chart passes "
        "keda.prometheusAddress",
    )
    parser.add_argument(
        "--optional-kinds-poll-seconds",
        type=float,
        default=POLL_SECONDS,
        help="how often to ask whether an optional kind missing at the start (LeaderWorkerSet, ScaledObject, "
        f"HTTPRoute) is now served; once one is, the operator stops to be restarted watching it (default {POLL_SECONDS:g})",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    args = parser.parse_args(argv)
    if any(not ns.strip() for ns in args.namespaces):
        parser.error("--namespace needs a non-empty name")
    for flag, value in (
        ("--resync-seconds", args.resync_seconds),
        ("--lease-duration", args.lease_duration),
        ("--workers", args.workers),
        ("--optional-kinds-poll-seconds", args.optional_kinds_poll_seconds),
    ):
        if value <= 0:
            parser.error(f"{flag} must be positive, got {value}")
    return Options(**vars(args))


def default_identity() -> str:
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


async def lease_namespace(options: Options, kube: Kube) -> str:
    if options.leader_election_namespace:
        return options.leader_election_namespace
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    # In a pod: its service account's namespace; else the kubeconfig context's.
    return (await kube.login()).default_namespace or "default"


class Health:
    """What /healthz reports: the process serves, and a leader's reconciler is still running."""

    def __init__(self, identity: str):
        self.identity = identity
        self.role = "candidate"
        self.reconciler_task: asyncio.Task[None] | None = None

    def problems(self) -> list[str]:
        task = self.reconciler_task
        if task is not None and task.done():
            return ["the reconciler stopped"]
        return []

    async def healthz(self, _: web.Request) -> web.Response:
        problems = self.problems()
        body = {
            "status": "fail" if problems else "ok",
            "role": self.role,
            "identity": self.identity,
            "problems": problems,
        }
        return web.json_response(body, status=503 if problems else 200, dumps=json.dumps)


async def serve_endpoints(options: Options, health: Health, metrics: Metrics) -> web.AppRunner:
    async def metrics_handler(_: web.Request) -> web.Response:
        return web.Response(body=metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/healthz", health.healthz)
    app.router.add_get("/metrics", metrics_handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    # One app, two ports: probes and scrapes can be firewalled and named apart in the chart.
    for port in {options.liveness_port, options.metrics_port}:
        await web.TCPSite(runner, options.bind_address, port).start()
    return runner


async def run(
    options: Options,
    *,
    stop: asyncio.Event | None = None,
    credentials: CredentialSource = load_credentials,
    metrics: Metrics | None = None,
) -> int:
    """Run until `stop` is set (or kopf sees SIGTERM/SIGINT); returns the process exit status.
    In-process callers (tests) pass their own credentials and metrics, and give it an event loop of its
    own: kopf cancels every task created in its loop after it started, and every connection made on the
    loop while it runs is closed when it returns (kube/connections.py)."""
    async with closing_connections():
        return await _run(options, stop or asyncio.Event(), credentials, metrics or Metrics())


async def _run(options: Options, stop: asyncio.Event, credentials: CredentialSource, metrics: Metrics) -> int:
    identity = options.identity or default_identity()
    health = Health(identity)
    kube = Kube(credentials, on_write=metrics.count_write)
    runner = await serve_endpoints(options, health, metrics)
    elector: LeaseElector | None = None
    try:
        await kube.login()  # no credentials: say so now, not from inside a retry loop
        if options.leader_election:
            elector = LeaseElector(
                kube, await lease_namespace(options, kube), options.leader_election_id, identity, options.lease_duration
            )
            health.role = "standby"
            if not await _until_stopped(elector.acquire(), stop):
                return 0
        health.role = "leader"
        metrics.leader.set(1)
        return await _act(options, kube, metrics, health, identity, elector, stop)
    finally:
        metrics.leader.set(0)
        if elector is not None:
            await elector.release()
        await kube.close()
        await runner.cleanup()


async def _until_stopped(work: Awaitable[object], stop: asyncio.Event) -> bool:
    """Run `work` unless `stop` comes first; True when the work finished."""
    task = asyncio.ensure_future(work)
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    for pending in (task, stopper):
        if pending not in done:
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pending
    if task in done:
        task.result()
        return True
    return False


async def _act(
    options: Options,
    kube: Kube,
    metrics: Metrics,
    health: Health,
    identity: str,
    elector: LeaseElector | None,
    stop: asyncio.Event,
) -> int:
    reconciler = Reconciler(
        kube,
        metrics,
        identity=identity,
        resync_seconds=options.resync_seconds,
        workers=options.workers,
        router_image=options.router_image,
        prometheus_address=options.keda_prometheus_address,
    )
    # What kopf will not watch: an optional kind the API server does not serve yet (served_kinds.py).
    unserved = await missing(kube)
    appearing = asyncio.create_task(
        first_served(kube, unserved, options.optional_kinds_poll_seconds), name="optional kinds"
    )
    kopf_stop, kopf_ready = asyncio.Event(), asyncio.Event()
    reconciling = asyncio.create_task(reconciler.run(), name="reconciler")
    health.reconciler_task = reconciling
    watching = asyncio.create_task(
        kopf.operator(
            registry=build_registry(reconciler, kube),
            settings=build_settings(),
            standalone=True,
            clusterwide=options.all_namespaces,
            namespaces=options.namespaces,
            stop_flag=kopf_stop,
            ready_flag=kopf_ready,
        ),
        name="kopf",
    )
    stopping = asyncio.create_task(stop.wait(), name="stop")
    signals = asyncio.create_task(_reclaim_signals(kopf_ready, stop), name="signals")
    while True:
        holding = asyncio.create_task(elector.hold(), name="lease") if elector else None
        guards = {reconciling, watching, stopping, signals, appearing, *([holding] if holding else [])}
        done, _ = await asyncio.wait(guards, return_when=asyncio.FIRST_COMPLETED)
        if elector is None or holding not in done or done - {holding}:
            break
        # Leadership lost: stop writing at once (the Lease may already be someone else's), keep
        # watching, so the cache stays current, and stand by until the Lease is ours again.
        await _cancelled(reconciling)
        health.role, health.reconciler_task = "standby", None  # a standby is healthy: no restart
        metrics.leader.set(0)
        regained = asyncio.create_task(elector.acquire(), name="lease")
        done, _ = await asyncio.wait({regained, watching, stopping, appearing}, return_when=asyncio.FIRST_COMPLETED)
        if regained not in done:
            await _cancelled(regained)
            break
        health.role = "leader"
        metrics.leader.set(1)
        reconciler.resume()  # what changed while another replica (or nobody) acted
        reconciling = asyncio.create_task(reconciler.run(), name="reconciler")
        health.reconciler_task = reconciling
    # Stop writing first, then stop watching.
    await _cancelled(reconciling)
    kopf_stop.set()
    (watch_error,) = await asyncio.gather(watching, return_exceptions=True)
    polled = appearing.done() and not appearing.cancelled()
    if polled and appearing.exception() is None:
        kinds = ", ".join(f"{r.api_version} {r.kind}" for r in appearing.result())
        log.warning("now served, which it was not at the start: %s; stopping, to be restarted watching it", kinds)
    for task in (stopping, signals, holding, appearing):
        if task is not None:
            task.cancel()
    _forget_signal_handlers()
    crashed = reconciling in done and not reconciling.cancelled()
    for what, error in (
        ("the reconciler", reconciling.exception() if crashed else None),
        ("kopf", watch_error if isinstance(watch_error, Exception) else None),
        ("the optional kinds' poll", appearing.exception() if polled else None),
    ):
        if error is not None:
            log.error("%s crashed", what, exc_info=error)
            return 1
    return 0


async def _cancelled(task: asyncio.Task[Any]) -> None:
    """Cancel `task` and wait until it is over; how it ended stays in the task."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _reclaim_signals(kopf_ready: asyncio.Event, stop: asyncio.Event) -> None:
    """Route SIGINT/SIGTERM to `stop` again once kopf has taken them over at its start: stopping
    through our flag releases the Lease first and spares kopf's 5 s wait for its own flag waiter."""
    await kopf_ready.wait()
    if threading.current_thread() is threading.main_thread():
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, stop.set)
    await asyncio.Event().wait()  # a guard task: it ends only when cancelled


def _forget_signal_handlers() -> None:
    # kopf installs SIGINT/SIGTERM handlers on the running loop; leave it as we found it.
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.remove_signal_handler(sig)


def main(argv: Sequence[str] | None = None) -> None:
    options = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if options.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not options.verbose:
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

    async def main_async() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):  # while standing by; kopf takes over when leading
            loop.add_signal_handler(sig, stop.set)
        try:
            return await run(options, stop=stop)
        except (CredentialsError, kopf.LoginError) as exc:
            log.error("%s", exc)
            return 2

    sys.exit(asyncio.run(main_async()))


if __name__ == "__main__":
    main()
