"""render/transfer: the EC and KV configs, env, ports, volumes and ConfigMap keys of every tier, for every
connector and both topologies, written out by hand from vLLM 0.32's connector docs and EPD examples
(examples/disaggregated/disaggregated_encoder/ in vLLM's repository) — not only for the examples' one
variant each."""

from __future__ import annotations

import json
from typing import Any

from epd_operator.api.transfer import SharedStorage
from epd_operator.render.naming import VllmRole
from epd_operator.render.transfer import (
    cache_ttl_seconds,
    configmap_data,
    ec_consumer_role,
    ec_role,
    ec_transfer_config,
    janitor_args,
    kv_role,
    kv_transfer_config,
    mooncake_consumer_ports,
    mooncake_store_config,
    tier_transfer,
    transfer_json,
)
from tests.support.epd_specs import epd


def present(config: dict[str, Any] | None) -> dict[str, Any]:
    assert config is not None, "no transfer config"
    return config


POD_IP = "$(POD_IP)"
E_P_D: dict[str, Any] = {"spec__prefill": {}}


def env(**pairs: str) -> list[dict]:
    return [{"name": k, "value": v} for k, v in pairs.items()]


def port(name: str, number: int) -> dict:
    return {"name": name, "containerPort": number, "protocol": "TCP"}


NIXL_ENV = env(
    VLLM_NIXL_SIDE_CHANNEL_HOST=POD_IP,
    VLLM_NIXL_SIDE_CHANNEL_PORT="5600",
    UCX_TLS="all",
    UCX_NET_DEVICES="all",
    UCX_TCP_PORT_RANGE="40000-40999",
)


def test_transfer_json_is_compact_and_sorted():
    assert transfer_json({"b": 1, "a": {"d": [1, 2], "c": None}}) == '{"a":{"c":null,"d":[1,2]},"b":1}'


def test_roles_by_topology():
    e_pd, e_p_d = epd().spec, epd(**E_P_D).spec
    assert (ec_consumer_role(e_pd), ec_consumer_role(e_p_d)) == ("decode", "prefill")
    assert [ec_role(e_pd, r) for r in ("encoder", "decode")] == ["ec_producer", "ec_consumer"]
    assert ec_role(e_pd, "router") is None  # type: ignore[arg-type]  # not a vLLM tier: no role
    assert [ec_role(e_p_d, r) for r in ("encoder", "prefill", "decode")] == ["ec_producer", "ec_consumer", None]
    assert [kv_role(e_pd, r) for r in ("encoder", "decode")] == [None, None]
    assert [kv_role(e_p_d, r) for r in ("encoder", "prefill", "decode")] == [None, "kv_producer", "kv_consumer"]


def test_shared_storage_e_pd():
    deployment = epd(
        spec__ecTransfer={"connector": "SharedStorage", "sharedStorage": {"claimName": "cache", "path": "/data/ec"}}
    )
    roles: list[tuple[VllmRole, str]] = [("encoder", "ec_producer"), ("decode", "ec_consumer")]
    for role, ec_role_ in roles:
        config = {
            "ec_connector": "ECExampleConnector",
            "ec_role": ec_role_,
            "ec_connector_extra_config": {"shared_storage_path": "/data/ec"},
        }
        assert ec_transfer_config(deployment.spec, role) == config
        assert kv_transfer_config(deployment.spec, role) is None
        t = tier_transfer(deployment, role)
        assert t.args == ["--ec-transfer-config", transfer_json(config)]
        assert t.volumes == [{"name": "ec-cache", "persistentVolumeClaim": {"claimName": "cache"}}]
        assert t.mounts == [{"name": "ec-cache", "mountPath": "/data/ec"}]
        assert (t.env, t.ports, t.configmap_keys, t.shm_bytes, t.add_capabilities) == ([], [], [], 0, [])


