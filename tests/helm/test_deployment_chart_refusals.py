"""The epd-deployment chart repeats none of the EPDDeployment API's rules: what it renders goes to the
real API server, which refuses a bad EPDDeployment with the rule's own message (generated from
`epd_operator.api.rules` into the CRD) and the field it concerns.

`helm install --dry-run=server` does not send the objects (helm 3 and 4 accept a bad name there),
so the refusals are shown by real installs and by `helm template | kubectl apply --dry-run=server`
(and `| epdctl validate -f -`, offline, from the same rules).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from epd_operator.api.rules import MAX_NAME_LENGTH, RULES
from tests.support.cluster import EPD_API, KubeView

from .charts import DEPLOYMENT_CHART, KUBE_VERSION, Helm

pytestmark = [pytest.mark.helm, pytest.mark.timeout(180)]


def message_of(field: str, word: str) -> str:
    (rule,) = [r for r in RULES if r.field == field and word in r.expression]
    return rule.message


NAME_TOO_LONG = message_of(".metadata.name", "size()")
NAME_NOT_DNS_1035 = message_of(".metadata.name", "matches(")
KV_WITHOUT_PREFILL = message_of(".kvTransfer", "has(self.prefill)")


def helm_in(helm: Helm, kube: KubeView, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm.binary), *args, "-n", kube.ns], capture_output=True, text=True, timeout=120, env=kube.env()
    )


def install(helm: Helm, kube: KubeView, release: str, *sets: str) -> subprocess.CompletedProcess[str]:
    set_args = [arg for item in sets for arg in ("--set", item)]
    return helm_in(helm, kube, "install", release, str(DEPLOYMENT_CHART), *set_args)


def epd_names(kube: KubeView) -> list[str]:
    return [o["metadata"]["name"] for o in kube.list(EPD_API, "EPDDeployment")]


def test_a_release_name_over_the_limit_is_refused_by_the_api_server_naming_the_field(helm: Helm, kube: KubeView):
    release = "n" * (MAX_NAME_LENGTH + 1)  # helm itself allows 53
    result = install(helm, kube, release)
    assert result.returncode != 0, result.stdout
    assert f'metadata.name: Invalid value: "{release}": {NAME_TOO_LONG}' in result.stderr, result.stderr
    assert epd_names(kube) == []
    # Helm records the refused install as a failed release; uninstalling it frees the name.
    assert helm_in(helm, kube, "uninstall", release).returncode == 0

    at_limit = "n" * MAX_NAME_LENGTH
    result = install(helm, kube, at_limit)
    assert result.returncode == 0, result.stderr
    assert epd_names(kube) == [at_limit]


def test_a_name_that_is_not_a_dns_1035_label_is_refused_naming_the_field(helm: Helm, kube: KubeView):
    # Helm accepts "1abc" as a release name (DNS-1123); the API's rule is the stricter DNS-1035.
    result = install(helm, kube, "1abc")
    assert result.returncode != 0, result.stdout
    assert f'metadata.name: Invalid value: "1abc": {NAME_NOT_DNS_1035}' in result.stderr, result.stderr
    assert epd_names(kube) == []


def test_kv_transfer_without_prefill_is_refused_by_the_api_server_naming_the_field(helm: Helm, kube: KubeView):
    result = install(helm, kube, "kv", "kvTransfer.connector=Nixl")
    assert result.returncode != 0, result.stdout
    assert f"spec.kvTransfer: Forbidden: {KV_WITHOUT_PREFILL}" in result.stderr, result.stderr
    assert epd_names(kube) == []

    assert install(helm, kube, "kv-epd", "kvTransfer.connector=Nixl", "prefill.replicas=1").returncode == 0
    assert epd_names(kube) == ["kv-epd"]


def test_a_rendered_chart_is_checked_before_install_with_a_server_side_dry_run(helm: Helm, kube: KubeView):
    """What docs/helm.md offers instead of the chart's own checks: nothing is created, no release recorded."""
    rendered = helm.run(
        "template",
        "kv",
        str(DEPLOYMENT_CHART),
        "-n",
        kube.ns,
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "kvTransfer.connector=Nixl",
    )
    assert rendered.returncode == 0, rendered.stderr
    (cr,) = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    assert cr["spec"]["kvTransfer"] == {"connector": "Nixl"} and "prefill" not in cr["spec"]
    result = kube.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered.stdout, check=False)
    assert result.returncode != 0
    assert f"spec.kvTransfer: Forbidden: {KV_WITHOUT_PREFILL}" in result.stderr, result.stderr
    assert epd_names(kube) == []


def test_a_rendered_chart_is_checked_offline_by_epdctl_with_the_same_rules(helm: Helm):
    release = "n" * (MAX_NAME_LENGTH + 1)
    rendered = helm.run(
        "template",
        release,
        str(DEPLOYMENT_CHART),
        "-n",
        "ml",
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "kvTransfer.connector=Nixl",
    )
    assert rendered.returncode == 0, rendered.stderr
    epdctl = Path(sys.executable).with_name("epdctl")
    result = subprocess.run(
        [str(epdctl), "validate", "-f", "-"], input=rendered.stdout, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"epdctl: -: EPDDeployment {release}: metadata.name: {NAME_TOO_LONG}",
        f"epdctl: -: EPDDeployment {release}: spec.kvTransfer: {KV_WITHOUT_PREFILL}",
    ]
