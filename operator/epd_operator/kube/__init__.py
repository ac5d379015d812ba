"""Kubernetes access for the operator, the router and epdctl: one client on `kubernetes_asyncio`.

- `credentials`: in-cluster service account, else every `KUBECONFIG` path merged (exec plugins run).
- `resources`: the kinds we read and write (`CHILD_RESOURCES` are those the operator manages).
- `client`: `Kube` (get/list/apply/create/replace/patch_status/delete) and its one `ApiError`.
- `watch`: `ListWatch`, list then watch with re-lists on 410 Gone.
- `connections`: `closing_connections()`, every connection made on the loop while entered closed when it exits.
"""

from .client import FIELD_MANAGER, REQUEST_ERRORS, ApiError, Kube
from .connections import closing_connections
from .credentials import (
    SERVICE_ACCOUNT_CA,
    SERVICE_ACCOUNT_DIR,
    SERVICE_ACCOUNT_NAMESPACE,
    SERVICE_ACCOUNT_TOKEN,
    Credentials,
    CredentialsError,
    CredentialSource,
    connection_info,
    load_credentials,
)
from .resources import CHILD_RESOURCES, ENDPOINT_SLICE, EPD, EVENT, LEASE, POD, Resource, child_resource, resource_of
from .watch import RETRY_DELAY, ListWatch

__all__ = [
    "CHILD_RESOURCES",
    "ENDPOINT_SLICE",
    "EPD",
    "EVENT",
    "FIELD_MANAGER",
    "LEASE",
    "POD",
    "REQUEST_ERRORS",
    "RETRY_DELAY",
    "SERVICE_ACCOUNT_CA",
    "SERVICE_ACCOUNT_DIR",
    "SERVICE_ACCOUNT_NAMESPACE",
    "SERVICE_ACCOUNT_TOKEN",
    "ApiError",
    "CredentialSource",
    "Credentials",
    "CredentialsError",
    "Kube",
    "ListWatch",
    "Resource",
    "child_resource",
    "closing_connections",
    "connection_info",
    "load_credentials",
    "resource_of",
]
