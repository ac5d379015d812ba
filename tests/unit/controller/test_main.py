"""`epd-operator` command line: scope, ports and leader-election flags, with clear refusals."""

from __future__ import annotations

import pytest

from epd_operator.controller.main import parse_args


def test_namespaces_repeat_and_the_defaults_match_the_chart():
    options = parse_args(["--namespace", "a", "-n", "b"])
    assert options.namespaces == ["a", "b"] and not options.all_namespaces
    assert (options.liveness_port, options.metrics_port) == (8080, 9090)
    assert options.leader_election and options.leader_election_id == "epd-operator"


def test_router_image_from_flag_else_environment_else_the_release_default(monkeypatch):
    from epd_operator.api.router import DEFAULT_ROUTER_IMAGE

    monkeypatch.delenv("EPD_ROUTER_IMAGE", raising=False)
    assert parse_args(["-A"]).router_image == DEFAULT_ROUTER_IMAGE
    monkeypatch.setenv("EPD_ROUTER_IMAGE", "registry.local/epd:env")
    assert parse_args(["-A"]).router_image == "registry.local/epd:env"
    assert parse_args(["-A", "--router-image", "registry.local/epd:flag"]).router_image == "registry.local/epd:flag"


def test_all_namespaces():
    options = parse_args(["--all-namespaces", "--no-leader-election", "--resync-seconds", "30"])
    assert options.all_namespaces and options.namespaces == [] and not options.leader_election
    assert options.resync_seconds == 30


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "one of the arguments -n/--namespace -A/--all-namespaces is required"),
        (["-n", "a", "-A"], "not allowed with argument"),
        (["-n", " "], "--namespace needs a non-empty name"),
        (["-A", "--resync-seconds", "0"], "--resync-seconds must be positive"),
        (["-A", "--lease-duration", "-1"], "--lease-duration must be positive"),
        (["-A", "--liveness-port", "http"], "invalid int value"),
    ],
)
def test_bad_flags_are_refused_with_the_reason(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
