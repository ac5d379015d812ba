"""How an `EPDDeployment`'s tiers move data: the encoder cache (EC) connector that carries embeddings to the
consumers, and the KV connector that carries prefill's KV cache to decode in E/P/D."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .fields import MAX_LIST_ITEMS, Affinity, Resources, Strict, Toleration
from .quantity import Quantity


class SharedStorage(Strict):
    claimName: str = Field(min_length=1, description="ReadWriteMany PVC mounted by the encoder and every consumer.")
    path: str = Field(
        "/ec-cache", pattern=r"^/.*", max_length=4096, description="Mount path; the connector's `shared_storage_path`."
    )
    maxSize: Quantity | None = Field(
        None,
        description="Size bound for the cache janitor: while the cache is larger, it deletes the oldest entries "
        "older than `ttlSeconds` (never younger ones). Absent: entries go when older than `ttlSeconds`.",
    )
    ttlSeconds: int | None = Field(
        600,
        ge=1,
        description="Guaranteed minimum lifetime of a cached embedding (age counts from its last write): "
        "no entry younger is deleted. Without `maxSize`, older entries are deleted.",
    )


def _master_resources() -> Resources:
    return Resources(requests={"cpu": "500m", "memory": "1Gi"}, limits={"memory": "2Gi"})


class MooncakeMaster(Strict):
    """Where the Mooncake master runs (the cross-encoder cache's metadata service)."""

    resources: Resources = Field(
        default_factory=_master_resources,
        description="Master container resources; default: requests `cpu: 500m`, `memory: 1Gi`, limit `memory: 2Gi`.",
        json_schema_extra={"default": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}},
    )
    nodeSelector: dict[str, str] = Field(default_factory=dict, description="Pod nodeSelector.")
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=MAX_LIST_ITEMS, description="Pod tolerations."
    )
    affinity: Affinity | None = Field(None, description="Pod affinity.")
    priorityClassName: str | None = Field(None, min_length=1, description="Pod priorityClassName.")


class Mooncake(Strict):
    protocol: Literal["tcp", "rdma"] = Field(
        "tcp", description="`mooncake_protocol`; producer and consumers must match."
    )
    ecPort: int = Field(
        14579,
        ge=1024,
        le=65000,
        description="Consumer control port (`ec_port`): data-parallel rank d, "
        "tensor-parallel rank r of the EC consumer listens on ecPort + d x tensorParallelSize + r.",
    )
    crossEncoderCache: bool = Field(
        False, description="Share embeddings across encoders through a Mooncake store (adds a master)."
    )
    master: MooncakeMaster = Field(
        default_factory=MooncakeMaster,
        description="The Mooncake master's resources and placement (with `crossEncoderCache`).",
    )


class CPUConnector(Strict):
    bytes: Quantity = Field(description="`ec_cpu_bytes`: the shared-memory region; /dev/shm is sized to hold it.")
    nixl: bool = Field(True, description="`ec_enable_nixl`: consumers pull over NIXL.")
    sideChannelPort: int = Field(5601, ge=1024, le=65535, description="`VLLM_EC_SIDE_CHANNEL_PORT` on the encoder.")


class ECTransfer(Strict):
    connector: Literal["SharedStorage", "Mooncake", "CPU"] = Field(
        description="SharedStorage = ECExampleConnector, Mooncake = ECMooncakeConnector, CPU = ECCPUConnector."
    )
    sharedStorage: SharedStorage | None = Field(
        None, description="SharedStorage settings; required with that connector."
    )
    mooncake: Mooncake | None = Field(
        None, description="Mooncake settings; optional with that connector (defaults apply)."
    )
    cpu: CPUConnector | None = Field(None, description="CPU connector settings; required with that connector.")


class Nixl(Strict):
    ucxTls: str = Field("all", min_length=1, description="`UCX_TLS`.")
    ucxNetDevices: str = Field("all", min_length=1, description="`UCX_NET_DEVICES`.")
    sideChannelPort: int = Field(
        5600,
        ge=1024,
        le=65535,
        description="`VLLM_NIXL_SIDE_CHANNEL_PORT`; data-parallel "
        "rank d listens on sideChannelPort + d (all declared on the pod).",
    )
    bufferDevice: Literal["cuda", "cpu"] | None = Field(
        None, description="`kv_buffer_device`; default: the platform's."
    )


class KVTransfer(Strict):
    connector: Literal["Nixl"] = Field(
        "Nixl", description="P->D KV transfer; NixlConnector (what vLLM's EPD proxy drives)."
    )
    nixl: Nixl = Field(default_factory=Nixl, description="NixlConnector settings (UCX transports, side channel).")
