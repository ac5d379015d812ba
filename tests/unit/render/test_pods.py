"""render/pods.py, naming.py and templating.py: the pieces every tier's pods are made of."""

from __future__ import annotations

import pytest

from epd_operator.api.tiers import Placement
from epd_operator.render import templating
from epd_operator.render.naming import tier_of
from epd_operator.render.pods import bytes_quantity, config_hash, overlay_container, placement_env, resources
from tests.support.epd_specs import epd


@pytest.mark.parametrize(
    ("size", "quantity"),
    [(2 * 2**30, "2Gi"), (1536 * 2**20, "1536Mi"), (3 * 2**20, "3Mi"), (5 * 2**10, "5Ki"), (1000, "1000")],
)
def test_a_byte_count_is_written_in_the_largest_binary_unit_that_divides_it(size, quantity):
    assert bytes_quantity(size) == quantity


def test_the_config_hash_of_the_same_pods_never_changes_between_releases():
    """The hash is the pods' rollout trigger: a new digest for unchanged pods (say, from how non-ASCII text is
    encoded) would restart every vLLM pod when the operator is upgraded."""
    pod = {"containers": [{"name": "vllm", "args": ["--x", "ü"]}]}
    assert config_hash({"app": "é"}, pod, {"config.json": "ß"}) == "0bc12b29c940f6c0"


def placement(**fields) -> Placement:
    return Placement.model_validate(fields)


def test_the_tiers_settings_land_on_a_container_that_has_none_of_its_own():
    container = overlay_container(
        {"name": "vllm"},
        placement(
            env=[{"name": "A", "value": "1"}, {"name": "A", "value": "2"}],
            volumeMounts=[{"name": "models", "mountPath": "/models"}],
            securityContext={"runAsUser": 1000},
        ),
    )
    assert container == {
        "name": "vllm",
        "env": [{"name": "A", "value": "2"}],  # one entry per name: server-side apply refuses two
        "volumeMounts": [{"name": "models", "mountPath": "/models"}],
        "securityContext": {"runAsUser": 1000},
    }


def test_the_tiers_settings_join_the_containers_own():
    container = overlay_container(
        {
            "name": "vllm",
            "env": [{"name": "OURS", "value": "x"}, {"name": "KEPT", "value": "y"}],
            "volumeMounts": [{"name": "ec-cache", "mountPath": "/ec-cache"}],
            "securityContext": {"allowPrivilegeEscalation": False},
        },
        placement(
            env=[{"name": "OURS", "value": "user"}, {"name": "NEW", "value": "z"}],
            volumeMounts=[{"name": "models", "mountPath": "/models"}],
            securityContext={"runAsUser": 1000},
        ),
    )
    assert container["env"] == [
        {"name": "OURS", "value": "user"},  # replaced in place
        {"name": "KEPT", "value": "y"},
        {"name": "NEW", "value": "z"},
    ]
    assert container["volumeMounts"] == [
        {"name": "ec-cache", "mountPath": "/ec-cache"},
        {"name": "models", "mountPath": "/models"},
    ]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "runAsUser": 1000}


def test_env_and_resources_are_written_as_the_api_takes_them():
    tier = placement(
        env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
        resources={"limits": {"nvidia.com/gpu": 1, "memory": "8Gi"}},
    )
    assert placement_env(tier) == [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]
    assert resources(tier) == {"limits": {"nvidia.com/gpu": 1, "memory": "8Gi"}}  # no empty requests


def test_asking_for_a_tier_the_topology_lacks_names_both():
    deployment = epd()  # E+PD: no prefill tier
    with pytest.raises(ValueError) as refused:
        tier_of(deployment, "prefill")
    assert str(refused.value) == f"{deployment.name} has no prefill tier ({deployment.spec.topology})"


def test_templates_keep_non_ascii_text_as_written(tmp_path, monkeypatch):
    monkeypatch.setattr(templating, "TEMPLATE_DIR", tmp_path)
    templating._environment.cache_clear()
    try:
        (tmp_path / "one.yaml.j2").write_text("value: {{ value | json }}\n")
        (tmp_path / "two.yaml.j2").write_text("a: 1\n---\nb: 2\n")
        assert templating._json({"k": "é"}) == '{"k": "é"}'
        assert templating.render_one("one.yaml.j2", value="é") == {"value": "é"}
        with pytest.raises(AssertionError) as refused:
            templating.render_one("two.yaml.j2")
        assert str(refused.value) == "template two.yaml.j2 rendered 2 documents, expected one"
    finally:
        templating._environment.cache_clear()
