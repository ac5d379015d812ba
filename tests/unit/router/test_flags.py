"""router/flags.py: every `RouterConfig` field has its flag, each flag's value reaches its field parsed, and
with no flags the config is `RouterConfig`'s defaults (the parser takes its defaults from there)."""

from __future__ import annotations

import dataclasses

import pytest

from epd_operator import __version__
from epd_operator.router.config import RouterConfig
from epd_operator.router.flags import build_parser, config_from_args

# (flags, field, value): a value other than the field's default for every field of RouterConfig.
EVERY_FIELD = [
    (["--host", "127.0.0.1"], "host", "127.0.0.1"),
    (["--port", "9001"], "port", 9001),
    (["--metrics-port", "9090"], "metrics_port", 9090),
    (["--encode-servers-urls", "http://e1:8000, e2:8000"], "encode_urls", ["http://e1:8000", "http://e2:8000"]),
    (["--prefill-servers-urls", "p:8000"], "prefill_urls", ["http://p:8000"]),
    (["--decode-servers-urls", "d1:8000,d2:8000"], "decode_urls", ["http://d1:8000", "http://d2:8000"]),
    (["--discovery", "kubernetes"], "discovery", "kubernetes"),
    (["--namespace", "tenant-a"], "namespace", "tenant-a"),
    (["--deployment", "qwen"], "deployment", "qwen"),
    (["--encoder-selector", "role=encoder"], "encoder_selector", "role=encoder"),
    (["--prefill-selector", "role=prefill"], "prefill_selector", "role=prefill"),
    (["--decode-selector", "role=decode"], "decode_selector", "role=decode"),
    (["--backend-port-name", "api"], "backend_port_name", "api"),
    (["--backend-port", "8100"], "backend_port", 8100),
    (["--kubeconfig", "/etc/kube.yaml"], "kubeconfig", "/etc/kube.yaml"),
    (["--encoder-policy", "least-loaded"], "encoder_policy", "least-loaded"),
    (["--pd-policy", "prefix-aware"], "pd_policy", "prefix-aware"),
    (["--load-factor", "1.5"], "load_factor", 1.5),
    (["--prefix-chars", "64"], "prefix_chars", 64),
    (["--encoder-max-batch", "4"], "encoder_max_batch", 4),
    (["--spill-encoder-inflight", "8"], "spill_encoder_inflight", 8),
    (["--spill-consumer-inflight", "3"], "spill_consumer_inflight", 3),
    (["--demand-window", "30"], "demand_window", 30),
    (["--connect-timeout", "1.5"], "connect_timeout", 1.5),
    (["--encode-timeout", "7"], "encode_timeout", 7.0),
    (["--prefill-timeout", "8"], "prefill_timeout", 8.0),
    (["--decode-timeout", "9"], "decode_timeout", 9.0),
    (["--max-body-bytes", "1024"], "max_body_bytes", 1024),
    (["--allow-file-urls"], "allow_file_urls", True),
    (["--header-timeout", "2"], "header_timeout", 2.0),
    (["--body-timeout", "3"], "body_timeout", 3.0),
    (["--keepalive-timeout", "4"], "keepalive_timeout", 4.0),
    (["--send-timeout", "5"], "send_timeout", 5.0),
    (["--allow-client-embeds"], "allow_client_embeds", True),
    (["--trust-client-uuids"], "trust_client_uuids", True),
    (["--immutable-media-urls"], "immutable_media_urls", True),
    (["--reuse-ttl", "60"], "reuse_ttl", 60.0),
    (["--reuse-max-items", "10"], "reuse_max_items", 10),
    (["--reuse-mode", "metadata"], "reuse_mode", "metadata"),
    (["--rewrite", "pinned"], "rewrite", "pinned"),
    (["--ec-consumer-zmq-addrs", " tcp://a:1 ,tcp://b:1,"], "ec_consumer_zmq_addrs", ["tcp://a:1", "tcp://b:1"]),
    (["--ec-consumer-port", "14579"], "ec_consumer_port", 14579),
    (["--prefill-dp-size", "2"], "prefill_dp_size", 2),
    (["--decode-dp-size", "3"], "decode_dp_size", 3),
    (["--ec-consumer-tp-size", "4"], "ec_consumer_tp_size", 4),
    (["--health-interval", "0.5"], "health_interval", 0.5),
    (["--health-timeout", "0.25"], "health_timeout", 0.25),
    (["--eject-after", "5"], "eject_after", 5),
    (["--workers", "2"], "workers", 2),
    (["--drain-timeout", "12"], "drain_timeout", 12.0),
    (["--log-requests"], "log_requests", True),
    (
        ["--otlp-traces-endpoint", "http://collector:4318/v1/traces"],
        "otlp_traces_endpoint",
        "http://collector:4318/v1/traces",
    ),
    (["--trace-sample-ratio", "0.1"], "trace_sample_ratio", 0.1),
]


