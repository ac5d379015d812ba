"""Every rendered pod of every example, checked against the Pod Security Standards (tests/support/pod_security.py),
and docs/install.md stating the level each example meets."""

from __future__ import annotations

from pathlib import Path

import pytest

from epd_operator.render import render
from tests.support import pod_security
from tests.support.pod_security import BASELINE, PRIVILEGED, RESTRICTED, level, strictest_common, violations
from tests.support.render_examples import (
    CPU_CONNECTOR,
    MOONCAKE,
    SHARED_STORAGE,
    example,
    pod_templates,
    rendered_examples,
)

INSTALL_PAGE = Path(__file__).resolve().parents[3] / "docs" / "install.md"
START, END = "<!-- pod-security:start -->", "<!-- pod-security:end -->"
ROLES = ("encoder", "prefill", "decode", "router", "mooncake-master")

# What each example's pods meet, by role. vLLM's upstream image runs as root, so no vLLM tier can be
# "restricted" (runAsNonRoot); the shared-storage janitor runs as root on purpose (it deletes files vLLM
# wrote as root). The router runs as uid 65532 with every restricted control.
EXPECTED = {
    "epd-cpu-connector.yaml": {"encoder": BASELINE, "decode": BASELINE, "router": RESTRICTED},
    "epd-mooncake.yaml": {"encoder": BASELINE, "decode": BASELINE, "router": RESTRICTED, "mooncake-master": BASELINE},
    "epd-nixl-autoscaled.yaml": {"encoder": BASELINE, "prefill": BASELINE, "decode": BASELINE, "router": RESTRICTED},
    "epd-shared-storage.yaml": {"encoder": BASELINE, "decode": BASELINE, "router": RESTRICTED},
    "epd-keda-scale-to-zero.yaml": {"encoder": BASELINE, "decode": BASELINE, "router": RESTRICTED},
    "epd-dp-ep-moe.yaml": {"encoder": BASELINE, "prefill": BASELINE, "decode": BASELINE, "router": RESTRICTED},
    # decode: a LeaderWorkerSet; its leader and worker pods are both checked.
    "epd-multi-node.yaml": {"encoder": BASELINE, "decode": BASELINE, "router": RESTRICTED},
    # Their namespaces enforce baseline (tests/node/test_mission_loop.py runs them under it).
    "epd-local-cpu.yaml": {"encoder": BASELINE, "decode": BASELINE, "router": RESTRICTED},
    "epd-local-cpu-nixl.yaml": {"encoder": BASELINE, "prefill": BASELINE, "decode": BASELINE, "router": RESTRICTED},
    "epd-local-cpu-multinode.yaml": {"encoder": BASELINE, "decode": BASELINE, "router": RESTRICTED},
    "epd-behind-gateway.yaml": {"encoder": BASELINE, "decode": BASELINE, "router": RESTRICTED},
}


def pods(objects: list[dict]) -> list[tuple[str, dict]]:
    """(role, pod spec) of every pod template: a Deployment's, a LeaderWorkerSet's leader and worker."""
    return [
        (obj["metadata"]["labels"]["serving.epd.dev/role"], template["spec"])
        for obj in objects
        for template, _ in pod_templates(obj)
    ]


def pod_levels(objects: list[dict]) -> dict[str, str]:
    levels: dict[str, str] = {}
    for role, spec in pods(objects):
        levels[role] = strictest_common([level(spec), *([levels[role]] if role in levels else [])])
    return levels


@pytest.fixture(scope="module")
def examples() -> dict[str, list[dict]]:
    return rendered_examples()


def test_every_example_is_covered(examples):
    assert set(EXPECTED) == set(examples)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_rendered_pod_meets_its_level(examples, name):
    levels = pod_levels(examples[name])
    assert levels == EXPECTED[name], {role: violations(spec) for role, spec in pods(examples[name])}


