"""How epd_operator.kube logs in, read from the loaded client configuration (no API server needed;
exec plugins: tests/loopback/kube/test_credentials.py; against the real one: tests/integration/test_kube_login.py)."""

from __future__ import annotations

import pytest
import yaml

from epd_operator.kube import CredentialsError, connection_info, credentials, load_credentials


def write(path, doc) -> str:
    path.write_text(yaml.safe_dump(doc))
    return str(path)


async def test_kubeconfig_token_file_namespace_and_tls_settings(tmp_path, monkeypatch):
    token_file = tmp_path / "token"
    token_file.write_text("rotating-1\n")
    path = write(
        tmp_path / "config",
        {
            "clusters": [
                {"name": "c", "cluster": {"server": "https://10.0.0.1:6443/", "insecure-skip-tls-verify": True}}
            ],
            "users": [{"name": "u", "user": {"tokenFile": str(token_file)}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "serving"}}],
            "current-context": "x",
        },
    )
    login = await load_credentials(path)
    assert (login.server, login.default_namespace) == ("https://10.0.0.1:6443", "serving")
    assert login.configuration.verify_ssl is False
    assert await login.configuration.get_api_key_with_prefix("BearerToken") == "Bearer rotating-1"
    # Projected tokens rotate: the file is read again (here at once instead of after a minute).
    monkeypatch.setattr(credentials, "TOKEN_FILE_REREAD_SECONDS", 0.0)
    token_file.write_text("rotating-2\n")
    assert await login.configuration.get_api_key_with_prefix("BearerToken") == "Bearer rotating-2"
    info = connection_info(login)
    assert (info.server, info.scheme, info.token, info.insecure) == (
        "https://10.0.0.1:6443",
        "Bearer",
        "rotating-2",
        True,
    )


async def test_every_kubeconfig_path_is_merged_and_the_first_current_context_wins(tmp_path, monkeypatch):
    # kubectl's rules: the first file to name an entry or the current-context wins.
    clusters = write(
        tmp_path / "clusters",
        {
            "clusters": [
                {"name": "c", "cluster": {"server": "http://127.0.0.1:1"}},
                {"name": "other", "cluster": {"server": "http://127.0.0.1:2"}},
            ],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "first"}}],
            "current-context": "x",
        },
    )
    users = write(
        tmp_path / "users",
        {
            "users": [{"name": "u", "user": {"token": "from-the-second-file"}}],
            "contexts": [
                {"name": "x", "context": {"cluster": "other", "user": "u"}},
                {"name": "y", "context": {"cluster": "other", "user": "u"}},
            ],
            "current-context": "y",
        },
    )
    monkeypatch.setenv("KUBECONFIG", f"{clusters}:{tmp_path / 'absent'}:{users}")
    login = await load_credentials()
    assert (login.server, login.default_namespace) == ("http://127.0.0.1:1", "first")
    assert login.authorization() == ("Bearer", "from-the-second-file")
    assert (await load_credentials(context="y")).server == "http://127.0.0.1:2"


async def test_no_kubeconfig_and_no_pod_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    with pytest.raises(CredentialsError, match="no Kubernetes credentials: not in a pod, and no kubeconfig at"):
        await load_credentials()
