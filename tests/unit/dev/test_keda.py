"""How KEDA is wired on the local control plane (dev/parts/keda.py): its two processes' command lines, where
they run (the host, or a real node's network namespace), and the objects that register its metrics server
as the external metrics API."""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import pytest

from dev.cluster.api import readyz_argv
from dev.cluster.components import components_network
from dev.cluster.pki import cert_extensions
from dev.parts import keda

PORTS = keda.Ports(grpc=19666, health=19081, api=16443, metrics=18080, webhooks=19443, webhooks_health=19082)
CERTS = Path("/run/keda/certs")


def flags(argv: list[str]) -> dict[str, str]:
    return dict(arg.removeprefix("--").partition("=")[::2] for arg in argv[1:])


def test_the_metrics_server_dials_the_operators_grpc_service_with_the_same_certificates():
    operator = flags(keda.operator_argv(Path("/bin/keda"), CERTS, PORTS))
    server = flags(keda.metrics_server_argv(Path("/bin/keda-adapter"), CERTS, Path("/kc"), PORTS))
    assert server["metrics-service-address"] == operator["metrics-service-bind-address"] == "127.0.0.1:19666"
    # One folder holds ca.crt, tls.crt and tls.key for both ends of the mutual-TLS link.
    assert operator["cert-dir"] == server["cert-dir"] == str(CERTS)
    assert server["tls-cert-file"] == str(CERTS / "tls.crt")
    assert server["tls-private-key-file"] == str(CERTS / "tls.key")
    # Every port is this run's: nothing listens on KEDA's defaults, which another cluster's KEDA may hold.
    assert operator["health-probe-bind-address"] == "127.0.0.1:19081"
    assert (server["secure-port"], server["bind-address"], server["port"]) == ("16443", "127.0.0.1", "18080")
    assert operator["metrics-bind-address"] == "0"
    assert (operator["enable-cert-rotation"], operator["leader-elect"]) == ("false", "false")
    for kubeconfig in ("lister-kubeconfig", "authentication-kubeconfig", "authorization-kubeconfig"):
        assert server[kubeconfig] == "/kc"


def test_the_api_server_may_read_discovery_of_the_metrics_server_anonymously():
    server = flags(keda.metrics_server_argv(Path("/bin/keda-adapter"), CERTS, Path("/kc"), PORTS))
    allowed = server["authorization-always-allow-paths"].split(",")
    assert {"/apis/external.metrics.k8s.io", "/apis/external.metrics.k8s.io/v1beta1", "/openapi/v2"} <= set(allowed)


def test_keda_runs_as_in_its_own_namespace_watching_every_namespace():
    env = keda.environment(Path("/kc"))
    assert env == {
        "KUBECONFIG": "/kc",
        "POD_NAMESPACE": "keda",
        "KEDA_CLUSTER_OBJECT_NAMESPACE": "keda",
        "WATCH_NAMESPACE": "",
    }