def test_the_table_names_every_config_field_with_a_value_other_than_its_default():
    defaults = RouterConfig()
    assert sorted(field for _, field, _ in EVERY_FIELD) == sorted(f.name for f in dataclasses.fields(RouterConfig))
    assert all(getattr(defaults, field) != value for _, field, value in EVERY_FIELD)


def test_every_flag_reaches_its_config_field_parsed(monkeypatch):
    """All flags at once (no single config is valid with every one of them: the check is left out here and
    tested with the refusals in test_main.py and test_config.py)."""
    monkeypatch.setattr(RouterConfig, "validate", lambda self: None)
    cfg = config_from_args(build_parser().parse_args([flag for flags, _, _ in EVERY_FIELD for flag in flags]))
    got = {field: getattr(cfg, field) for _, field, _ in EVERY_FIELD}
    assert got == {field: value for _, field, value in EVERY_FIELD}
    assert all(type(got[field]) is type(value) for _, field, value in EVERY_FIELD)


def test_without_flags_the_config_is_router_configs_defaults():
    assert config_from_args(build_parser().parse_args(["--decode-servers-urls", "d:8000"])) == RouterConfig(
        decode_urls=["http://d:8000"]
    )


@pytest.mark.parametrize("value", ["none", "disable", "", " None "])
def test_prefill_values_that_name_no_prefill_tier_mean_e_pd(value):
    argv = ["--prefill-servers-urls", value, "--decode-servers-urls", "d:8000"]
    assert config_from_args(build_parser().parse_args(argv)).prefill_urls is None


@pytest.mark.parametrize(
    ("tier", "field"), [(["--prefill-servers-urls", "p:8000"], "prefill_dp_size"), ([], "decode_dp_size")]
)
def test_vllms_ec_consumer_dp_size_names_the_ec_consumer_tier(tier, field):
    """The EC consumer is prefill in E/P/D and the PD tier in E+PD; the other tier keeps its own DP size."""
    argv = [*tier, "--decode-servers-urls", "d:8000", "--ec-consumer-dp-size", "4"]
    cfg = config_from_args(build_parser().parse_args(argv))
    assert getattr(cfg, field) == 4
    assert (cfg.prefill_dp_size, cfg.decode_dp_size).count(1) == 1


def test_the_encoder_batch_default_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("ENCODER_MAX_BATCH_SIZE", "6")
    assert build_parser().parse_args([]).encoder_max_batch == 6


def test_version_and_help_name_the_command(capsys):
    parser = build_parser()
    with pytest.raises(SystemExit) as done:
        parser.parse_args(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"epd-router {__version__}\n"
    assert parser.format_help().startswith("usage: epd-router ")
    assert "\n\nEndpoint-picker router for vLLM Encoder/Prefill/Decode serving.\n\n" in parser.format_help()
    for flag in ("--encode-servers-urls", "--prefill-servers-urls", "--decode-servers-urls"):
        assert f"{flag} URLS" in parser.format_help()
    assert "--ec-consumer-zmq-addrs ADDRS" in parser.format_help()
