"""The Kubernetes Pod Security Standards (baseline and restricted), checked on a pod spec.

A transcription of the published standard (https://kubernetes.io/docs/concepts/security/pod-security-standards/,
the policy version of Kubernetes 1.30, the oldest the charts claim), control by control, for the fields a pod
spec can carry. `violations(pod)` lists what each level refuses; `level(pod)` is the strictest level the pod
meets ("restricted", "baseline" or "privileged"), i.e. the `pod-security.kubernetes.io/enforce` label a
namespace may carry and still admit the pod.

Not covered (nothing we render sets them, and the API refuses none of them from a tier either): the
deprecated AppArmor and seccomp *annotations*; Windows-only pods (`spec.os.name: windows` relaxes some
restricted controls, which we never claim).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

BASELINE, RESTRICTED, PRIVILEGED = "baseline", "restricted", "privileged"

# Baseline "Capabilities": adding anything beyond this default set is refused.
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
# Baseline "Sysctls": the safe set.
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
# Baseline "SELinux": allowed types (empty included); user and role must be unset.
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t"}
# Restricted "Volume Types": the only volume sources allowed.
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def _containers(pod: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for c in pod.get(field) or []:
            yield f"{field}[{c.get('name')}]", c


def _security_contexts(pod: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    yield "securityContext", pod.get("securityContext") or {}
    for where, c in _containers(pod):
        yield f"{where}.securityContext", c.get("securityContext") or {}


def _baseline(pod: dict[str, Any]) -> Iterator[str]:
    # HostProcess
    for where, sc in _security_contexts(pod):
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            yield f"{where}.windowsOptions.hostProcess: HostProcess pods are privileged"
    # Host Namespaces
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            yield f"{field}: host namespaces are not allowed"
    for where, c in _containers(pod):
        sc = c.get("securityContext") or {}
        # Privileged Containers
        if sc.get("privileged"):
            yield f"{where}.securityContext.privileged: privileged containers are not allowed"
        # Capabilities
        extra = set((sc.get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES
        if extra:
            yield f"{where}.securityContext.capabilities.add: {sorted(extra)} beyond the baseline set"
        # Host Ports
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                yield f"{where}.ports[{port.get('name')}].hostPort: host ports are not allowed"
        # /proc Mount Type
        if sc.get("procMount") not in (None, "Default"):
            yield f"{where}.securityContext.procMount: must be Default"
    # HostPath Volumes
    for volume in pod.get("volumes") or []:
        if "hostPath" in volume:
            yield f"volumes[{volume.get('name')}].hostPath: hostPath volumes are not allowed"
    for where, sc in _security_contexts(pod):
        # AppArmor
        apparmor = (sc.get("appArmorProfile") or {}).get("type")
        if apparmor not in (None, "RuntimeDefault", "Localhost"):
            yield f"{where}.appArmorProfile.type: {apparmor} is not allowed"
        # SELinux
        selinux = sc.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in SELINUX_TYPES:
            yield f"{where}.seLinuxOptions.type: {selinux['type']} is not allowed"
        if selinux.get("user") or selinux.get("role"):
            yield f"{where}.seLinuxOptions: user and role must not be set"
        # Seccomp
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            yield f"{where}.seccompProfile.type: Unconfined is not allowed"
    # Sysctls
    for sysctl in (pod.get("securityContext") or {}).get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            yield f"securityContext.sysctls[{sysctl.get('name')}]: not a safe sysctl"


def _restricted(pod: dict[str, Any]) -> Iterator[str]:
    # Volume Types
    for volume in pod.get("volumes") or []:
        sources = set(volume) - {"name"}
        if not sources <= RESTRICTED_VOLUMES:
            yield f"volumes[{volume.get('name')}]: {sorted(sources - RESTRICTED_VOLUMES)} volumes are not allowed"
    pod_sc = pod.get("securityContext") or {}
    for where, c in _containers(pod):
        sc = c.get("securityContext") or {}
        # Privilege Escalation
        if sc.get("allowPrivilegeEscalation") is not False:
            yield f"{where}.securityContext.allowPrivilegeEscalation: must be false"
        # Running as Non-root: the container's setting, else the pod's, must be true
        non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if non_root is not True:
            yield f"{where}.securityContext.runAsNonRoot: must be true (here or on the pod)"
        # Seccomp: the container's profile, else the pod's, must be RuntimeDefault or Localhost
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            yield f"{where}.securityContext.seccompProfile.type: must be RuntimeDefault or Localhost"
        # Capabilities: drop ALL, add at most NET_BIND_SERVICE
        capabilities = sc.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            yield f"{where}.securityContext.capabilities.drop: must include ALL"
        extra = set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}
        if extra:
            yield f"{where}.securityContext.capabilities.add: {sorted(extra)} not allowed (only NET_BIND_SERVICE)"
    # Running as Non-root user: runAsUser must not be 0, on the pod or any container
    for where, sc in _security_contexts(pod):
        if sc.get("runAsUser") == 0:
            yield f"{where}.runAsUser: must not be 0"


def violations(pod: dict[str, Any]) -> dict[str, list[str]]:
    """What each level refuses in `pod` (a pod spec). Restricted includes every baseline control."""
    baseline = list(_baseline(pod))
    return {BASELINE: baseline, RESTRICTED: baseline + list(_restricted(pod))}


def level(pod: dict[str, Any]) -> str:
    """The strictest Pod Security level `pod` meets."""
    found = violations(pod)
    if not found[RESTRICTED]:
        return RESTRICTED
    if not found[BASELINE]:
        return BASELINE
    return PRIVILEGED


def strictest_common(levels: list[str]) -> str:
    """The strictest level a namespace may enforce and still admit pods of all these levels."""
    order = [RESTRICTED, BASELINE, PRIVILEGED]
    return max(levels, key=order.index)
