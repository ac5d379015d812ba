"""Turn rendered Kubernetes objects into local processes: what `make demo` and the e2e tests run.

The point of running locally is to exercise exactly what the operator deploys, so each vLLM
tier's process is its Deployment's container command line as rendered. Only what cannot be the
same on one CPU machine is substituted, and every substitution is recorded as a deviation:

* ports (each declared containerPort gets a free loopback port), ``--host`` -> 127.0.0.1,
  ``$(VAR)`` expansions resolved as the kubelet would (status.podIP -> 127.0.0.1);
* paths under a volume mount -> a local directory per volume (pods sharing a claim share it);
* the model -> the local tiny model (no downloads here); executables -> the local venvs';
* CPU necessities: ``--kv-cache-memory-bytes`` (skips sizing from "GPU" memory), tensor
  parallelism 1, and for E/P/D ``--block-size 32``; env ``OMP_NUM_THREADS=1``,
  ``VLLM_CPU_OMP_THREADS_BIND=nobind``, ``HF_HUB_OFFLINE=1``;
* E/P/D keeps the rendered ``NixlConnector`` config, so KV moves prefill -> decode over NIXL
  (UCX on loopback) as in a cluster; the tiers running it get two adaptations of NIXL to a small
  shared CPU, applied by ``dev/builds/cpu_vllm/sitecustomize.py`` through their PYTHONPATH (see there):
  no pinning of the model thread, and a NIXL progress-thread delay of 1 ms instead of a busy poll;
* the router reads static URLs of the local instances instead of EndpointSlices.

One process per tier whatever the replica count; sidecars (the cache janitor) are not run.
This module only plans (no processes, no I/O besides choosing free ports): see `runner`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dev.local.argv import drop_flags, expand_vars, flag_value, map_flag_values, set_flag
from dev.local.volumes import PathMap, volume_key
from dev.paths import REPO
from dev.ports import LOCALHOST, free_port
from epd_operator.api.labels import ROLE_LABEL

ENCODER, PREFILL, DECODE, ROUTER = "encoder", "prefill", "decode", "router"
VLLM_ROLES = (ENCODER, PREFILL, DECODE)

# 64 MiB of KV cache is plenty for a 2-layer model and saves ~1 GB per instance against vLLM's
# default of sizing the cache from a fraction of "device" (here: host) memory.
CPU_KV_CACHE_BYTES = 64 * 1024 * 1024
# vLLM's CPU attention needs KV blocks in multiples of 32 once a KV connector is involved.
CPU_KV_BLOCK_SIZE = 32
CPU_ENV = {
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
# EC connectors that can run on this machine (ECCPUConnector needs Triton, Mooncake a NIC).
LOCAL_EC_CONNECTORS = {"ECExampleConnector"}
LOCAL_KV_CONNECTORS = {"NixlConnector"}
# The local-run adaptations of NIXL to a CPU shared by several instances (dev/builds/cpu_vllm/sitecustomize.py):
# the directory put on PYTHONPATH, and what it is told to do.
CPU_VLLM_DIR = REPO / "dev" / "builds" / "cpu_vllm"
CPU_NIXL_PROGRESS_DELAY_US = 1000
CPU_NIXL_ENV = {
    "PYTHONPATH": str(CPU_VLLM_DIR),
    "EPD_LOCAL_NIXL_NO_CORE_RESERVATION": "1",
    "EPD_LOCAL_NIXL_PROGRESS_DELAY_US": str(CPU_NIXL_PROGRESS_DELAY_US),
}
# Router flags that configure Kubernetes discovery; locally the router gets static URLs instead.
ROUTER_DISCOVERY_FLAGS = {
    "--discovery",
    "--namespace",
    "--kubeconfig",
    "--encoder-selector",
    "--prefill-selector",
    "--decode-selector",
    "--backend-port-name",
    "--backend-port",
    "--ec-consumer-port",
    "--encode-servers-urls",
    "--prefill-servers-urls",
    "--decode-servers-urls",
}

JSON = dict[str, Any]


class PlanError(ValueError):
    """The rendered objects cannot run locally; the message says what and why."""


@dataclass
class LocalProcess:
    """One local stand-in for a Deployment's pod: the command line it runs and how it differs."""

    name: str  # the Deployment's name
    role: str
    argv: list[str]
    env: dict[str, str]  # added to (or replacing) the caller's environment
    port: int  # the HTTP port, probed on /health
    deviations: list[str] = field(default_factory=list)
    rendered_argv: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{LOCALHOST}:{self.port}"


