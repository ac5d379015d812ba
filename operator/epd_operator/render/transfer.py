"""EC (encoder cache) and KV transfer, per connector: the vLLM configs, env, ports and volumes of a tier,
and the connections between tiers each connector opens (`transfer_ingress`, what the NetworkPolicies admit).

Which tier plays which role:
- the encoder is always the EC producer;
- the EC consumer is the tier that prefills: PD in E+PD, P in E/P/D; D in E/P/D has no EC role;
- in E/P/D, P is the KV producer and D the KV consumer (NIXL unless `kvTransfer` says otherwise).

Every address a peer must reach is the pod's own IP, passed as `$(POD_IP)` (the downward-API env
the vLLM container declares first) so Kubernetes expands it in args and env alike.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..api.quantity import quantity_bytes
from ..api.spec import EPDDeployment, EPDDeploymentSpec
from ..api.tiers import VLLM_PORT, ConsumerTier
from ..api.transfer import KVTransfer, Mooncake, SharedStorage
from ..router.contract import EC_RANK_PORT_PREFIX
from .naming import (
    DECODE,
    ENCODER,
    MOONCAKE_MASTER,
    PREFILL,
    VllmRole,
    object_name,
    tier_of,
    transfer_configmap_name,
    vllm_roles,
)

POD_IP = "$(POD_IP)"

EC_CONNECTORS = {"SharedStorage": "ECExampleConnector", "Mooncake": "ECMooncakeConnector", "CPU": "ECCPUConnector"}
KV_CONNECTORS = {"Nixl": "NixlConnector"}

EC_CACHE_VOLUME = "ec-cache"
MOONCAKE_STORE_KEY = "mooncake-store.json"
MOONCAKE_STORE_DIR = "/etc/epd/mooncake"
MOONCAKE_MASTER_RPC_PORT = 50051
MOONCAKE_MASTER_METRICS_PORT = 9003
# Embedded mode: each encoder lends this much RAM to the shared embedding store (vLLM's default).
MOONCAKE_SEGMENT_BYTES = 4 * 2**30
JANITOR_INTERVAL_SECONDS = 30
# cross_encoder_cache keys embeddings by the processor cache's content ids, so it must stay on.
MM_PROCESSOR_CACHE_GB = 4
# UCX's TCP transport (NIXL's data path when UCX_TLS allows tcp) listens, per worker and network device,
# on a port it draws from UCX_TCP_PORT_RANGE (uct/tcp/tcp_iface.c: random in the range, redrawn while
# taken; intersected with the pod's ip_local_port_range, 32768-60999 by default, so it lies inside).
# Unset, the kernel picks any ephemeral port and no NetworkPolicy could name it.
UCX_TCP_PORTS = (40000, 40999)


def transfer_json(config: dict[str, Any]) -> str:
    """A transfer config as vLLM receives it: compact and key-sorted, so equal configs hash equally."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def ucx_tcp_port_range() -> str:
    """`UCX_TCP_PORT_RANGE` as UCX parses it (`first-last`)."""
    return f"{UCX_TCP_PORTS[0]}-{UCX_TCP_PORTS[1]}"


