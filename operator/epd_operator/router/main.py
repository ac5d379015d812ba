"""`epd-router`: the process, its event loop and, with `--workers` > 1, the supervisor of its workers.

SIGTERM or SIGINT drains the router (`RouterServer.shutdown`): new connections are refused, the
requests in flight finish for up to `--drain-timeout` seconds, then it exits 0.

The flags and the `RouterConfig` they give are `router.flags` (`build_parser` and `config_from_args`,
re-exported here for the tests and benchmarks that build a router's config from a command line).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys
import tempfile
import types
import typing

from .config import RouterConfig
from .flags import build_parser, config_from_args

if typing.TYPE_CHECKING:
    # Not imported at run time here: prometheus_client picks its multiprocess value class at import,
    # which must happen after main sets PROMETHEUS_MULTIPROC_DIR.
    from prometheus_client import CollectorRegistry

__all__ = ["build_parser", "config_from_args", "main", "metrics_run_dir", "run_worker"]

MULTIPROC_ENV = ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir")


def listening_socket(host: str, port: int) -> socket.socket:
    """The socket a router serves on (`Router.serve`): --workers processes share it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # the kernel spreads connections over workers
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


async def _serve(cfg: RouterConfig) -> None:
    from .server import Router

    router = Router(cfg)
    # A client that disconnects cancels its request, which closes every upstream call it has open.
    server = await router.serve(listening_socket(cfg.host, cfg.port))
    log = logging.getLogger("epd_router")
    log.info("listening on %s:%d (pid %d)", cfg.host, cfg.port, os.getpid())
    if cfg.metrics_port is not None and cfg.workers <= 1:
        _serve_metrics(cfg.host, cfg.metrics_port, router.metrics.registry)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)  # a second signal changes nothing: the deadline bounds the drain
    await stop.wait()
    await server.shutdown(cfg.drain_timeout)


def run_worker(cfg: RouterConfig, log_level: str) -> None:
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        import uvloop
    except ImportError:  # e.g. Windows: the stdlib loop works, only slower
        asyncio.run(_serve(cfg))
    else:
        uvloop.run(_serve(cfg))


def _serve_metrics(host: str, port: int, registry: CollectorRegistry) -> None:
    """/metrics on its own port, from a thread (prometheus_client's server), apart from the API."""
    from prometheus_client import start_http_server

    start_http_server(port, addr=host, registry=registry)
    logging.getLogger("epd_router").info("metrics on %s:%d/metrics", host, port)


def metrics_run_dir() -> str:
    """A fresh directory for this run's multiprocess metric files.

    Under $PROMETHEUS_MULTIPROC_DIR when set (the operator points it into the pod's scratch
    emptyDir: the root filesystem is read-only), else under the temporary directory. Fresh each
    start, so a restarted container never adds the previous run's counts.
    """
    base = os.environ.get(MULTIPROC_ENV[0]) or os.environ.get(MULTIPROC_ENV[1])
    try:
        if base:
            os.makedirs(base, exist_ok=True)
        return tempfile.mkdtemp(prefix="run-", dir=base)
    except (OSError, FileNotFoundError) as exc:
        raise OSError(
            f"--workers > 1 needs a writable directory for the shared metrics ({exc}); "
            "set PROMETHEUS_MULTIPROC_DIR or TMPDIR to one (a pod: an emptyDir)"
        ) from exc


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        sys.exit(f"epd-router: {exc}")
    if cfg.workers <= 1:
        # One process keeps its metrics in memory: nothing to write, whatever the environment says
        # (the rendered pod always sets PROMETHEUS_MULTIPROC_DIR). prometheus_client picked its value
        # class from the environment when it was imported: let it pick again.
        for name in MULTIPROC_ENV:
            os.environ.pop(name, None)
        from prometheus_client import values

        values.ValueClass = values.get_value_class()
        run_worker(cfg, args.log_level)
        return
    # Several interpreters share the metrics through prometheus_client's multiprocess files;
    # the variable must be set before any worker creates a metric.
    from prometheus_client import multiprocess

    from .metrics import PIDS_FILE, multiprocess_registry

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        metrics_dir = metrics_run_dir()
    except OSError as exc:
        sys.exit(f"epd-router: {exc}")
    os.environ[MULTIPROC_ENV[0]] = metrics_dir
    os.environ.pop(MULTIPROC_ENV[1], None)
    ctx = multiprocessing.get_context("spawn")
    workers = [
        ctx.Process(target=run_worker, args=(cfg, args.log_level), name=f"epd-router-{i}") for i in range(cfg.workers)
    ]
    try:
        for w in workers:
            w.start()
        with open(os.path.join(metrics_dir, PIDS_FILE), "w") as f:
            f.write("".join(f"{pid}\n" for pid in [os.getpid(), *(w.pid for w in workers)]))

        # SIGTERM/SIGINT: every worker drains on its own (--drain-timeout) and exits; the supervisor
        # exits once they all have.
        def forward(signum: int, _frame: types.FrameType | None) -> None:
            for w in workers:
                if w.is_alive() and w.pid:
                    os.kill(w.pid, signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        if cfg.metrics_port is not None:
            # The supervisor reports for all workers: whichever worker the kernel would pick
            # for a scrape, the answer is the same, and a busy worker never delays it.
            _serve_metrics(cfg.host, cfg.metrics_port, multiprocess_registry(metrics_dir))
        running = {w.sentinel: w for w in workers}
        while running:
            for sentinel in multiprocessing.connection.wait(list(running)):
                w = running.pop(typing.cast(int, sentinel))  # wait() returns the sentinels it was given
                w.join()
                multiprocess.mark_process_dead(w.pid, metrics_dir)  # its live gauges leave /metrics
    finally:
        for w in workers:
            if w.is_alive():
                w.terminate()
        shutil.rmtree(metrics_dir, ignore_errors=True)
    sys.exit(max((w.exitcode or 0) for w in workers))


if __name__ == "__main__":
    main()