def test_e_p_d_decode_has_only_kv_and_prefill_both():
    deployment = epd(
        **E_P_D,
        spec__kvTransfer={
            "nixl": {"bufferDevice": "cpu", "ucxTls": "tcp", "ucxNetDevices": "eth0", "sideChannelPort": 7000}
        },
    )
    assert ec_transfer_config(deployment.spec, "decode") is None
    assert kv_transfer_config(deployment.spec, "prefill") == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_producer",
        "kv_buffer_device": "cpu",
    }
    decode = tier_transfer(deployment, "decode")
    assert decode.args == [
        "--kv-transfer-config",
        '{"kv_buffer_device":"cpu","kv_connector":"NixlConnector","kv_role":"kv_consumer"}',
    ]
    assert decode.env == env(
        VLLM_NIXL_SIDE_CHANNEL_HOST=POD_IP,
        VLLM_NIXL_SIDE_CHANNEL_PORT="7000",
        UCX_TLS="tcp",
        UCX_NET_DEVICES="eth0",
        UCX_TCP_PORT_RANGE="40000-40999",
    )
    assert decode.ports == [port("nixl", 7000)]
    assert (decode.volumes, decode.mounts) == ([], [])
    prefill = tier_transfer(deployment, "prefill")
    assert [a for a in prefill.args if a.startswith("--")] == ["--ec-transfer-config", "--kv-transfer-config"]
    assert prefill.mounts == [{"name": "ec-cache", "mountPath": "/ec-cache"}]
    assert tier_transfer(deployment, "encoder").env == []


def test_default_nixl_without_buffer_device():
    deployment = epd(**E_P_D)
    assert kv_transfer_config(deployment.spec, "decode") == {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}
    assert tier_transfer(deployment, "prefill").env == NIXL_ENV


def test_nixl_side_channel_port_per_data_parallel_rank():
    deployment = epd(**E_P_D, spec__decode={"dataParallelSize": 3})
    assert tier_transfer(deployment, "decode").ports == [port("nixl", 5600), port("nixl-1", 5601), port("nixl-2", 5602)]
    assert tier_transfer(deployment, "prefill").ports == [port("nixl", 5600)]


def test_mooncake_e_pd_tcp_without_store():
    deployment = epd(spec__ecTransfer={"connector": "Mooncake", "mooncake": {"ecPort": 20000}})
    producer = {
        "ec_connector": "ECMooncakeConnector",
        "ec_role": "ec_producer",
        "ec_connector_extra_config": {"mooncake_protocol": "tcp"},
    }
    consumer = {
        "ec_connector": "ECMooncakeConnector",
        "ec_role": "ec_consumer",
        "ec_ip": POD_IP,
        "ec_port": 20000,
        "ec_connector_extra_config": {"mooncake_protocol": "tcp"},
    }
    assert ec_transfer_config(deployment.spec, "encoder") == producer
    assert ec_transfer_config(deployment.spec, "decode") == consumer
    encoder = tier_transfer(deployment, "encoder")
    assert encoder.env == env(MC_FORCE_TCP="1", VLLM_HOST_IP=POD_IP)
    assert (encoder.ports, encoder.volumes, encoder.mounts, encoder.add_capabilities) == ([], [], [], [])
    assert encoder.args == ["--ec-transfer-config", transfer_json(producer)]
    decode = tier_transfer(deployment, "decode")
    assert decode.env == env(MC_FORCE_TCP="1")
    assert decode.ports == [port("mooncake-0", 20000)]
    assert mooncake_store_config(deployment) is None
    assert configmap_data(deployment, ["encoder", "decode"]) == {
        "encoder.ec-transfer.json": transfer_json(producer),
        "decode.ec-transfer.json": transfer_json(consumer),
    }


def test_mooncake_defaults_when_the_settings_are_absent():
    deployment = epd(spec__ecTransfer={"connector": "Mooncake"})
    assert present(ec_transfer_config(deployment.spec, "decode"))["ec_port"] == 14579
    assert tier_transfer(deployment, "decode").ports == [port("mooncake-0", 14579)]
    assert tier_transfer(deployment, "encoder").args[:1] == ["--ec-transfer-config"]
    assert mooncake_consumer_ports(deployment, "decode") == [14579]