def env_value(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def container_port(name: str, port: int) -> dict[str, Any]:
    return {"name": name, "containerPort": port, "protocol": "TCP"}


# ----------------------------------------------------------------------------- roles


def ec_consumer_role(spec: EPDDeploymentSpec) -> str:
    """The tier that consumes the encoder's embeddings: P in E/P/D, the combined PD tier in E+PD."""
    return PREFILL if spec.prefill is not None else DECODE


def ec_role(spec: EPDDeploymentSpec, role: VllmRole) -> str | None:
    if role == ENCODER:
        return "ec_producer"
    if role == ec_consumer_role(spec):
        return "ec_consumer"
    return None


def kv_transfer(spec: EPDDeploymentSpec) -> KVTransfer | None:
    """KV transfer between P and D; NIXL by default whenever a prefill tier exists."""
    if spec.prefill is None:
        return None
    return spec.kvTransfer or KVTransfer()


def kv_role(spec: EPDDeploymentSpec, role: VllmRole) -> str | None:
    if kv_transfer(spec) is None:
        return None
    return {PREFILL: "kv_producer", DECODE: "kv_consumer"}.get(role)


# ----------------------------------------------------------------------------- configs


def ec_transfer_config(spec: EPDDeploymentSpec, role: VllmRole) -> dict[str, Any] | None:
    """The `--ec-transfer-config` of a tier, or None for a tier without an EC role (D in E/P/D)."""
    ec_role_ = ec_role(spec, role)
    if ec_role_ is None:
        return None
    ec = spec.ecTransfer
    config: dict[str, Any] = {"ec_connector": EC_CONNECTORS[ec.connector], "ec_role": ec_role_}
    if ec.connector == "SharedStorage":
        assert ec.sharedStorage is not None  # guaranteed by the API rules
        extra: dict[str, Any] = {"shared_storage_path": ec.sharedStorage.path}
    elif ec.connector == "Mooncake":
        mooncake = ec.mooncake or Mooncake()
        extra = {"mooncake_protocol": mooncake.protocol}
        if ec_role_ == "ec_consumer":
            # The consumer binds and advertises this address; producers push to it.
            config["ec_ip"] = POD_IP
            config["ec_port"] = mooncake.ecPort
        elif mooncake.crossEncoderCache:
            extra["cross_encoder_cache"] = True  # vLLM accepts it on encode-only producers only
    else:
        assert ec.cpu is not None  # guaranteed by the API rules
        extra = {"ec_cpu_bytes": quantity_bytes(ec.cpu.bytes), "ec_enable_nixl": ec.cpu.nixl}
    config["ec_connector_extra_config"] = extra
    return config


def kv_transfer_config(spec: EPDDeploymentSpec, role: VllmRole) -> dict[str, Any] | None:
    kv = kv_transfer(spec)
    kv_role_ = kv_role(spec, role)
    if kv is None or kv_role_ is None:
        return None
    config: dict[str, Any] = {"kv_connector": KV_CONNECTORS[kv.connector], "kv_role": kv_role_}
    if kv.nixl.bufferDevice:
        config["kv_buffer_device"] = kv.nixl.bufferDevice
    return config


def mooncake_store_config(epd: EPDDeployment) -> dict[str, Any] | None:
    """The `MOONCAKE_CONFIG_PATH` file of the cross-encoder cache, or None when it is not asked for."""
    mooncake = epd.spec.ecTransfer.mooncake
    if epd.spec.ecTransfer.connector != "Mooncake" or mooncake is None or not mooncake.crossEncoderCache:
        return None
    master = f"{object_name(epd, MOONCAKE_MASTER)}.{epd.namespace}.svc:{MOONCAKE_MASTER_RPC_PORT}"
    return {
        "metadata_server": "P2PHANDSHAKE",
        "master_server_address": master,
        "protocol": mooncake.protocol,
        "device_name": "",
        "mode": "embedded",
        "global_segment_size": MOONCAKE_SEGMENT_BYTES,
        "local_buffer_size": MOONCAKE_SEGMENT_BYTES,
    }


def configmap_data(epd: EPDDeployment, roles: list[VllmRole]) -> dict[str, str]:
    """What the `{name}-transfer` ConfigMap holds: every generated transfer config, by tier.

    The EC/KV configs reach vLLM as arguments; their copies here let `kubectl get cm` show what each
    tier was given. The Mooncake store config is mounted as a file (vLLM reads it from a path).
    """
    data: dict[str, str] = {}
    for role in roles:
        ec = ec_transfer_config(epd.spec, role)
        if ec is not None:
            data[f"{role}.ec-transfer.json"] = transfer_json(ec)
        kv = kv_transfer_config(epd.spec, role)
        if kv is not None:
            data[f"{role}.kv-transfer.json"] = transfer_json(kv)
    store = mooncake_store_config(epd)
    if store is not None:
        data[MOONCAKE_STORE_KEY] = transfer_json(store)
    return data


def cache_ttl_seconds(storage: SharedStorage) -> int:
    """The janitor's TTL: the spec's, or the API default when it was cleared (the janitor needs one:
    it is also the guaranteed lifetime of an entry a consumer may still be about to read)."""
    return storage.ttlSeconds or SharedStorage.model_fields["ttlSeconds"].default


def janitor_args(storage: SharedStorage) -> list[str]:
    """`epdctl janitor` arguments bounding the shared cache by age and, when given, by size."""
    args = ["--path", storage.path, "--ttl-seconds", str(cache_ttl_seconds(storage))]
    if storage.maxSize is not None:
        args += ["--max-size", str(quantity_bytes(storage.maxSize))]
    return args + ["--interval", str(JANITOR_INTERVAL_SECONDS)]


# ----------------------------------------------------------------------------- pod pieces


@dataclass
class TierTransfer:
    """What the transfer connectors add to one vLLM tier's pod."""

    args: list[str] = field(default_factory=list)
    env: list[dict[str, Any]] = field(default_factory=list)
    ports: list[dict[str, Any]] = field(default_factory=list)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    configmap_keys: list[str] = field(default_factory=list)  # keys of `{name}-transfer` its pods read
    shm_bytes: int = 0  # the least /dev/shm the connector needs
    service_ports: list[dict[str, Any]] = field(default_factory=list)  # on the tier's Service, for the router
    add_capabilities: list[str] = field(default_factory=list)


def tier_transfer(epd: EPDDeployment, role: VllmRole) -> TierTransfer:
    spec = epd.spec
    out = TierTransfer()
    ec = ec_transfer_config(spec, role)
    if ec is not None:
        _add_ec_connector(epd, role, out)
        out.args += ["--ec-transfer-config", transfer_json(ec)]
    kv = kv_transfer_config(spec, role)
    if kv is not None:
        out.args += ["--kv-transfer-config", transfer_json(kv)]
        _add_nixl(spec, out, data_parallel_size(epd, role))
    return out


def _add_ec_connector(epd: EPDDeployment, role: VllmRole, out: TierTransfer) -> None:
    ec = epd.spec.ecTransfer
    producer = role == ENCODER
    if ec.connector == "SharedStorage":
        assert ec.sharedStorage is not None
        out.volumes.append(
            {"name": EC_CACHE_VOLUME, "persistentVolumeClaim": {"claimName": ec.sharedStorage.claimName}}
        )
        out.mounts.append({"name": EC_CACHE_VOLUME, "mountPath": ec.sharedStorage.path})
    elif ec.connector == "Mooncake":
        _add_mooncake(epd, role, producer, out)
    else:
        assert ec.cpu is not None
        out.env.append(env_value("VLLM_USE_V2_MODEL_RUNNER", "1"))  # ECCPUConnector runs on Model Runner V2 only
        if producer:
            out.env += [
                env_value("VLLM_EC_SIDE_CHANNEL_HOST", POD_IP),
                env_value("VLLM_EC_SIDE_CHANNEL_PORT", str(ec.cpu.sideChannelPort)),
            ]
            out.ports.append(container_port("ec-side", ec.cpu.sideChannelPort))
        if ec.cpu.nixl:
            out.env.append(env_value("UCX_TCP_PORT_RANGE", ucx_tcp_port_range()))
        # The connector's region is an mmap under /dev/shm.
        out.shm_bytes = quantity_bytes(ec.cpu.bytes)


def _add_mooncake(epd: EPDDeployment, role: VllmRole, producer: bool, out: TierTransfer) -> None:
    mooncake = epd.spec.ecTransfer.mooncake or Mooncake()
    if mooncake.protocol == "tcp":
        out.env.append(env_value("MC_FORCE_TCP", "1"))
    else:
        out.add_capabilities.append("IPC_LOCK")  # RDMA pins its registered memory
    if producer:
        # The producer's transfer engine advertises this address to the consumers.
        out.env.append(env_value("VLLM_HOST_IP", POD_IP))
        if mooncake.crossEncoderCache:
            out.args += ["--mm-processor-cache-gb", str(MM_PROCESSOR_CACHE_GB)]
            out.env += [
                env_value("VLLM_USE_V2_MODEL_RUNNER", "1"),
                env_value("MOONCAKE_CONFIG_PATH", f"{MOONCAKE_STORE_DIR}/{MOONCAKE_STORE_KEY}"),
            ]
            out.volumes.append(
                {
                    "name": "mooncake-store",
                    "configMap": {
                        "name": transfer_configmap_name(epd),
                        "items": [{"key": MOONCAKE_STORE_KEY, "path": MOONCAKE_STORE_KEY}],
                    },
                }
            )
            out.mounts.append({"name": "mooncake-store", "mountPath": MOONCAKE_STORE_DIR, "readOnly": True})
            out.configmap_keys.append(MOONCAKE_STORE_KEY)
    else:
        out.ports += [
            container_port(f"mooncake-{i}", port) for i, port in enumerate(mooncake_consumer_ports(epd, role))
        ]
        # The router reads each DP rank's control address (its TP rank 0 port) from the EndpointSlices.
        tp = tier_of(epd, role).tensorParallelSize
        out.service_ports += [
            {
                "name": f"{EC_RANK_PORT_PREFIX}{d}",
                "port": mooncake.ecPort + d * tp,
                "targetPort": f"mooncake-{d * tp}",
                "protocol": "TCP",
            }
            for d in range(data_parallel_size(epd, role))
        ]


def data_parallel_size(epd: EPDDeployment, role: VllmRole) -> int:
    return getattr(tier_of(epd, role), "dataParallelSize", 1)


def mooncake_consumer_ports(epd: EPDDeployment, role: VllmRole) -> list[int]:
    """The control ports of a Mooncake EC consumer pod: DP rank d, TP rank r listens on ec_port + d*TP + r
    (vLLM 0.32 mooncake/config.py), so rank d's first port is the address the router hands the encoder."""
    mooncake = epd.spec.ecTransfer.mooncake or Mooncake()
    tp = tier_of(epd, role).tensorParallelSize
    return [mooncake.ecPort + rank for rank in range(data_parallel_size(epd, role) * tp)]


def _add_nixl(spec: EPDDeploymentSpec, out: TierTransfer, dp: int) -> None:
    kv = kv_transfer(spec)
    assert kv is not None
    nixl = kv.nixl
    out.env += [
        env_value("VLLM_NIXL_SIDE_CHANNEL_HOST", POD_IP),
        env_value("VLLM_NIXL_SIDE_CHANNEL_PORT", str(nixl.sideChannelPort)),
        env_value("UCX_TLS", nixl.ucxTls),
        env_value("UCX_NET_DEVICES", nixl.ucxNetDevices),
    ]
    if not any(e["name"] == "UCX_TCP_PORT_RANGE" for e in out.env):  # the CPU EC connector may have set it
        out.env.append(env_value("UCX_TCP_PORT_RANGE", ucx_tcp_port_range()))
    # Each DP engine's side channel listens on the base port plus its DP index.
    out.ports += [container_port("nixl" if d == 0 else f"nixl-{d}", nixl.sideChannelPort + d) for d in range(dp)]


# ----------------------------------------------------------------------------- connections between tiers

PortRange = tuple[int, int]  # first and last TCP port, inclusive
# Every TCP port but vLLM's API port, for connectors that listen on ports picked at run time.
ALL_BUT_API: tuple[PortRange, ...] = ((1, VLLM_PORT - 1), (VLLM_PORT + 1, 65535))


@dataclass(frozen=True)
class TransferIngress:
    """Connections one backend role's pods accept from other backend pods of the deployment: from
    `sources` (roles), on `ports` (transfer_ingress says why each). The NetworkPolicies admit exactly these."""

    role: str
    sources: tuple[str, ...]
    ports: tuple[PortRange, ...]


def _single(port: int) -> PortRange:
    return (port, port)


def transfer_ingress(epd: EPDDeployment) -> list[TransferIngress]:
    """Every connection between the deployment's backend pods its connectors and multi-node groups open,
    from the same settings the pods' args and env are rendered from:

    - NIXL (KV, E/P/D): prefill and decode reach each other on the side channel (one port per DP rank;
      vLLM's pull mode has decode dial prefill, its push mode the reverse) and on UCX's TCP ports (UCX
      wires an endpoint up from both ends);
    - the CPU EC connector: the consumer dials the encoder's EC side channel; with NIXL, UCX's TCP ports
      both ways;
    - Mooncake (EC): the encoder and the consumer reach each other on every port but the API port: the
      consumer's control port is named (`ecPort`), but vLLM binds its event socket on a port the kernel
      picks and Mooncake's transfer engine picks its handshake and data ports itself. With the
      cross-encoder cache the encoders also read each other's store segments (the same, among encoders)
      and call the master's RPC port;
    - a multi-node group: its pods reach each other on every port but the API port (the rendezvous at
      the leader's `MULTI_NODE_MASTER_PORT`, then torch's and NCCL's collectives on ports they pick).

    SharedStorage moves embeddings through a volume: no connection.
    """
    spec = epd.spec
    out: list[TransferIngress] = []
    kv = kv_transfer(spec)
    if kv is not None:
        pairs: tuple[tuple[VllmRole, VllmRole], ...] = ((PREFILL, DECODE), (DECODE, PREFILL))
        for role, peer in pairs:
            side = kv.nixl.sideChannelPort
            ports = (*(_single(side + d) for d in range(data_parallel_size(epd, role))), UCX_TCP_PORTS)
            out.append(TransferIngress(role, (peer,), ports))  # NIXL KV transfer: side channel and UCX over TCP
    consumer = ec_consumer_role(spec)
    ec = spec.ecTransfer
    if ec.connector == "CPU":
        assert ec.cpu is not None
        ucx = (UCX_TCP_PORTS,) if ec.cpu.nixl else ()
        out.append(TransferIngress(ENCODER, (consumer,), (_single(ec.cpu.sideChannelPort), *ucx)))  # CPU EC connector
        if ucx:
            out.append(TransferIngress(consumer, (ENCODER,), ucx))  # CPU EC connector: UCX over TCP
    elif ec.connector == "Mooncake":
        out += [
            TransferIngress(consumer, (ENCODER,), ALL_BUT_API),  # Mooncake EC: control, events, transfer engine
            TransferIngress(ENCODER, (consumer,), ALL_BUT_API),  # Mooncake EC: transfer engine handshake
        ]
        if mooncake_store_config(epd) is not None:
            out += [
                TransferIngress(ENCODER, (ENCODER,), ALL_BUT_API),  # Mooncake store: segments among encoders
                TransferIngress(MOONCAKE_MASTER, (ENCODER,), (_single(MOONCAKE_MASTER_RPC_PORT),)),  # the master's RPC
            ]
    for role in vllm_roles(epd):
        tier = tier_of(epd, role)
        if isinstance(tier, ConsumerTier) and tier.nodesPerReplica > 1:
            out.append(TransferIngress(role, (role,), ALL_BUT_API))  # multi-node group: rendezvous and collectives
    return out