def test_vllm_pods_miss_restricted_only_by_running_as_root(examples):
    """Everything restricted asks of a vLLM container that the upstream image allows is rendered:
    no privilege escalation, every capability dropped, RuntimeDefault seccomp."""
    for objects in examples.values():
        for role, spec in pods(objects):
            if role not in ROLES[:3]:
                continue
            vllm = [v for v in violations({**spec, "containers": spec["containers"][:1]})[RESTRICTED]]
            assert vllm == ["containers[vllm].securityContext.runAsNonRoot: must be true (here or on the pod)"]


def test_a_non_root_vllm_image_makes_a_tier_restricted():
    non_root = {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000}
    objects = render(example(CPU_CONNECTOR, **{"spec.decode.podSecurityContext": non_root}))
    assert pod_levels(objects)["decode"] == RESTRICTED


def test_rdma_needs_privileged():
    objects = render(example(MOONCAKE, **{"spec.ecTransfer.mooncake": {"protocol": "rdma"}}))
    levels = pod_levels(objects)
    assert levels["encoder"] == levels["decode"] == PRIVILEGED  # IPC_LOCK is beyond baseline
    assert levels["router"] == RESTRICTED


def test_overlays_can_lower_the_level():
    objects = render(
        example(
            SHARED_STORAGE,
            **{
                "spec.decode.volumes": [{"name": "host", "hostPath": {"path": "/data"}}],
                "spec.decode.volumeMounts": [{"name": "host", "mountPath": "/data"}],
            },
        )
    )
    assert pod_levels(objects)["decode"] == PRIVILEGED


@pytest.mark.parametrize(
    "pod, expected",
    [
        ({"containers": [{"name": "a"}]}, BASELINE),
        ({"hostNetwork": True, "containers": [{"name": "a"}]}, PRIVILEGED),
        ({"containers": [{"name": "a", "securityContext": {"privileged": True}}]}, PRIVILEGED),
        ({"containers": [{"name": "a", "ports": [{"containerPort": 80, "hostPort": 80}]}]}, PRIVILEGED),
        ({"containers": [{"name": "a", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]}, PRIVILEGED),
        ({"containers": [{"name": "a", "securityContext": {"seccompProfile": {"type": "Unconfined"}}}]}, PRIVILEGED),
        (
            {"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}, "containers": [{"name": "a"}]},
            PRIVILEGED,
        ),
        (
            {
                "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [
                    {
                        "name": "a",
                        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                    }
                ],
            },
            RESTRICTED,
        ),
        (
            {
                "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                "initContainers": [{"name": "i"}],
                "containers": [
                    {
                        "name": "a",
                        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                    }
                ],
            },
            BASELINE,
        ),
        (
            {
                "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                "volumes": [{"name": "v", "nfs": {"server": "s", "path": "/"}}],
                "containers": [
                    {
                        "name": "a",
                        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                    }
                ],
            },
            BASELINE,
        ),
    ],
)
def test_the_checker_follows_the_standard(pod, expected):
    assert level(pod) == expected


# ----------------------------------------------------------------------------- docs/install.md


def install_page_table(examples: dict[str, list[dict]]) -> str:
    def cell(levels: dict[str, str], role: str) -> str:
        return levels.get(role, "—")

    lines = [
        "| example | namespace level | encoder | prefill | decode | router | mooncake-master |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in sorted(examples):
        levels = pod_levels(examples[name])
        lines.append(
            f"| `examples/{name}` | **{strictest_common(list(levels.values()))}** | "
            + " | ".join(cell(levels, role) for role in ROLES)
            + " |"
        )
    return "\n".join(lines)


def test_install_page_states_the_level_of_every_example(examples):
    text = INSTALL_PAGE.read_text(encoding="utf-8")
    assert START in text and END in text, f"docs/install.md lost the {START} ... {END} markers"
    shown = text.split(START, 1)[1].split(END, 1)[0].strip()
    expected = install_page_table(examples)
    assert shown == expected, f"docs/install.md's Pod Security table is stale; it should read:\n{expected}"


def test_levels_order():
    assert strictest_common([RESTRICTED, BASELINE]) == BASELINE
    assert strictest_common([RESTRICTED]) == RESTRICTED
    assert pod_security.strictest_common([BASELINE, PRIVILEGED]) == PRIVILEGED
