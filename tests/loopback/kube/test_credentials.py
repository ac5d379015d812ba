"""How epd_operator.kube logs in through a kubeconfig's exec plugin, run as a real process (no API server
needed; against the real one: tests/integration/test_kube_login.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from epd_operator.kube import CredentialsError, connection_info, load_credentials


def write(path, doc) -> str:
    path.write_text(yaml.safe_dump(doc))
    return str(path)


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


def counting_plugin(tmp_path, expires: str | None) -> tuple[str, Path]:
    """A kubeconfig whose exec plugin notes each run in `runs`; its token expires at `expires` (None: never)."""
    runs = tmp_path / "runs"
    status = '"token": "t"' + (f', "expirationTimestamp": "{expires}"' if expires else "")
    plugin = tmp_path / "plugin"
    plugin.write_text(
        f"#!/bin/sh\necho run >> {runs}\n"
        f'echo \'{{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "status": {{{status}}}}}\'\n'
    )
    plugin.chmod(0o755)
    (tmp_path / "token").write_text("from-a-file\n")
    path = write(
        tmp_path / "config",
        {
            "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
            "users": [
                {
                    "name": "u",
                    "user": {
                        "exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin)},
                        "tokenFile": str(tmp_path / "token"),
                    },
                }
            ],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        },
    )
    return path, runs


async def test_a_token_about_to_expire_is_renewed_by_running_the_plugin_again(tmp_path):
    import datetime

    soon = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    path, runs = counting_plugin(tmp_path, soon)
    login = await load_credentials(path)
    assert await login.configuration.get_api_key_with_prefix("BearerToken") == "Bearer t"
    assert runs.read_text().splitlines() == ["run", "run"]  # within the 5 minutes' skew: run again


async def test_an_exec_plugin_without_expiry_is_not_mistaken_for_a_token_file(tmp_path):
    path, _ = counting_plugin(tmp_path, None)
    login = await load_credentials(path)
    assert login.expiration is None
    assert login.configuration.refresh_api_key_hook is None
    assert login.authorization() == ("Bearer", "t")
