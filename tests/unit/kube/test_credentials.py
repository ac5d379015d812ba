"""How epd_operator.kube logs in, read from the loaded client configuration (no API server needed;
exec plugins: tests/loopback/kube/test_credentials.py; against the real one: tests/integration/test_kube_login.py)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from epd_operator.kube import Credentials, CredentialsError, connection_info, credentials, load_credentials


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
    with pytest.raises(CredentialsError, match=r"^no Kubernetes credentials: not in a pod, and no kubeconfig at '"):
        await load_credentials()


# ----------------------------------------------------------------------------- in a pod


@pytest.fixture
def pod(tmp_path, monkeypatch):
    """A pod's service account files in tmp_path, and the environment Kubernetes gives a pod."""
    files = {"token": "sa-token\n", "ca.crt": "-----BEGIN CERTIFICATE-----\n", "namespace": "team-a\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(credentials, "SERVICE_ACCOUNT_TOKEN", str(tmp_path / "token"))
    monkeypatch.setattr(credentials, "SERVICE_ACCOUNT_CA", str(tmp_path / "ca.crt"))
    monkeypatch.setattr(credentials, "SERVICE_ACCOUNT_NAMESPACE", str(tmp_path / "namespace"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    return tmp_path


async def test_in_a_pod_its_service_account(pod):
    assert credentials.in_cluster()
    login = await load_credentials()
    assert (login.source, login.server, login.default_namespace) == (
        "in-cluster service account",
        "https://10.96.0.1:443",
        "team-a",
    )
    assert login.configuration.ssl_ca_cert == str(pod / "ca.crt")
    assert login.configuration.refresh_api_key_hook is not None  # the projected token is read again
    assert await login.configuration.get_api_key_with_prefix("BearerToken") == "Bearer sa-token"  # trimmed
    assert login.authorization() == ("Bearer", "sa-token")


@pytest.mark.parametrize("text", [None, "", "  \n"])
async def test_in_a_pod_without_a_namespace_file_there_is_no_default_namespace(pod, text):
    if text is None:
        (pod / "namespace").unlink()
    else:
        (pod / "namespace").write_text(text)
    assert (await load_credentials()).default_namespace is None


async def test_in_a_pod_a_named_kubeconfig_or_context_wins(pod, tmp_path, monkeypatch):
    path = write(
        tmp_path / "config",
        {
            "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        },
    )
    assert (await load_credentials(path)).server == "http://127.0.0.1:1"
    monkeypatch.setenv("KUBECONFIG", path)
    assert (await load_credentials(context="x")).server == "http://127.0.0.1:1"


async def test_a_pod_without_its_ca_is_a_clear_error(pod):
    (pod / "ca.crt").unlink()
    with pytest.raises(CredentialsError, match=r"^in-cluster service account: Service certification file"):
        await load_credentials()


def test_not_in_a_pod_without_the_service_host_or_the_token(pod, monkeypatch):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "")
    assert not credentials.in_cluster()
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    (pod / "token").unlink()
    assert not credentials.in_cluster()


# ----------------------------------------------------------------------------- what a login holds


def test_fixed_credentials_from_a_token():
    login = Credentials.from_token("https://api:6443/", "abc", ca_path="/ca.crt", namespace="ns")
    assert (login.server, login.source, login.default_namespace) == (
        "https://api:6443",
        "a token for https://api:6443/",
        "ns",
    )
    assert login.configuration.ssl_ca_cert == "/ca.crt"
    assert login.authorization() == ("Bearer", "abc")
    assert Credentials.from_token("http://api", "abc").configuration.ssl_ca_cert is None


def test_the_authorization_header_with_its_scheme_or_bearer_by_default():
    login = Credentials.from_token("http://api", "x")
    for stored, header in [
        ("Bearer abc", ("Bearer", "abc")),
        ("abc", ("Bearer", "abc")),
        ("Basic dTpw", ("Basic", "dTpw")),
    ]:
        login.configuration.api_key["BearerToken"] = stored
        assert login.authorization() == header
    login.configuration.api_key["BearerToken"] = ""
    assert login.authorization() is None
    del login.configuration.api_key["BearerToken"]
    assert login.authorization() is None


def test_kopf_gets_basic_auth_as_a_user_and_password():
    import base64

    login = Credentials.from_token("https://api:6443", "x", ca_path="/ca.crt", namespace="ns")
    login.configuration.api_key["BearerToken"] = "Basic " + base64.b64encode(b"admin:s3:cret").decode()
    login.configuration.cert_file, login.configuration.key_file = "/tls.crt", "/tls.key"
    info = connection_info(login)
    assert (info.username, info.password, info.scheme, info.token) == ("admin", "s3:cret", None, None)
    assert (info.ca_path, info.insecure, info.default_namespace) == ("/ca.crt", False, "ns")
    assert (info.certificate_path, info.private_key_path) == ("/tls.crt", "/tls.key")
    login.configuration.api_key.clear()
    info = connection_info(login)
    assert (info.scheme, info.token, info.username, info.password) == (None, None, None, None)


async def test_a_context_whose_cluster_names_no_server_is_refused(tmp_path):
    path = write(
        tmp_path / "config",
        {
            "clusters": [{"name": "c", "cluster": {"insecure-skip-tls-verify": True}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        },
    )
    with pytest.raises(CredentialsError, match=f"^kubeconfig {path}: the context's cluster names no server$"):
        await load_credentials(path)
    with pytest.raises(CredentialsError, match=f"^kubeconfig {path}: .*nope"):
        await load_credentials(path, context="nope")


async def test_a_token_is_used_without_surrounding_whitespace(tmp_path):
    path = write(
        tmp_path / "config",
        {
            "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
            "users": [{"name": "u", "user": {"token": "abc \n"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "n"}}],
            "current-context": "x",
        },
    )
    login = await load_credentials(path)
    assert login.authorization() == ("Bearer", "abc")
    assert login.configuration.refresh_api_key_hook is None  # a fixed token is never read again
    assert login.expiration is None


# ----------------------------------------------------------------------------- refreshing, with stand-in loaders


class Loader:
    def __init__(self, token: str = "Bearer new", fails: Exception | None = None, reloads: bool = True):
        self.token, self.fails, self.reloads, self.calls = token, fails, reloads, 0

    async def load_from_exec_plugin(self):
        self.calls += 1
        if self.fails:
            raise self.fails

    def _load_user_token(self):
        self.calls += 1
        return self.reloads


def as_loader(loader: Loader) -> Any:
    """The stand-in where the refreshers take the library's KubeConfigLoader."""
    return loader


async def test_an_exec_plugin_refresh_sets_the_token_or_says_the_plugin_failed():
    from kubernetes_asyncio.client import Configuration

    config = Configuration()
    await credentials._exec_refresher(as_loader(Loader("Bearer fresh")))(config)
    assert config.api_key["BearerToken"] == "Bearer fresh"
    with pytest.raises(CredentialsError, match=r"^exec plugin: expired and no network$"):
        await credentials._exec_refresher(as_loader(Loader(fails=RuntimeError("expired and no network"))))(config)


def test_a_token_file_is_read_again_once_a_minute(monkeypatch):
    from kubernetes_asyncio.client import Configuration

    clock = [1000.0]
    monkeypatch.setattr(credentials.time, "monotonic", lambda: clock[0])
    loader = Loader("Bearer second")
    refresh = credentials._token_file_refresher(as_loader(loader))
    config = Configuration()
    config.api_key["BearerToken"] = "Bearer first"
    clock[0] += credentials.TOKEN_FILE_REREAD_SECONDS - 0.5
    refresh(config)
    assert (loader.calls, config.api_key["BearerToken"]) == (0, "Bearer first")
    clock[0] += 0.5  # exactly a minute
    refresh(config)
    assert (loader.calls, config.api_key["BearerToken"]) == (1, "Bearer second")
    clock[0] += credentials.TOKEN_FILE_REREAD_SECONDS - 0.5  # counted from the last read
    refresh(config)
    assert loader.calls == 1
    loader.reloads, loader.token = False, "Bearer unreadable"
    clock[0] += 1
    refresh(config)
    assert (loader.calls, config.api_key["BearerToken"]) == (2, "Bearer second")


@pytest.mark.parametrize("is_async", [False, True])
async def test_a_refreshed_token_is_trimmed_too(is_async):
    from kubernetes_asyncio.client import Configuration

    def set_token(config):
        config.api_key["BearerToken"] = "Bearer refreshed\n"

    async def set_token_async(config):
        set_token(config)

    config = Configuration()
    config.api_key["BearerToken"] = " Bearer first "
    config.refresh_api_key_hook = set_token_async if is_async else set_token
    trimmed = credentials._trimmed(config)
    assert trimmed.api_key["BearerToken"] == "Bearer first"
    assert await trimmed.get_api_key_with_prefix("BearerToken") == "Bearer refreshed"


def test_relative_exec_commands_are_anchored_at_the_kubeconfig_that_names_them(tmp_path):
    from kubernetes_asyncio.config.kube_config import KubeConfigMerger

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()

    def user(name, command):
        return {"name": name, "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": command}}}

    first = write(tmp_path / "a" / "config", {"users": [user("rel", "./bin/plugin"), user("bare", "aws")]})
    second = write(
        tmp_path / "b" / "config",
        {"users": [user("abs", "/usr/bin/p"), user("other", "tools/p"), {"name": "token", "user": {"token": "t"}}]},
    )
    merged = KubeConfigMerger(f"{first}:{second}")
    credentials._anchor_exec_commands(merged)
    commands = {
        u.value["name"] if hasattr(u, "value") else u["name"]: (u.value if hasattr(u, "value") else u)["user"]
        .get("exec", {})
        .get("command")
        for u in merged.config.value["users"]  # type: ignore[union-attr]
    }
    assert commands == {
        "rel": str(tmp_path / "a" / "bin" / "plugin"),
        "bare": "aws",
        "abs": "/usr/bin/p",
        "other": str(tmp_path / "b" / "tools" / "p"),
        "token": None,
    }


def cluster_config(tmp_path, user: dict, **extra) -> dict:
    return {
        "clusters": [{"name": "c", "cluster": {"server": "https://10.0.0.1:6443", **extra}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
    }


async def test_a_context_named_in_a_kubeconfig_without_a_current_one(tmp_path):
    path = write(tmp_path / "config", cluster_config(tmp_path, {"token": "t"}))
    login = await load_credentials(path, context="x")
    assert (login.server, login.source) == ("https://10.0.0.1:6443", f"kubeconfig {path}")


async def test_relative_files_are_read_beside_the_kubeconfig_that_names_them(tmp_path, monkeypatch):
    folder = tmp_path / "conf"
    folder.mkdir()
    (folder / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    path = write(folder / "config", cluster_config(tmp_path, {"token": "t"}, **{"certificate-authority": "ca.crt"}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    login = await load_credentials(path, context="x")
    assert login.configuration.ssl_ca_cert == str(folder / "ca.crt")


async def test_a_token_given_beside_a_token_file_wins_and_is_not_read_again(tmp_path):
    (tmp_path / "token").write_text("from-the-file\n")
    user = {"token": "fixed", "tokenFile": str(tmp_path / "token")}
    login = await load_credentials(write(tmp_path / "config", cluster_config(tmp_path, user)), context="x")
    assert login.authorization() == ("Bearer", "fixed")
    assert login.configuration.refresh_api_key_hook is None


def test_a_configuration_without_a_token_is_left_as_it_is():
    from kubernetes_asyncio.client import Configuration

    config = Configuration(host="https://api")
    assert credentials._trimmed(config) is config
    assert "BearerToken" not in config.api_key and config.refresh_api_key_hook is None
