"""Who we are to the API server: the pod's service account, else the kubeconfig (every `KUBECONFIG`
path merged, exec plugins run), loaded by the client library's own loaders.

Where the library differs from kubectl, this module fills the gap with the library's own parts:
`load_kube_config()` reads `KUBECONFIG` once, when the library is imported, so the paths are read here
at each load; `KubeConfigMerger` lets the *last* file's current-context win where kubectl takes the
first; a `tokenFile` is read once where kubectl re-reads it (projected tokens rotate); a token read
from a file keeps its trailing newline (an invalid header) where kubectl trims it; an exec plugin's
relative command path (`./bin/plugin`) is run from the working directory where kubectl resolves it
against the kubeconfig's folder.
"""

from __future__ import annotations

import dataclasses
import datetime
import inspect
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.config import ConfigException
from kubernetes_asyncio.config.incluster_config import InClusterConfigLoader
from kubernetes_asyncio.config.kube_config import (
    ENV_KUBECONFIG_PATH_SEPARATOR,
    KubeConfigLoader,
    KubeConfigMerger,
)

log = logging.getLogger(__name__)

# The service account Kubernetes mounts into every pod (one home: the router and the operator read it).
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
SERVICE_ACCOUNT_TOKEN = f"{SERVICE_ACCOUNT_DIR}/token"
SERVICE_ACCOUNT_CA = f"{SERVICE_ACCOUNT_DIR}/ca.crt"
SERVICE_ACCOUNT_NAMESPACE = f"{SERVICE_ACCOUNT_DIR}/namespace"
DEFAULT_KUBECONFIG = "~/.kube/config"
TOKEN_FILE_REREAD_SECONDS = 60.0  # as the library does for the in-cluster token


class CredentialsError(Exception):
    """No usable credentials: nothing to log in with, or a kubeconfig (or its exec plugin) failed."""


@dataclasses.dataclass
class Credentials:
    """A loaded client configuration and what else the login found out."""

    configuration: Configuration
    source: str  # for messages: "in-cluster service account" or the kubeconfig paths
    default_namespace: str | None = None
    # When an exec plugin's token expires (the library re-runs the plugin after it).
    expiration: datetime.datetime | None = None

    @property
    def server(self) -> str:
        return str(self.configuration.host)

    def authorization(self) -> tuple[str, str] | None:
        """(scheme, credential) of the Authorization header, e.g. ("Bearer", token)."""
        value = self.configuration.api_key.get("BearerToken")
        if not value:
            return None
        scheme, _, credential = str(value).partition(" ")
        return (scheme, credential) if credential else ("Bearer", scheme)

    @classmethod
    def from_token(
        cls, server: str, token: str, *, ca_path: str | None = None, namespace: str | None = None
    ) -> Credentials:
        """Fixed credentials (tests in front of a proxy, tools that minted a token themselves)."""
        configuration = Configuration(host=server.rstrip("/"))
        configuration.api_key["BearerToken"] = f"Bearer {token}"
        configuration.ssl_ca_cert = ca_path
        return cls(configuration, f"a token for {server}", namespace)


# What the operator, the router and epdctl take: something that logs in (again, after a 401).
CredentialSource = Callable[[], Awaitable[Credentials]]


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(SERVICE_ACCOUNT_TOKEN)


async def load_credentials(kubeconfig: str | None = None, context: str | None = None) -> Credentials:
    """In a pod, its service account (unless a kubeconfig is named); else the kubeconfig: `kubeconfig`
    (a path, or several joined like `KUBECONFIG`), else `$KUBECONFIG`, else ~/.kube/config."""
    if kubeconfig is None and context is None and in_cluster():
        return _load_in_cluster()
    paths = kubeconfig or os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    return await _load_kubeconfig(paths, context)


def _load_in_cluster() -> Credentials:
    configuration = Configuration()
    try:
        # try_refresh_token: the library re-reads the projected token (it rotates) once a minute.
        InClusterConfigLoader(
            token_filename=SERVICE_ACCOUNT_TOKEN, cert_filename=SERVICE_ACCOUNT_CA, try_refresh_token=True
        ).load_and_set(configuration)
    except ConfigException as exc:
        raise CredentialsError(f"in-cluster service account: {exc}") from exc
    namespace = None
    if os.path.exists(SERVICE_ACCOUNT_NAMESPACE):
        with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as f:
            namespace = f.read().strip() or None
    return Credentials(_trimmed(configuration), "in-cluster service account", namespace)


