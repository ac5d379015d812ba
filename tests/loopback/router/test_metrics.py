"""The rendered router container, run as a real process: with 2 CPUs the operator gives it
`--workers 2`, and it must start under the pod's read-only root filesystem with only its
rendered scratch volume writable, serve /metrics on its own port (not on the API port),
report every worker's counts, and drop a removed backend's gauges, without a `pid` label.

Where user namespaces work, the process runs in a mount namespace whose every mount is
read-only, with a tmpfs at each rendered emptyDir mountPath (what the kubelet gives the pod)
and the kubeconfig on a read-only mount. Elsewhere the environment stands in: no usable
TMPDIR or HOME, the rendered scratch paths mapped to a temporary directory.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest
import yaml
from aiohttp import web

from dev.ports import free_port
from epd_operator.render import render
from tests.support.fake_vllm import FakeVLLM
from tests.support.prom import sample_values, samples
from tests.support.render_examples import SHARED_STORAGE, example, find

REPO = Path(__file__).resolve().parents[3]
NS = "default"
BIN = Path(sys.executable).parent

# Inside `unshare -rm`: tmpfs at each scratch mountPath, the kubeconfig on its own mount, then
# every other mount read-only. $1 is the kubeconfig source, $2 the scratch paths (colon
# separated), the rest the command.
READ_ONLY_ROOT = r"""
set -e
kubeconfig=$(cat "$1"); scratch=$2; keep=$3; shift 3
mount -t tmpfs -o size=1m tmpfs /mnt
# The repository and its venv stay visible even where a scratch mount covers them (a clone in /tmp).
i=0; IFS=:; for path in $keep; do mkdir -p "/mnt/keep$i"; mount --bind "$path" "/mnt/keep$i"; i=$((i+1)); done
for path in $scratch; do mount -t tmpfs -o size=64m tmpfs "$path"; done
i=0; for path in $keep; do mkdir -p "$path" 2>/dev/null || true; mount --bind "/mnt/keep$i" "$path"; i=$((i+1)); done
unset IFS
printf '%s' "$kubeconfig" > /mnt/kubeconfig
mount -o remount,ro /mnt
for target in $(awk '{print $5}' /proc/self/mountinfo); do
  case "$target" in /proc*|/sys*|/dev*|/mnt) continue;; esac
  case ":$scratch:" in *":$target:"*) continue;; esac
  mount -o remount,bind,ro "$target" 2>/dev/null || true
done
if touch /.epd-rw-check 2>/dev/null || touch "$HOME/.epd-rw-check" 2>/dev/null; then
  echo "root filesystem still writable" >&2; exit 97