@dataclass
class LocalPlan:
    processes: list[LocalProcess]
    topology: str  # "E+PD" or "E/P/D"
    served_model: str  # the `model` clients send
    volumes: dict[str, Path]  # volume source (e.g. "pvc/ec-cache") -> local directory

    def of_role(self, role: str) -> list[LocalProcess]:
        return [p for p in self.processes if p.role == role]

    def one(self, role: str) -> LocalProcess:
        [process] = self.of_role(role)
        return process

    def volume(self, key: str) -> Path:
        return self.volumes[key]


# --------------------------------------------------------------------------------------------
# Planning
# --------------------------------------------------------------------------------------------


@dataclass
class _Pod:
    """What a rendered Deployment's main container says, with local values resolved."""

    deployment: JSON
    container: JSON
    name: str
    role: str
    env: dict[str, str]
    ports: dict[int, int]  # containerPort -> local port
    paths: PathMap
    deviations: list[str]


def _deployments(objects: list[JSON]) -> dict[str, JSON]:
    found: dict[str, JSON] = {}
    for obj in objects:
        if obj.get("kind") == "LeaderWorkerSet":
            raise PlanError(
                f"{obj['metadata']['name']} spans several nodes (a LeaderWorkerSet): this machine "
                "runs single-node tiers only; set nodesPerReplica: 1 to run it here"
            )
        if obj.get("kind") != "Deployment":
            continue
        role = obj["metadata"].get("labels", {}).get(ROLE_LABEL)
        if role is None:
            continue
        if role in found:
            raise PlanError(f"two Deployments with {ROLE_LABEL}={role}: run one EPDDeployment at a time")
        found[role] = obj
    if ENCODER not in found or DECODE not in found or ROUTER not in found:
        raise PlanError(f"rendered objects lack an encoder, decode or router Deployment (roles: {sorted(found)})")
    unknown = set(found) - {*VLLM_ROLES, ROUTER}
    if unknown:
        raise PlanError(f"cannot run {sorted(unknown)} locally (only the SharedStorage EC connector runs here)")
    return found


def _main_container(deployment: JSON, command: str) -> JSON:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    for c in containers:
        if command in c.get("command", [])[:2]:
            return c
    raise PlanError(f"Deployment {deployment['metadata']['name']} has no container running {command!r}")


def _configmaps(objects: list[JSON]) -> dict[str, dict[str, str]]:
    return {o["metadata"]["name"]: o.get("data", {}) for o in objects if o.get("kind") == "ConfigMap"}


