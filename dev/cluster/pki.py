"""The local control plane's credentials: a CA, the apiserver's serving certificate, the
service-account signing keys (openssl), and kubeconfigs that trust that CA."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path
from typing import Any

ADMIN_TOKEN_USER = "epd-admin"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(pki: Path) -> None:
    """A CA, the apiserver's serving certificate for 127.0.0.1/localhost, and the service-account keys."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "3650",
        "-subj",
        "/CN=epd-local-ca",
        cwd=pki,
    )
    (pki / "san.cnf").write_text(
        "[req]\ndistinguished_name=dn\n[dn]\n[ext]\nsubjectAltName=IP:127.0.0.1,DNS:localhost,"
        "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,"
        # The `kubernetes` Service's ClusterIP: how pods on a real node reach the API server.
        "IP:10.96.0.1\n"
        "extendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n"
    )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "apiserver.key",
        "-out",
        "apiserver.csr",
        "-subj",
        "/CN=kube-apiserver",
        cwd=pki,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "apiserver.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "apiserver.crt",
        "-days",
        "3650",
        "-extfile",
        "san.cnf",
        "-extensions",
        "ext",
        cwd=pki,
    )
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def sign_serving_cert(
    pki: Path, stem: Path, name: str, *, dns_names: tuple[str, ...] = (), client: bool = False
) -> None:
    """A serving certificate for 127.0.0.1 signed by the CA in `pki` (from `make_pki`):
    `stem`.crt and `stem`.key, for a server on the host that the API server calls (a webhook).
    `dns_names` are names it answers to besides localhost (the API server checks an aggregated API's
    certificate against its Service's name, `<service>.<namespace>.svc`); with `client`, it may also
    authenticate its holder as a TLS client (one key pair for both ends of a mutual-TLS link)."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    ext = stem.with_suffix(".cnf")
    ext.write_text(f"[req]\ndistinguished_name=dn\n[dn]\n[ext]\n{cert_extensions(dns_names, client=client)}")
    key, csr, crt = (str(stem.with_suffix(s)) for s in (".key", ".csr", ".crt"))
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", f"/CN={name}", cwd=pki)
    _openssl(
        "x509", "-req", "-in", csr, "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out", crt,
        "-days", "3650", "-extfile", str(ext), "-extensions", "ext", cwd=pki,
    )  # fmt: skip


def cert_extensions(dns_names: tuple[str, ...] = (), *, client: bool = False) -> str:
    """The X.509v3 extensions (an openssl config section's lines) of a certificate from
    :func:`sign_serving_cert`."""
    names = ",".join(["IP:127.0.0.1", "DNS:localhost", *(f"DNS:{n}" for n in dns_names)])
    usage = "serverAuth,clientAuth" if client else "serverAuth"
    return f"subjectAltName={names}\nextendedKeyUsage={usage}\nkeyUsage=digitalSignature,keyEncipherment\n"


def kubeconfig(
    server: str, ca_file: Path, token: str, *, user: str = ADMIN_TOKEN_USER, namespace: str | None = None
) -> dict[str, Any]:
    context: dict[str, Any] = {"cluster": "epd-local", "user": user}
    if namespace:
        context["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "epd-local",
        "clusters": [
            {
                "name": "epd-local",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_file.read_bytes()).decode(),
                },
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "epd-local", "context": context}],
    }
