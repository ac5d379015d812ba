"""``python -m dev.cluster.cli up [--detach] [--real-node] [--part NAME]... | down | build``: a local control plane
(``dev/cluster/local.py``) for a person (``make cluster``), kept running in the background until ``down``, with the
parts asked for (``--part``: any part of ``dev/parts/registry.py`` not started with every real node); what it
leaves for other commands (its kubeconfig, its real node's address) is ``dev/cluster/state.py``'s."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from dev.builds.k8s_binaries import NEWEST, OLDEST, binaries
from dev.cluster.local import LocalCluster, RealNodeSpec
from dev.cluster.state import REAL_NODE_STATE, STATE_DIR, running_pid
from dev.parts import registry


def _up(args: argparse.Namespace) -> int:
    if args.detach:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        log = STATE_DIR / "supervisor.log"
        if running_pid() is not None:
            print("a local cluster is already running; stop it with `make cluster-down`", file=sys.stderr)
            return 1
        (STATE_DIR / "ready").unlink(missing_ok=True)  # left by a supervisor that was killed
        with log.open("wb") as out:
            child = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "dev.cluster.cli",
                    "up",
                    "--version",
                    args.version,
                    *(["--real-node"] if args.real_node else []),
                    *(f"--part={name}" for name in args.part),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + args.timeout
        ready = STATE_DIR / "ready"
        while time.monotonic() < deadline and not ready.exists():
            if child.poll() is not None:
                print(log.read_text(errors="replace")[-4000:], file=sys.stderr)
                return 1
            time.sleep(0.5)
        if not ready.exists():
            child.terminate()
            print(f"the cluster did not come up in {args.timeout} s; see {log}", file=sys.stderr)
            return 1
        print(ready.read_text(), end="")
        return 0

    STATE_DIR.mkdir(parents=True, exist_ok=True)
    (STATE_DIR / "ready").unlink(missing_ok=True)
    workdir = STATE_DIR / "run"
    shutil.rmtree(workdir, ignore_errors=True)
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    real_nodes = (RealNodeSpec(),) if args.real_node else ()
    with LocalCluster(workdir, version=args.version, real_nodes=real_nodes, parts=args.part) as cluster:
        kc = STATE_DIR / "kubeconfig"
        shutil.copy(cluster.kubeconfig_path, kc)
        (STATE_DIR / "pid").write_text(str(os.getpid()))
        real = ""
        for node in cluster.real_nodes:
            REAL_NODE_STATE.write_text(
                json.dumps({"name": node.name, "enter": node.enter_argv(), "socket": str(node.containerd_socket)})
            )
            real = (
                f" and real node {node.name} (pods and Service IPs answer inside its network namespace: "
                f"nsenter --net={node.netns} curl ...; `make images` loads the local images into it)"
            )
        parts = "".join(f"\n  {part.name}: {part.running(cluster)}" for part in cluster.parts.values())
        message = (
            f"Kubernetes {cluster.version} is running at {cluster.server} "
            f"with fake GPU nodes {', '.join(n.name for n in cluster.nodes)}{real}, and its parts:{parts or ' none'}\n"
            f"  export KUBECONFIG={kc}\n"
            f"  export PATH={cluster.bin}:$PATH    # kubectl {cluster.version}\n"
            f"  stop it with: make cluster-down   (or: python -m dev.cluster.cli down)\n"
        )
        (STATE_DIR / "ready").write_text(message)
        print(message, end="", flush=True)
        while not stop:
            time.sleep(0.5)
            cluster.check_alive()
    for f in ("pid", "ready", "kubeconfig", REAL_NODE_STATE.name):
        (STATE_DIR / f).unlink(missing_ok=True)
    return 0


def _down(_: argparse.Namespace) -> int:
    pid = running_pid()
    if pid is None:
        print("no local cluster is running", file=sys.stderr)
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            print("local cluster stopped", file=sys.stderr)
            return 0
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)  # what it started dies with it; a real node's reaper clears the rest
    for f in ("pid", "ready", "kubeconfig", REAL_NODE_STATE.name):
        (STATE_DIR / f).unlink(missing_ok=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dev.cluster.cli",
        description="A real Kubernetes control plane on this machine, with fake GPU nodes.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a local control plane with fake GPU nodes")
    up.add_argument("--version", default=NEWEST, help=f"Kubernetes version (default {NEWEST})")
    up.add_argument("--detach", action="store_true", help="run in the background; stop with `down`")
    up.add_argument("--real-node", action="store_true", help="add a real node (containerd, kubelet) that runs pods")
    asked = registry.on_request()
    up.add_argument(
        "--part",
        action="append",
        default=[],
        choices=[part.name for part in asked],
        metavar="NAME",
        help="run this part too (repeatable; dev/parts/registry.py): "
        + "; ".join(f"{part.name}: {part.summary}" for part in asked),
    )
    up.add_argument("--timeout", type=float, default=3600, help="seconds to wait for it (first run builds it)")
    sub.add_parser("down", help="stop the background control plane")
    build = sub.add_parser("build", help="build the binaries only")
    build.add_argument("--version", default=NEWEST)
    build.add_argument("--oldest", action="store_true", help=f"the oldest supported kube-apiserver ({OLDEST}) only")
    build.add_argument("--real-node", action="store_true", help="the kubelet and kube-proxy too")
    args = parser.parse_args(argv)
    if args.command == "up":
        return _up(args)
    if args.command == "build":
        print(binaries(OLDEST, apiserver_only=True) if args.oldest else binaries(args.version, node=args.real_node))
        return 0
    return _down(args)


if __name__ == "__main__":
    sys.exit(main())