def _resolve_env(
    container: JSON, name: str, configmaps: dict[str, dict[str, str]], ports: dict[int, int], deviations: list[str]
) -> dict[str, str]:
    """Container env as the kubelet resolves it, on loopback; earlier variables expand in later ones."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        key = var["name"]
        if "value" in var:
            value = expand_vars(str(var["value"]), env)
            if key.endswith("PORT") and value.isdigit() and int(value) in ports:
                value = str(ports[int(value)])
            env[key] = value
            continue
        source = var.get("valueFrom", {})
        if "fieldRef" in source:
            field_path = source["fieldRef"]["fieldPath"]
            if field_path in ("status.podIP", "status.hostIP"):
                env[key] = LOCALHOST
            elif field_path == "metadata.name":
                env[key] = f"{name}-local"
            else:
                deviations.append(f"env {key} ({field_path}) not set locally")
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            found = configmaps.get(ref["name"], {}).get(ref["key"])
            if found is None:
                raise PlanError(f"{name}: env {key} refers to ConfigMap {ref['name']}/{ref['key']}, not rendered")
            env[key] = found
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            deviations.append(f"env {key} from Secret {ref['name']} not set (the hub is offline here)")
    return env


def _pod(
    deployment: JSON,
    command: str,
    configmaps: dict[str, dict[str, str]],
    workdir: Path,
    volumes: dict[str, Path],
    pick_port: Callable[[], int],
) -> _Pod:
    meta = deployment["metadata"]
    name, role = meta["name"], meta["labels"][ROLE_LABEL]
    container = _main_container(deployment, command)
    deviations: list[str] = []
    replicas = deployment["spec"].get("replicas", 1)
    if replicas is not None and replicas != 1:
        deviations.append(f"1 process instead of {replicas} replicas")
    ports = {p["containerPort"]: pick_port() for p in container.get("ports", [])}
    pod_volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"].get("volumes", [])}
    mounts: dict[str, Path] = {}
    for mount in container.get("volumeMounts", []):
        volume = pod_volumes.get(mount["name"])
        key = volume_key(name, volume) if volume else None
        if key is None or mount["mountPath"] == "/dev/shm":
            continue
        local = volumes.setdefault(key, workdir / "volumes" / key)
        mounts[mount["mountPath"]] = local
        deviations.append(f"volume {mount['name']} at {mount['mountPath']} -> {local}")
    deviations += [f"port {rendered} -> {local}" for rendered, local in ports.items()]
    env = _resolve_env(container, name, configmaps, ports, deviations)
    paths = PathMap(mounts)
    env = {k: paths.path(v) for k, v in env.items()}
    return _Pod(deployment, container, name, role, env, ports, paths, deviations)


def _http_port(pod: _Pod, args: list[str]) -> int:
    rendered = flag_value(args, "--port")
    if rendered is None or not rendered.isdigit() or int(rendered) not in pod.ports:
        raise PlanError(f"{pod.name}: --port {rendered} is not one of the container's ports {sorted(pod.ports)}")
    return pod.ports[int(rendered)]


def _rendered_argv(pod: _Pod) -> list[str]:
    c = pod.container
    return [expand_vars(a, pod.env) for a in [*c.get("command", []), *c.get("args", [])]]


def _transfer_config(args: list[str], flag: str) -> JSON | None:
    value = flag_value(args, flag)
    if value is None:
        return None
    try:
        return json.loads(value)
    except ValueError as exc:
        raise PlanError(f"{flag} is not JSON: {exc}") from None


def _vllm_process(pod: _Pod, model_dir: Path, vllm: Path) -> LocalProcess:
    rendered = _rendered_argv(pod)
    if rendered[:2] != ["vllm", "serve"]:
        raise PlanError(f"{pod.name}: expected `vllm serve ...`, got {rendered[:2]}")
    args = [pod.paths.arg(a) for a in rendered[2:]]
    notes = list(pod.deviations)

    port = _http_port(pod, args)
    args = map_flag_values(args, "--port", lambda _: str(port))
    for flag in [a.split("=", 1)[0] for a in args if a.startswith("--") and a.split("=", 1)[0].endswith("-port")]:
        args = map_flag_values(args, flag, lambda v: str(pod.ports.get(int(v), v)) if v.isdigit() else v)
    if flag_value(args, "--host") is not None:
        args = map_flag_values(args, "--host", lambda _: LOCALHOST)

    if args and not args[0].startswith("-"):
        notes.append(f"model {rendered[2]} -> local tiny model")
        args[0] = str(model_dir)
    if flag_value(args, "--model") is not None:
        args = map_flag_values(args, "--model", lambda _: str(model_dir))

    ec = _transfer_config(args, "--ec-transfer-config")
    if ec is not None and ec.get("ec_connector") not in LOCAL_EC_CONNECTORS:
        raise PlanError(
            f"{pod.name}: EC connector {ec.get('ec_connector')} cannot run on this CPU machine; "
            "run an EPDDeployment with ecTransfer.connector: SharedStorage locally"
        )
    env = {**pod.env, **CPU_ENV}
    kv = _transfer_config(args, "--kv-transfer-config")
    if kv is not None:
        if kv.get("kv_connector") not in LOCAL_KV_CONNECTORS:
            raise PlanError(f"{pod.name}: KV connector {kv.get('kv_connector')} cannot run on this CPU machine")
        args = set_flag(args, "--block-size", str(CPU_KV_BLOCK_SIZE))
        notes.append(f"--block-size {CPU_KV_BLOCK_SIZE} (CPU attention)")
        env.update(CPU_NIXL_ENV)
        notes.append(
            f"NIXL on a shared CPU: model thread not pinned, progress-thread delay {CPU_NIXL_PROGRESS_DELAY_US} us "
            f"(PYTHONPATH={CPU_VLLM_DIR.name}/sitecustomize.py)"
        )

    tp = flag_value(args, "--tensor-parallel-size")
    if tp is not None and tp != "1":
        args = map_flag_values(args, "--tensor-parallel-size", lambda _: "1")
        notes.append(f"--tensor-parallel-size {tp} -> 1 (one CPU process)")
    if flag_value(args, "--kv-cache-memory-bytes") is None:
        args += ["--kv-cache-memory-bytes", str(CPU_KV_CACHE_BYTES)]
        notes.append(f"--kv-cache-memory-bytes {CPU_KV_CACHE_BYTES} (host memory)")

    return LocalProcess(
        name=pod.name,
        role=pod.role,
        argv=[str(vllm), "serve", *args],
        env=env,
        port=port,
        deviations=notes,
        rendered_argv=rendered,
    )


def _router_process(pod: _Pod, router: list[str], vllm_processes: list[LocalProcess]) -> LocalProcess:
    rendered = _rendered_argv(pod)
    if rendered[:1] != ["epd-router"]:
        raise PlanError(f"{pod.name}: expected `epd-router ...`, got {rendered[:1]}")
    args = rendered[1:]
    port = _http_port(pod, args)
    args = map_flag_values(args, "--port", lambda _: str(port))
    if flag_value(args, "--host") is not None:
        args = map_flag_values(args, "--host", lambda _: LOCALHOST)
    urls = {role: ",".join(p.url for p in vllm_processes if p.role == role) for role in VLLM_ROLES}
    notes = [*pod.deviations, "static backend URLs instead of EndpointSlice discovery"]
    if flag_value(args, "--metrics-port") is not None:
        # The demo reads the router's stage timings from /metrics on its one local port.
        args = drop_flags(args, ["--metrics-port"])
        notes.append("/metrics on the API port instead of --metrics-port")
    args = drop_flags(args, ROUTER_DISCOVERY_FLAGS) + [
        "--encode-servers-urls",
        urls[ENCODER],
        "--prefill-servers-urls",
        urls[PREFILL] or "disable",
        "--decode-servers-urls",
        urls[DECODE],
    ]
    return LocalProcess(
        name=pod.name,
        role=ROUTER,
        argv=[*router, *args],
        env=pod.env,
        port=port,
        deviations=notes,
        rendered_argv=rendered,
    )


def plan(
    objects: list[JSON],
    *,
    model_dir: Path,
    workdir: Path,
    vllm: Path,
    router: list[str],
    pick_port: Callable[[], int] = free_port,
) -> LocalPlan:
    """The local processes for rendered `objects` (the output of `epd_operator.render.render`).

    `vllm` is the `vllm` executable of the CPU venv, `router` the command that starts
    `epd-router`, `workdir` where the volumes' local directories go.
    """
    deployments = _deployments(objects)
    configmaps = _configmaps(objects)
    volumes: dict[str, Path] = {}
    processes = [
        _vllm_process(_pod(deployments[role], "vllm", configmaps, workdir, volumes, pick_port), model_dir, vllm)
        for role in VLLM_ROLES
        if role in deployments
    ]
    router_pod = _pod(deployments[ROUTER], "epd-router", configmaps, workdir, volumes, pick_port)
    processes.append(_router_process(router_pod, router, processes))
    decode = next(p for p in processes if p.role == DECODE)
    served = flag_value(decode.argv, "--served-model-name") or str(model_dir)
    return LocalPlan(
        processes=processes,
        topology="E/P/D" if PREFILL in deployments else "E+PD",
        served_model=served,
        volumes=volumes,
    )