def test_mooncake_rdma_locks_memory_instead_of_forcing_tcp():
    deployment = epd(spec__ecTransfer={"connector": "Mooncake", "mooncake": {"protocol": "rdma"}})
    for role in ("encoder", "decode"):
        t = tier_transfer(deployment, role)
        assert t.add_capabilities == ["IPC_LOCK"]
        assert {"name": "MC_FORCE_TCP", "value": "1"} not in t.env
        assert present(ec_transfer_config(deployment.spec, role))["ec_connector_extra_config"] == {
            "mooncake_protocol": "rdma"
        }


def test_mooncake_consumer_ports_per_data_parallel_and_tensor_parallel_rank():
    deployment = epd(
        spec__ecTransfer={"connector": "Mooncake", "mooncake": {"ecPort": 30000}},
        spec__prefill={"dataParallelSize": 2, "tensorParallelSize": 3},
    )
    assert mooncake_consumer_ports(deployment, "prefill") == [30000, 30001, 30002, 30003, 30004, 30005]
    assert [p["name"] for p in tier_transfer(deployment, "prefill").ports] == [
        "mooncake-0",
        "mooncake-1",
        "mooncake-2",
        "mooncake-3",
        "mooncake-4",
        "mooncake-5",
        "nixl",
        "nixl-1",
    ]
    assert [p["containerPort"] for p in tier_transfer(deployment, "prefill").ports] == [
        30000,
        30001,
        30002,
        30003,
        30004,
        30005,
        5600,
        5601,
    ]


def test_mooncake_cross_encoder_cache_on_the_producer():
    deployment = epd(
        **E_P_D,
        metadata={"name": "vl", "namespace": "team-a"},
        spec__ecTransfer={"connector": "Mooncake", "mooncake": {"crossEncoderCache": True, "protocol": "rdma"}},
    )
    producer = {
        "ec_connector": "ECMooncakeConnector",
        "ec_role": "ec_producer",
        "ec_connector_extra_config": {"mooncake_protocol": "rdma", "cross_encoder_cache": True},
    }
    assert ec_transfer_config(deployment.spec, "encoder") == producer
    # the consumer never gets cross_encoder_cache (vLLM refuses it there)
    assert present(ec_transfer_config(deployment.spec, "prefill"))["ec_connector_extra_config"] == {
        "mooncake_protocol": "rdma"
    }
    encoder = tier_transfer(deployment, "encoder")
    assert encoder.args == ["--mm-processor-cache-gb", "4", "--ec-transfer-config", transfer_json(producer)]
    assert encoder.env == env(
        VLLM_HOST_IP=POD_IP, VLLM_USE_V2_MODEL_RUNNER="1", MOONCAKE_CONFIG_PATH="/etc/epd/mooncake/mooncake-store.json"
    )
    assert encoder.volumes == [
        {
            "name": "mooncake-store",
            "configMap": {
                "name": "vl-transfer",
                "items": [{"key": "mooncake-store.json", "path": "mooncake-store.json"}],
            },
        }
    ]
    assert encoder.mounts == [{"name": "mooncake-store", "mountPath": "/etc/epd/mooncake", "readOnly": True}]
    assert encoder.configmap_keys == ["mooncake-store.json"]
    store = {
        "metadata_server": "P2PHANDSHAKE",
        "master_server_address": "vl-mooncake-master.team-a.svc:50051",
        "protocol": "rdma",
        "device_name": "",
        "mode": "embedded",
        "global_segment_size": 4294967296,
        "local_buffer_size": 4294967296,
    }
    assert mooncake_store_config(deployment) == store
    data = configmap_data(deployment, ["encoder", "prefill", "decode"])
    assert list(data) == [
        "encoder.ec-transfer.json",
        "prefill.ec-transfer.json",
        "prefill.kv-transfer.json",
        "decode.kv-transfer.json",
        "mooncake-store.json",
    ]
    assert json.loads(data["mooncake-store.json"]) == store


def test_no_store_for_other_connectors_even_with_mooncake_settings_absent():
    assert mooncake_store_config(epd()) is None
    assert mooncake_store_config(epd(spec__ecTransfer={"connector": "Mooncake", "mooncake": {}})) is None