fi
exec "$@"
"""


def user_namespaces_work() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -o remount,bind,ro / && ! touch /.epd-rw-check"],
        capture_output=True,
        timeout=30,
    )
    return probe.returncode == 0


class SliceAPI:
    """Just enough of the Kubernetes API for the router's discovery: list and watch EndpointSlices,
    and the Pods they point at (for their generation label), in one namespace by label selector.
    (No control plane needed; tests/integration/test_router_discovery.py has the real one.)"""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, dict]] = {"endpointslices": {}, "pods": {}}
        self.version = 1
        self.watchers: list[tuple[str, dict, asyncio.Queue]] = []
        self.url = ""

    @staticmethod
    def _selected(obj: dict, selector: dict) -> bool:
        return selector.items() <= obj["metadata"]["labels"].items()

    def _notify(self, resource: str, kind: str, obj: dict) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        for watched, selector, queue in self.watchers:
            if watched == resource and self._selected(obj, selector):
                queue.put_nowait({"type": kind, "object": obj})

    def create(self, obj: dict) -> None:
        """An EndpointSlice, and a Pod (without a generation) for each endpoint it names."""
        self.objects["endpointslices"][obj["metadata"]["name"]] = obj
        self._notify("endpointslices", "ADDED", obj)
        for endpoint in obj["endpoints"]:
            name = endpoint["targetRef"]["name"]
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": NS, "labels": dict(obj["metadata"]["labels"])},
            }
            self.objects["pods"][name] = pod
            self._notify("pods", "ADDED", pod)

    def delete(self, name: str) -> None:
        self._notify("endpointslices", "DELETED", self.objects["endpointslices"].pop(name))

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert request.match_info["ns"] == NS
        resource = request.path.rsplit("/", 1)[1]
        selector = dict(p.split("=", 1) for p in request.query.get("labelSelector", "").split(",") if p)
        if request.query.get("watch") not in ("1", "true"):
            items = [o for o in self.objects[resource].values() if self._selected(o, selector)]
            return web.json_response(
                {"kind": "List", "items": items, "metadata": {"resourceVersion": str(self.version)}}
            )
        response = web.StreamResponse()
        await response.prepare(request)
        queue: asyncio.Queue = asyncio.Queue()
        watcher = (resource, selector, queue)
        self.watchers.append(watcher)
        try:
            while True:
                await response.write(orjson.dumps(await queue.get()) + b"\n")
        finally:
            self.watchers.remove(watcher)

    async def __aenter__(self) -> SliceAPI:
        app = web.Application()
        app.router.add_get("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", self.handle)
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self.handle)
        self.runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.Server)
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        await self.runner.cleanup()

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "test",
                    "clusters": [{"name": "test", "cluster": {"server": self.url}}],
                    "contexts": [{"name": "test", "context": {"cluster": "test", "namespace": NS}}],
                    "users": [],
                }
            )
        )
        return path


def endpoint_slice(name: str, selector: str, port: int, pod: str) -> dict:
    labels = dict(pair.split("=", 1) for pair in selector.split(","))
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": [
            {
                "addresses": ["127.0.0.1"],
                "conditions": {"ready": True},
                "targetRef": {"kind": "Pod", "name": pod, "namespace": NS},
            }
        ],
    }


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def with_flag(args: list[str], name: str, value: str) -> list[str]:
    args = list(args)
    args[args.index(name) + 1] = value
    return args


def rendered_router(cpu: str) -> tuple[dict, dict]:
    epd = example(
        SHARED_STORAGE,
        **{
            "spec.router.resources": {
                "requests": {"cpu": cpu, "memory": "256Mi"},
                "limits": {"cpu": cpu, "memory": "1Gi"},
            }
        },
    )
    objects = render(epd)
    deployment = find(objects, "Deployment", f"{epd.name}-router")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


def labelled(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample of `name`."""
    return [(s.labels, s.value) for s in samples(text) if s.name == name]


@pytest.mark.parametrize("cpu", ["2", "500m"], ids=["two-workers", "one-worker-default-resources"])
async def test_rendered_router_runs_read_only_and_metrics_follow_backends(tmp_path, cpu):
    # One worker matters as much as two: the rendered pod sets PROMETHEUS_MULTIPROC_DIR either way.
    async with SliceAPI() as api:
        await _run_rendered_router(api, api.kubeconfig(tmp_path / "kubeconfig"), tmp_path, cpu)


