"""`make bench-gateway`: what the local cluster's Gateway API gateway (Traefik, dev/parts/gateway.py) adds to a
request, against the router Service reached directly.

On the local cluster's real node: the operator from its chart, examples/epd-local-cpu.yaml (E+PD, one
pod per tier) with its HTTPRoute attached to the Traefik Gateway, and one client in the node's network
namespace sending sequential requests over one keep-alive connection per path, in interleaved blocks
(direct, gateway, direct, ...): `GET /v1/models` (the router asks decode's vLLM: a small request) and a
chat with a never-seen image (4 tokens). Per path and kind: p50 and p90 of the client's latency, and the
gateway's and the router's CPU per request (their processes' user+system time from /proc over the
gateway's blocks, divided by the requests). Writes bench/results/gateway.md and gateway.json. Needs
root and the real node's packages, like `make test-node`; about 10 minutes on 2 cores with the vLLM
image in the node store.

    python -m bench.gateway                 # run it
    python -m bench.gateway --client ...    # (internal) the client, run inside the node's network namespace
"""

from __future__ import annotations

import argparse
import http.client
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .procs import commit, cpu_model, cpu_of

RESULTS = Path(__file__).with_name("results")
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "epd-local-cpu.yaml"
NAME, SERVED = "tiny-vl", "tiny-vl"
BLOCKS = 5  # interleaved blocks per path
PER_BLOCK = {"models": 200, "image chat": 24}


def _request(conn: http.client.HTTPConnection, kind: str, seed: int) -> float:
    from dev.local.client import chat_body, image_part, text_part

    if kind == "models":
        method, path, body = "GET", "/v1/models", None
    else:
        payload = chat_body(SERVED, [text_part("Describe it."), image_part(10_000 + seed)], 4)
        method, path, body = "POST", "/v1/chat/completions", json.dumps(payload).encode()
    started = time.perf_counter()
    conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
    answer = conn.getresponse()
    answer.read()
    if answer.status != 200:
        raise RuntimeError(f"{kind} answered {answer.status}")
    return time.perf_counter() - started


def client(urls: dict[str, str], pids: dict[str, list[int]]) -> dict[str, Any]:
    """Interleaved blocks per kind and path; latencies, and the CPU each process used during each path's blocks."""
    conns = {where: http.client.HTTPConnection(urlsplit(url).netloc, timeout=120) for where, url in urls.items()}
    latencies: dict[str, dict[str, list[float]]] = {k: {w: [] for w in urls} for k in PER_BLOCK}
    cpu: dict[str, dict[str, dict[str, float]]] = {k: {w: dict.fromkeys(pids, 0.0) for w in urls} for k in PER_BLOCK}
    seed = 0
    for kind, count in PER_BLOCK.items():
        for where in urls:  # one warm-up request per path: connection set up, caches filled
            _request(conns[where], kind, seed := seed + 1)
        for _ in range(BLOCKS):
            for where in urls:
                before = {name: cpu_of(ps) for name, ps in pids.items()}
                for _ in range(count):
                    latencies[kind][where].append(_request(conns[where], kind, seed := seed + 1))
                for name, ps in pids.items():
                    cpu[kind][where][name] += cpu_of(ps) - before[name]
    return {"latencies": latencies, "cpu_seconds": cpu}