def test_the_external_metrics_api_is_the_metrics_server_behind_its_service_trusted_through_the_cluster_ca():
    objects = {o["kind"]: o for o in keda.external_metrics_api(16443, b"CA PEM")}
    api = objects["APIService"]
    assert api["metadata"]["name"] == keda.API_SERVICE == "v1beta1.external.metrics.k8s.io"
    assert (api["spec"]["group"], api["spec"]["version"]) == ("external.metrics.k8s.io", "v1beta1")
    assert base64.b64decode(api["spec"]["caBundle"]) == b"CA PEM"
    assert "insecureSkipTLSVerify" not in api["spec"]
    service = objects["Service"]
    ref = api["spec"]["service"]
    assert (ref["namespace"], ref["name"], ref["port"]) == (
        service["metadata"]["namespace"],
        service["metadata"]["name"],
        16443,
    )
    assert objects["Namespace"]["metadata"]["name"] == ref["namespace"]
    # The API server dials the Service's external name and checks the certificate against its Service name.
    assert service["spec"] == {"type": "ExternalName", "externalName": "localhost"}
    assert f"{ref['name']}.{ref['namespace']}.svc" == keda.METRICS_SERVICE_DNS_NAME
    # The API server calls it as the anonymous user, who may read the group and nothing else.
    role, binding = objects["ClusterRole"], objects["ClusterRoleBinding"]
    assert role["rules"] == [{"apiGroups": ["external.metrics.k8s.io"], "resources": ["*"], "verbs": ["get", "list"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert [s["name"] for s in binding["subjects"]] == ["system:anonymous"]


def test_a_certificate_for_both_ends_of_a_link_may_serve_and_authenticate_a_client():
    serving = cert_extensions()
    assert "subjectAltName=IP:127.0.0.1,DNS:localhost\n" in serving
    assert "extendedKeyUsage=serverAuth\n" in serving
    both = cert_extensions((keda.METRICS_SERVICE_DNS_NAME,), client=True)
    assert "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:keda-metrics-apiserver.keda.svc\n" in both
    assert "extendedKeyUsage=serverAuth,clientAuth\n" in both


NODE_NETNS = ["nsenter", "--net=/proc/4242/ns/net", "--"]
BINARIES = {
    "keda": Path("/bin/keda"),
    "keda-adapter": Path("/bin/keda-adapter"),
    "keda-admission-webhooks": Path("/bin/keda-admission-webhooks"),
}


class NodeWithNetns:
    """What components_network reads of a real node: the prefix into its network namespace."""

    def netns_argv(self, *argv: str) -> list[str]:
        return [*NODE_NETNS, *argv]


def test_with_a_real_node_both_processes_run_in_its_network_namespace_and_find_each_other_there():
    enter = components_network([NodeWithNetns()])  # type: ignore[list-item]
    assert enter == NODE_NETNS
    argv = keda.processes(BINARIES, CERTS, Path("/kc"), PORTS, enter)
    for line in argv:
        assert line[: len(enter)] == enter
    operator, server, _ = (flags(line[len(enter) :]) for line in argv)
    assert argv.operator[len(enter)] == "/bin/keda" and argv.metrics_server[len(enter)] == "/bin/keda-adapter"
    # Both on the same loopback: the metrics server dials the operator there, the API server's egress
    # (the node bridge) dials the metrics server there, and a trigger's Prometheus there answers the operator.
    assert server["metrics-service-address"] == operator["metrics-service-bind-address"] == "127.0.0.1:19666"
    assert server["bind-address"] == "127.0.0.1"
    # Both log in with the cluster's kubeconfig: 127.0.0.1:<API port> answers in the node's namespace too.
    assert server["lister-kubeconfig"] == "/kc"


def test_without_a_real_node_both_processes_run_on_the_host_as_built():
    assert components_network([]) == []
    argv = keda.processes(BINARIES, CERTS, Path("/kc"), PORTS)
    assert argv.operator == keda.operator_argv(Path("/bin/keda"), CERTS, PORTS)
    assert argv.metrics_server == keda.metrics_server_argv(Path("/bin/keda-adapter"), CERTS, Path("/kc"), PORTS)
    assert argv.webhooks == keda.webhooks_argv(Path("/bin/keda-admission-webhooks"), CERTS, PORTS)


def test_the_webhooks_serve_with_the_same_certificates_on_this_runs_ports():
    hooks = flags(keda.webhooks_argv(Path("/bin/keda-admission-webhooks"), CERTS, PORTS))
    assert hooks == {
        "port": "19443",
        "cert-dir": str(CERTS),  # tls.crt and tls.key, signed by the cluster's CA, which the configuration trusts
        "health-probe-bind-address": "127.0.0.1:19082",
        "metrics-bind-address": "0",
        "zap-log-level": "info",
        "zap-encoder": "console",
    }


def test_the_webhook_configuration_is_keda_s_own_called_on_loopback_and_trusting_the_cluster_ca():
    if keda.cached_source() is None:
        pytest.skip("KEDA's Go module is not in Go's module cache (`python -m dev.parts.keda` fetches it)")
    config = keda.validating_webhooks(19443, b"CA PEM")
    assert config["kind"] == "ValidatingWebhookConfiguration"
    hooks = {h["name"]: h for h in config["webhooks"]}
    scaled = hooks["vscaledobject.kb.io"]
    assert scaled["clientConfig"] == {
        "url": "https://127.0.0.1:19443/validate-keda-sh-v1alpha1-scaledobject",
        "caBundle": base64.b64encode(b"CA PEM").decode(),
    }
    assert scaled["failurePolicy"] == "Ignore"  # as KEDA ships it
    assert scaled["rules"][0]["resources"] == ["scaledobjects"]
    assert all(h["clientConfig"]["url"].startswith("https://127.0.0.1:19443/validate-") for h in hooks.values())


def test_the_readiness_probe_run_in_a_namespace_is_the_url_fetched_by_this_python():
    argv = readyz_argv("http://127.0.0.1:19081/readyz")
    assert argv[0] == sys.executable and argv[1] == "-c"
    assert argv[-1] == "http://127.0.0.1:19081/readyz"
    compile(argv[2], "<probe>", "exec")  # it is Python, whole