async def _run_rendered_router(apiserver: SliceAPI, kubeconfig: Path, tmp_path: Path, cpu: str) -> None:
    pod, container = rendered_router(cpu)
    args = container["args"]
    assert (flag(args, "--workers") if "--workers" in args else "1") == ("2" if cpu == "2" else "1")
    assert pod["securityContext"]["runAsNonRoot"] and container["securityContext"]["readOnlyRootFilesystem"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert int(flag(args, "--metrics-port")) == ports["metrics"] != ports["http"] == int(flag(args, "--port"))
    volumes = {v["name"]: v for v in pod["volumes"]}
    scratch = [m["mountPath"] for m in container["volumeMounts"] if "emptyDir" in volumes[m["name"]]]
    assert scratch, "the router needs a writable emptyDir"
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert any(env.get("PROMETHEUS_MULTIPROC_DIR", "").startswith(p) for p in scratch)

    port, metrics_port = free_port(), free_port()
    args = with_flag(
        with_flag(with_flag(args, "--port", str(port)), "--metrics-port", str(metrics_port)), "--host", "127.0.0.1"
    )
    args += ["--health-interval", "0.2", "--log-level", "warning"]
    base_env = {"PATH": f"{BIN}:/usr/bin:/bin", "PYTHONPATH": str(REPO / "operator"), "HOME": "/nonexistent"}
    if user_namespaces_work():
        keep = ":".join(sorted({str(REPO), str(BIN.parent)}))
        argv = [
            "unshare",
            "-rm",
            "sh",
            "-c",
            READ_ONLY_ROOT,
            "sh",
            str(kubeconfig),
            ":".join(scratch),
            keep,
            *container["command"],
            *args,
            "--kubeconfig",
            "/mnt/kubeconfig",
        ]
        proc_env = {**base_env, **env}
    else:  # no mount namespace: a read-only root as far as the environment can say it
        unwritable = tmp_path / "read-only"
        unwritable.mkdir(mode=0o555)
        local = tmp_path / "scratch"
        mapped = {k: v for k, v in env.items()}
        for path in scratch:
            mapped = {
                k: v.replace(path, str(local / path.strip("/")), 1) if v.startswith(path) else v
                for k, v in mapped.items()
            }
            (local / path.strip("/")).mkdir(parents=True)
        argv = [*container["command"], *args, "--kubeconfig", str(kubeconfig)]
        proc_env = {**base_env, "TMPDIR": str(unwritable), "HOME": str(unwritable), **mapped}

    enc_sel, dec_sel = flag(args, "--encoder-selector"), flag(args, "--decode-selector")
    async with FakeVLLM("encoder", "e0") as e0, FakeVLLM("encoder", "e1") as e1, FakeVLLM("pd", "d0") as d0:
        for name, sel, fake, pod_name in (
            ("enc-a", enc_sel, e0, "vl-encoder-0"),
            ("enc-b", enc_sel, e1, "vl-encoder-1"),
            ("dec-a", dec_sel, d0, "vl-decode-0"),
        ):
            apiserver.create(endpoint_slice(name, sel, int(fake.url.rsplit(":", 1)[1]), pod_name))
        proc = subprocess.Popen(argv, env=proc_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd="/")
        assert proc.stdout is not None
        url, metrics_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics"
        try:
            async with aiohttp.ClientSession() as session:

                async def scrape() -> str:
                    async with session.get(metrics_url) as r:
                        assert r.status == 200
                        return await r.text()

                async with asyncio.timeout(60):
                    while True:
                        assert proc.poll() is None, proc.stdout.read().decode()
                        try:
                            async with session.get(url + "/health") as r:
                                if r.status == 200 and sample_values(
                                    await scrape(), "epd_router_endpoint_available", backend_pod="vl-encoder-1"
                                ):
                                    break
                        except aiohttp.ClientError:
                            pass
                        await asyncio.sleep(0.1)

                body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
                for _ in range(8):  # fresh connections: the kernel spreads them over both workers
                    async with (
                        aiohttp.ClientSession() as one_shot,
                        one_shot.post(url + "/v1/chat/completions", data=body) as r,
                    ):
                        assert r.status == 200
                async with session.get(url + "/metrics") as r:
                    assert r.status == 404, "metrics must not be served on the API port"

                text = await scrape()
                assert labelled(text, "epd_router_requests_total") == [
                    ({"route": "/v1/chat/completions", "status": "200"}, 8.0)
                ]
                assert sample_values(text, "epd_router_build_info") == [1]
                assert sample_values(text, "process_cpu_seconds_total")
                assert sample_values(text, "process_resident_memory_bytes")
                assert not [s for s in samples(text) if "pid" in s.labels]
                e1_key = e1.url.split("//")[1]
                assert sample_values(
                    text, "epd_router_endpoint_available", backend=e1_key, backend_pod="vl-encoder-1", role="encoder"
                ) == [1]
                assert len(labelled(text, "epd_router_endpoint_available")) == 3
                assert len(labelled(text, "epd_router_endpoint_inflight")) == 3

                # The encoder behind enc-b goes away: both workers forget it, and so does /metrics.
                apiserver.delete("enc-b")
                async with asyncio.timeout(30):
                    while sample_values(text := await scrape(), "epd_router_endpoint_available", backend=e1_key):
                        await asyncio.sleep(0.2)
                assert len(labelled(text, "epd_router_endpoint_available")) == 2
                assert len(labelled(text, "epd_router_endpoint_inflight")) == 2
                assert not [s for s in samples(text) if "pid" in s.labels]
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                out, _ = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
        assert proc.returncode == 0, out.decode()


def test_more_workers_without_a_writable_directory_fail_with_a_reason(tmp_path):
    unwritable = tmp_path / "read-only"
    unwritable.mkdir(mode=0o555)
    env = {
        "PATH": f"{BIN}:/usr/bin:/bin",
        "PYTHONPATH": str(REPO / "operator"),
        "PROMETHEUS_MULTIPROC_DIR": str(unwritable / "metrics"),
    }
    if os.geteuid() == 0 and not user_namespaces_work():
        return  # root writes anywhere and no namespace can say otherwise: nothing to observe
    argv = ["epd-router", "--decode-servers-urls", "http://127.0.0.1:1", "--workers", "2", "--port", str(free_port())]
    if os.geteuid() == 0:
        argv = ["unshare", "-rm", "sh", "-c", 'mount -o remount,bind,ro / && exec "$@"', "sh", *argv]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "PROMETHEUS_MULTIPROC_DIR" in r.stderr