def _pids(pattern: str) -> list[int]:
    """Every process whose command line contains `pattern` (the pods' processes, seen from the host)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if pattern in cmdline and "bench.gateway" not in cmdline:
                found.append(int(entry.name))
    return found


def _answers(m: Any, url: str) -> bool:
    try:
        return bool(m.in_node(url, timeout=10)[0] == 200)
    except AssertionError:  # refused (kube-proxy has no endpoint yet) or timed out
        return False


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def report(raw: dict[str, Any]) -> str:
    lat, cpu = raw["result"]["latencies"], raw["result"]["cpu_seconds"]
    lines = [
        "# The gateway's cost per request (`make bench-gateway`)",
        "",
        f"Run {raw['started']}, commit `{raw['commit']}`, {raw['cpu']} ({raw['machine']}), load average "
        f"{raw['load']} (1/5/15 min) at the end; {raw['minutes']:.1f} min in all. Shared cores: latencies are "
        "upper bounds.",
        "",
        "Setup: the local cluster's real node; `examples/epd-local-cpu.yaml` (one encoder, one prefill+decode "
        "pod, one router; vLLM 0.32 for CPU, tiny Qwen2-VL) with its HTTPRoute attached to the Gateway that "
        "Traefik 3.7.15 serves as a pod (dev/parts/gateway.py). One client in the node's network namespace, "
        "sequential requests over one keep-alive connection per path, in interleaved blocks "
        f"({BLOCKS} per path): `GET /v1/models` (the router asks decode's vLLM) and a chat with a never-seen "
        "image (4 tokens). CPU: user+system time of the gateway's and the router's processes over each "
        "path's blocks, per request (10 ms clock ticks). Traefik's pod requests 100m CPU, as the example's "
        "router does: on 2 shared cores the vLLM pods' work contends with both.",
        "",
        "## Figures",
        "",
        "| request | path | requests | p50 | p90 | added p50 | gateway CPU per request | router CPU per request |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind in PER_BLOCK:
        direct_p50 = statistics.median(lat[kind]["direct"])
        for where in ("direct", "gateway"):
            values = lat[kind][where]
            p50 = statistics.median(values)
            added = f"{(p50 - direct_p50) * 1000:+.2f} ms" if where == "gateway" else ""
            per = {name: cpu[kind][where][name] / len(values) * 1000 for name in ("gateway", "router")}
            lines.append(
                f"| {kind} | {'router Service' if where == 'direct' else 'gateway'} | {len(values)} | "
                f"{p50 * 1000:.2f} ms | {_pct(values, 0.9) * 1000:.2f} ms | {added} | "
                f"{per['gateway']:.3f} ms | {per['router']:.3f} ms |"
            )
    lines += [
        "",
        "The gateway's CPU on the direct path is what it spends idle meanwhile (health checks, its "
        "Kubernetes watches).",
        "",
    ]
    return "\n".join(lines)


def run(tmp: Path) -> dict[str, Any]:
    from dev.parts import gateway
    from tests.support.cluster import EPD_API, wait_for
    from tests.support.mission import all_ready, describe, mission_cluster

    with mission_cluster(tmp) as m:
        m.kube.kubectl("apply", "-f", str(EXAMPLE))
        wait_for(lambda: all_ready(m), 900, lambda: describe(m), interval=2)
        m.cluster.start_part("gateway")
        address = gateway.address(m.cluster)
        m.kube.ok(
            "PATCH",
            f"/apis/{EPD_API}/namespaces/{m.kube.ns}/epddeployments/{NAME}",
            {"spec": {"router": {"gateway": {"parentRefs": [gateway.parent_ref()]}}}},
        )
        wait_for(lambda: _answers(m, f"{address}/v1/models"), 180, "the gateway never answered the route")
        service = m.kube.get("v1", "Service", NAME)
        assert service is not None
        urls = {"direct": f"http://{service['spec']['clusterIP']}:8000", "gateway": address}
        pids = {"gateway": _pids("providers.kubernetesgateway=true"), "router": _pids("epd-router")}
        assert all(pids.values()), f"processes not found: {pids}"
        argv = m.cluster.real_node().netns_argv(
            sys.executable, "-m", "bench.gateway", "--client", json.dumps({"urls": urls, "pids": pids})
        )
        out = subprocess.run(argv, capture_output=True, text=True, timeout=1200, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"the client failed:\n{out.stderr[-3000:]}")
        return dict(json.loads(out.stdout))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "gateway.md")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        spec = json.loads(args.client)
        print(json.dumps(client(spec["urls"], spec["pids"])))
        return 0
    from tests.support.real_node import unavailable

    if why := unavailable():
        print(f"bench-gateway: {why}", file=sys.stderr)
        return 2
    started, t, ran_at = datetime.now(UTC), time.monotonic(), commit()
    with tempfile.TemporaryDirectory(prefix="epd-bench-gateway-") as tmp:
        result = run(Path(tmp))
    with open("/proc/loadavg") as f:
        load = " / ".join(f.read().split()[:3])
    raw = {
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "commit": ran_at,
        "cpu": cpu_model(),
        "machine": platform.machine(),
        "load": load,
        "minutes": (time.monotonic() - t) / 60,
        "result": result,
    }
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(raw, indent=1))
    out.write_text(report(raw))
    print(f"wrote {out} and {out.with_suffix('.json')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
