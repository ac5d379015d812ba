"""A Prometheus running as a pod in a namespace of its own, labelled as the Prometheus Operator labels
its Prometheus pods (`app.kubernetes.io/name: prometheus`, what an EPDDeployment's default
`spec.networkPolicy.scrapers` admits): the scraper the NetworkPolicies must let in, or keep out.

Debian's Prometheus (the image ``dev/builds/images.py`` builds from the host's binary) has no Kubernetes
service discovery, so its targets are static: the pod IPs a test hands it, each labelled with the tier
it belongs to. Its API (``/api/v1/query``) answers on the pod's IP from the node's network namespace.
"""

from __future__ import annotations

from typing import Any

import yaml

NAMESPACE = "epd-monitoring"
NAME = "prometheus"
PORT = 9090
LABELS = {"app.kubernetes.io/name": "prometheus"}
JOB = "epd"


def config(targets: dict[str, str]) -> str:
    """A scrape every two seconds of each ``role -> host:port`` target, labelled ``role``."""
    return yaml.safe_dump(
        {
            "global": {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "2s"},
            "scrape_configs": [
                {
                    "job_name": JOB,
                    "static_configs": [
                        {"targets": [address], "labels": {"role": role}} for role, address in sorted(targets.items())
                    ],
                }
            ],
        }
    )


def objects(image: str, targets: dict[str, str]) -> list[dict[str, Any]]:
    """The namespace, the configuration and the Prometheus pod scraping ``targets``."""
    meta = {"name": NAME, "namespace": NAMESPACE}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"prometheus.yml": config(targets)}},
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {**meta, "labels": LABELS},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534},
                "containers": [
                    {
                        "name": NAME,
                        "image": image,
                        "imagePullPolicy": "Never",
                        "args": [
                            "--config.file=/etc/prometheus/prometheus.yml",
                            "--storage.tsdb.path=/prometheus",
                            f"--web.listen-address=:{PORT}",
                        ],
                        "ports": [{"name": "web", "containerPort": PORT}],
                        "readinessProbe": {"httpGet": {"path": "/-/ready", "port": PORT}, "periodSeconds": 1},
                        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}},
                        "securityContext": {
                            "allowPrivilegeEscalation": False,
                            "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]},
                        },
                        "volumeMounts": [
                            {"name": "config", "mountPath": "/etc/prometheus", "readOnly": True},
                            {"name": "data", "mountPath": "/prometheus"},
                        ],
                    }
                ],
                "volumes": [{"name": "config", "configMap": {"name": NAME}}, {"name": "data", "emptyDir": {}}],
            },
        },
    ]


def up_by_role(query_answer: dict[str, Any]) -> dict[str, float]:
    """``up`` per target's role from an ``/api/v1/query?query=up`` answer (1: the last scrape succeeded)."""
    return {s["metric"]["role"]: float(s["value"][1]) for s in query_answer["data"]["result"] if "role" in s["metric"]}
