"""The kopf registrations (controller/handlers.py): what is watched, with which label selector, and where each
event goes; and the kopf settings the operator runs with. kopf running them against the API server:
tests/integration."""

from __future__ import annotations

import logging
from typing import Any, cast

import kopf

from epd_operator.controller import handlers
from epd_operator.controller.reconciler import Reconciler
from epd_operator.kube import CHILD_RESOURCES, Credentials, Kube

MANAGED = {"app.kubernetes.io/managed-by": "epd-operator"}


class Seen:
    """The reconciler's entry points, recording what reaches them."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.cache = self

    def record(self, body: dict) -> None:
        self.calls.append(("cached", body))

    def epd_event(self, kind: str | None, body: dict) -> None:
        self.calls.append(("epd", kind, body))

    def child_event(self, kind: str | None, body: dict) -> None:
        self.calls.append(("child", kind, body))

    def pod_event(self, kind: str | None, body: dict) -> None:
        self.calls.append(("pod", kind, body))


class Relogin:
    def __init__(self) -> None:
        self.count = 0

    async def relogin(self) -> Credentials:
        self.count += 1
        return Credentials.from_token("https://api:6443", f"token-{self.count}", namespace="ns")


def all_of(part: Any) -> list[Any]:
    """A registry part's handlers, untyped: the tests call them with only the arguments they use."""
    return list(part.get_all_handlers())


def registry(seen: Seen, kube: Any = None) -> kopf.OperatorRegistry:
    return handlers.build_registry(cast(Reconciler, seen), cast(Kube, kube))


def test_every_child_kind_and_the_pods_are_watched_and_indexed_by_our_label_only():
    reg = registry(Seen())
    watched = {(h.selector.group, h.selector.version, h.selector.any_name): h for h in all_of(reg._watching)}
    indexed = {(h.selector.group, h.selector.version, h.selector.any_name): h for h in all_of(reg._indexing)}
    children = {(r.group, r.api_version.rpartition("/")[2], r.plural) for r in CHILD_RESOURCES.values()}
    assert set(indexed) == children | {("", "v1", "pods")}
    assert set(watched) == set(indexed) | {("serving.epd.dev", "v1alpha1", "epddeployments")}
    assert watched["serving.epd.dev", "v1alpha1", "epddeployments"].labels is None
    for selector, handler in indexed.items():
        assert handler.labels == MANAGED and handler.id == f"{selector[2]}-cached"
        assert watched[selector].labels == MANAGED and watched[selector].id == f"{selector[2]}-changed"


async def test_events_reach_the_reconciler_and_indexing_fills_its_cache():
    seen = Seen()
    reg = registry(seen)
    watched = {h.selector.any_name: h for h in all_of(reg._watching)}
    indexed = {h.selector.any_name: h for h in all_of(reg._indexing)}
    epd = {"kind": "EPDDeployment", "metadata": {"name": "a"}}
    deployment = {"kind": "Deployment", "metadata": {"name": "a-decode"}}
    pod = {"kind": "Pod", "metadata": {"name": "a-decode-x"}}
    await watched["epddeployments"].fn(event={"type": "MODIFIED", "object": epd})
    await watched["deployments"].fn(event={"type": "DELETED", "object": deployment})
    await watched["pods"].fn(event={"type": None, "object": pod})
    assert indexed["deployments"].fn(body=kopf.Body(cast(Any, deployment))) is None  # kopf keeps no index of its own
    indexed["pods"].fn(body=kopf.Body(cast(Any, pod)))
    assert seen.calls == [
        ("epd", "MODIFIED", epd),
        ("child", "DELETED", deployment),
        ("pod", None, pod),
        ("cached", deployment),
        ("cached", pod),
    ]
    assert type(seen.calls[-1][1]) is dict


async def test_kopf_logs_in_afresh_each_time_it_asks():
    kube = Relogin()
    reg = registry(Seen(), kube)
    (login,) = all_of(reg._activities)
    assert login.activity.value == "authentication"
    first = await login.fn()
    second = await login.fn()
    assert (first.server, first.token, first.default_namespace) == ("https://api:6443", "token-1", "ns")
    assert second.token == "token-2" and kube.count == 2


def test_the_settings_keep_kopf_from_writing_scanning_or_electing(monkeypatch):
    monkeypatch.setattr(logging.getLogger("kopf.objects"), "level", logging.NOTSET)
    settings = handlers.build_settings()
    assert settings.posting.enabled is False
    assert isinstance(settings.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert settings.persistence.progress_storage.prefix == "kopf.serving.epd.dev"
    assert isinstance(settings.persistence.diffbase_storage, kopf.AnnotationsDiffBaseStorage)
    assert settings.persistence.diffbase_storage.prefix == "kopf.serving.epd.dev"
    assert settings.peering.standalone is True
    assert settings.scanning.disabled is True
    assert (settings.watching.server_timeout, settings.watching.client_timeout) == (300, 330)
    assert settings.networking.request_timeout == 60
    assert logging.getLogger("kopf.objects").level == logging.WARNING


def test_children_and_pods_are_filtered_by_the_api_server():
    selectors = handlers.build_settings().watching.label_selectors
    expected = {handlers._selector(r) for r in CHILD_RESOURCES.values()} | {("", "v1", "pods")}
    assert {(s.group, s.version, s.any_name) for s in selectors} == expected
    assert set(selectors.values()) == {"app.kubernetes.io/managed-by=epd-operator"}
    assert handlers.PODS_WATCHED == ("", "v1", "pods")
    assert handlers._selector(CHILD_RESOURCES["Deployment"]) == ("apps", "v1", "deployments")
