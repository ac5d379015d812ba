"""How epd_operator.kube logs in, read from the loaded client configuration (no API server needed;
against the real one: tests/integration/test_kube_login.py)."""

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


async def test_a_failing_exec_plugin_names_the_kubeconfig(tmp_path):
    path = write(
        tmp_path / "config",
        {
            "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
            "users": [
                {"name": "u", "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "false"}}}
            ],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        },
    )
    with pytest.raises(CredentialsError, match=r"kubeconfig .*config: exec: process returned 1"):
        await load_credentials(path)


async def test_a_relative_exec_command_runs_from_the_kubeconfigs_folder(tmp_path, monkeypatch):
    # As kubectl does: `./plugin` next to the kubeconfig that names it, whatever the working directory.
    folder = tmp_path / "conf"
    folder.mkdir()
    plugin = folder / "plugin"
    plugin.write_text(
        '#!/bin/sh\necho \'{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",'
        ' "status": {"token": "from-the-plugin"}}\'\n'
    )
    plugin.chmod(0o755)
    path = write(
        folder / "config",
        {
            "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
            "users": [
                {
                    "name": "u",
                    "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "./plugin"}},
                }
            ],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        },
    )
    monkeypatch.chdir(tmp_path)
    assert (await load_credentials(path)).authorization() == ("Bearer", "from-the-plugin")


async def test_an_exec_tokens_expiry_is_kept_and_handed_to_kopf(tmp_path):
    # The library runs the plugin again once the token is within 5 minutes of its expiry; kopf gets the
    # expiry too and logs in again (through the operator's login handler) when it passes.
    runs = tmp_path / "runs"
    plugin = tmp_path / "plugin"
    plugin.write_text(
        f'#!/bin/sh\necho run >> {runs}\necho \'{{"apiVersion": "client.authentication.k8s.io/v1",'
        ' "kind": "ExecCredential", "status": {"token": "t", "expirationTimestamp": "2099-01-01T00:00:00Z"}}\'\n'
    )
    plugin.chmod(0o755)
    path = write(
        tmp_path / "config",
        {
            "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
            "users": [
                {
                    "name": "u",
                    "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin)}},
                }
            ],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        },
    )
    login = await load_credentials(path)
    assert login.expiration is not None and login.expiration.year == 2099
    assert connection_info(login).expiration == login.expiration
    for _ in range(3):  # each request asks the hook; a valid token does not run the plugin again
        assert await login.configuration.get_api_key_with_prefix("BearerToken") == "Bearer t"
    assert runs.read_text().splitlines() == ["run"]