def test_cpu_connector_producer_and_consumer():
    deployment = epd(
        spec__ecTransfer={"connector": "CPU", "cpu": {"bytes": "2Gi", "nixl": False, "sideChannelPort": 6000}}
    )
    assert ec_transfer_config(deployment.spec, "encoder") == {
        "ec_connector": "ECCPUConnector",
        "ec_role": "ec_producer",
        "ec_connector_extra_config": {"ec_cpu_bytes": 2147483648, "ec_enable_nixl": False},
    }
    encoder = tier_transfer(deployment, "encoder")
    assert encoder.env == env(
        VLLM_USE_V2_MODEL_RUNNER="1", VLLM_EC_SIDE_CHANNEL_HOST=POD_IP, VLLM_EC_SIDE_CHANNEL_PORT="6000"
    )
    assert encoder.ports == [port("ec-side", 6000)]
    assert encoder.shm_bytes == 2147483648
    decode = tier_transfer(deployment, "decode")
    assert decode.env == env(VLLM_USE_V2_MODEL_RUNNER="1")
    assert (decode.ports, decode.shm_bytes, decode.volumes) == ([], 2147483648, [])
    default = epd(spec__ecTransfer={"connector": "CPU", "cpu": {"bytes": "1G"}})
    assert present(ec_transfer_config(default.spec, "decode"))["ec_connector_extra_config"] == {
        "ec_cpu_bytes": 1000000000,
        "ec_enable_nixl": True,
    }
    assert tier_transfer(default, "encoder").ports == [port("ec-side", 5601)]
    # With NIXL, UCX's TCP transport listens where the NetworkPolicies admit it, on both ends.
    for role in ("encoder", "decode"):
        assert {"name": "UCX_TCP_PORT_RANGE", "value": "40000-40999"} in tier_transfer(default, role).env


def test_ucx_tcp_port_range_is_set_once_where_the_cpu_connector_and_nixl_meet():
    deployment = epd(**E_P_D, spec__ecTransfer={"connector": "CPU", "cpu": {"bytes": "1G"}})
    names = [e["name"] for e in tier_transfer(deployment, "prefill").env]
    assert names.count("UCX_TCP_PORT_RANGE") == 1


def test_janitor_bounds_by_age_and_size():
    assert janitor_args(SharedStorage(claimName="c")) == [
        "--path",
        "/ec-cache",
        "--ttl-seconds",
        "600",
        "--interval",
        "30",
    ]
    assert janitor_args(SharedStorage(claimName="c", path="/x", ttlSeconds=60, maxSize="1Ki")) == [
        "--path",
        "/x",
        "--ttl-seconds",
        "60",
        "--max-size",
        "1024",
        "--interval",
        "30",
    ]
    assert cache_ttl_seconds(SharedStorage(claimName="c", ttlSeconds=None)) == 600
    assert cache_ttl_seconds(SharedStorage(claimName="c", ttlSeconds=5)) == 5


def test_e_p_d_mooncake_prefill_has_both_connectors_env_and_every_config_in_the_configmap():
    deployment = epd(spec__prefill={}, spec__ecTransfer={"connector": "Mooncake"})
    assert tier_transfer(deployment, "prefill").env == env(MC_FORCE_TCP="1") + NIXL_ENV
    assert configmap_data(deployment, ["encoder", "prefill", "decode"]) == {
        "encoder.ec-transfer.json": '{"ec_connector":"ECMooncakeConnector","ec_connector_extra_config":'
        '{"mooncake_protocol":"tcp"},"ec_role":"ec_producer"}',
        "prefill.ec-transfer.json": '{"ec_connector":"ECMooncakeConnector","ec_connector_extra_config":'
        '{"mooncake_protocol":"tcp"},"ec_ip":"$(POD_IP)","ec_port":14579,'
        '"ec_role":"ec_consumer"}',
        "prefill.kv-transfer.json": '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}',
        "decode.kv-transfer.json": '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}',
    }
    assert mooncake_store_config(deployment) is None  # Mooncake without its settings: no store