async def _load_kubeconfig(paths: str, context: str | None) -> Credentials:
    merged = KubeConfigMerger(paths)
    if merged.config is None:
        raise CredentialsError(
            "no Kubernetes credentials: not in a pod, and no kubeconfig at "
            f"{paths!r} ($KUBECONFIG, else {DEFAULT_KUBECONFIG})"
        )
    source = "kubeconfig " + ENV_KUBECONFIG_PATH_SEPARATOR.join(merged.paths)
    current = next(
        (
            merged.config_files[p].get("current-context")
            for p in merged.paths
            if (merged.config_files[p] or {}).get("current-context")
        ),
        None,
    )
    if current:  # kubectl: the first file that sets it wins
        merged.config.value["current-context"] = current
    _anchor_exec_commands(merged)
    configuration = Configuration()
    try:
        # config_base_path=None: relative file paths resolve against the file that names them.
        loader = KubeConfigLoader(config_dict=merged.config, config_base_path=None, active_context=context)
        await loader.load_and_set(configuration)
    except (ConfigException, KeyError, ValueError, AssertionError, OSError) as exc:
        raise CredentialsError(f"{source}: {exc}") from exc
    if "host" not in loader.__dict__:
        raise CredentialsError(f"{source}: the context's cluster names no server")
    namespace = ((loader.current_context or {}).get("context") or {}).get("namespace")
    expiration = getattr(loader, "exec_plugin_expiry", None)
    user = loader._user  # the context's user entry; the library has no public accessor
    if expiration is not None:
        configuration.refresh_api_key_hook = _exec_refresher(loader)
    elif user is not None and "exec" not in user and user.safe_get("tokenFile") and not user.safe_get("token"):
        configuration.refresh_api_key_hook = _token_file_refresher(loader)
    return Credentials(_trimmed(configuration), source, namespace, expiration)


def _trimmed(configuration: Configuration) -> Configuration:
    """Tokens without surrounding whitespace, also after each refresh by the library's hook."""

    def trim(config: Configuration) -> None:
        token = config.api_key.get("BearerToken")
        if isinstance(token, str) and token != token.strip():
            config.api_key["BearerToken"] = token.strip()

    trim(configuration)
    # Typed by the library as a coroutine or a callable; in practice always called with the configuration.
    hook = cast("Callable[[Configuration], Any] | None", configuration.refresh_api_key_hook)
    if hook is not None:

        async def refresh(config: Configuration) -> None:
            result = hook(config)
            if inspect.isawaitable(result):
                await result
            trim(config)

        configuration.refresh_api_key_hook = refresh
    return configuration


def _anchor_exec_commands(merged: KubeConfigMerger) -> None:
    """kubectl runs a relative exec command that names a folder (`./bin/plugin`) from the folder of
    the kubeconfig that defines the user; a bare name (`aws`) is looked up on PATH."""
    assert merged.config is not None
    for user in merged.config.value.get("users") or []:
        entry = user.value if hasattr(user, "value") else user  # the merger wraps each entry in a ConfigNode
        command = ((entry or {}).get("user") or {}).get("exec", {}).get("command")
        folder = os.path.dirname(os.path.abspath(getattr(user, "path", None) or merged.paths[0]))
        if isinstance(command, str) and os.sep in command and not os.path.isabs(command):
            entry["user"]["exec"]["command"] = os.path.normpath(os.path.join(folder, command))


def _exec_refresher(loader: KubeConfigLoader) -> Callable[[Configuration], Awaitable[None]]:
    """Run the exec plugin again once its token expires (the library's loader knows when; its own
    `refresh_token()` would poll in a task of its own instead)."""

    async def refresh(configuration: Configuration) -> None:
        try:
            await loader.load_from_exec_plugin()  # a no-op until the expiry (less 5 minutes' skew)
        except Exception as exc:  # the library raises whatever the plugin run raised
            raise CredentialsError(f"exec plugin: {exc}") from exc
        configuration.api_key["BearerToken"] = loader.token

    return refresh


def _token_file_refresher(loader: KubeConfigLoader) -> Callable[[Configuration], None]:
    read_at = [time.monotonic()]

    def refresh(configuration: Configuration) -> None:
        if time.monotonic() - read_at[0] >= TOKEN_FILE_REREAD_SECONDS:
            read_at[0] = time.monotonic()
            if loader._load_user_token():
                configuration.api_key["BearerToken"] = loader.token

    return refresh


def connection_info(credentials: Credentials) -> Any:
    """The same credentials as kopf's `ConnectionInfo`, for an `@kopf.on.login` handler."""
    import kopf  # only the operator has kopf to log in

    configuration = credentials.configuration
    auth = credentials.authorization()
    scheme, token, username, password = None, None, None, None
    if auth is not None and auth[0].lower() == "basic":
        import base64

        username, _, password = base64.b64decode(auth[1]).decode().partition(":")
    elif auth is not None:
        scheme, token = auth
    return kopf.ConnectionInfo(
        server=credentials.server,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        scheme=scheme,
        token=token,
        username=username,
        password=password,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
        default_namespace=credentials.default_namespace,
        expiration=credentials.expiration,
    )
