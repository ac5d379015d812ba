"""controller/reconciler: which watch events cost a full pass (and so a server-side dry run of the plan)
and which only a status refresh, in particular while consumers wait for an encoder of their new
generation (controller/rollout.py). The reconciler runs on its own cache and a recording stand-in for
the API server (tests/support/recording_kube.py); its passes are awaited one by one."""

from __future__ import annotations

import copy
from typing import Any

from epd_operator.api.labels import GENERATION_LABEL, INSTANCE_LABEL, ROLE_LABEL
from epd_operator.api.validation import parse_epd
from epd_operator.controller import apply
from epd_operator.controller.metrics import Metrics
from epd_operator.controller.reconciler import Reconciler
from epd_operator.controller.workqueue import FULL, STATUS
from epd_operator.render import render
from epd_operator.render.generation import compatibility_generation
from tests.support.recording_kube import RecordingKube, as_kube
from tests.support.render_examples import SHARED_STORAGE, example_document

NS, NAME, UID = "ns", "vl", "uid-vl"
KEY = (NS, NAME)
NEW_IMAGE = "vllm/vllm-openai:v0.33.1"


def epd_body(generation: int, revision: int, **spec: Any) -> dict[str, Any]:
    doc = copy.deepcopy(example_document(SHARED_STORAGE))
    doc["metadata"] = {
        "name": NAME,
        "namespace": NS,
        "uid": UID,
        "generation": generation,
        "resourceVersion": str(revision),
    }
    doc["spec"].update(spec)
    return doc


def spec_only(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "status"}


def pod(role: str, generation: str, ready: bool, revision: int, n: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{NAME}-{role}-{generation[:6]}-{n}",
            "namespace": NS,
            "uid": f"pod-{role}-{generation}-{n}",
            "resourceVersion": str(revision),
            "labels": {INSTANCE_LABEL: NAME, ROLE_LABEL: role, GENERATION_LABEL: generation},
        },
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


async def queued(r: Reconciler) -> int | None:
    """The level queued for the EPDDeployment since the last call (None: nothing), taken off the queue."""
    if not len(r.queue):
        return None
    key, level = await r.queue.get()
    r.queue.done(key)
    assert key == KEY
    return level


def waiting_for_encoders(kube: RecordingKube) -> bool:
    conditions = {c["type"]: c for c in kube.statuses()[-1]["conditions"]}
    return conditions["Progressing"]["reason"] == "WaitingForEncoders"


async def held_reconciler() -> tuple[Reconciler, RecordingKube, str, str, dict[str, Any]]:
    """A reconciler whose EPDDeployment moved to a new encoder image (a new generation) while the
    children of the old one run: after its full pass the decode tier is held."""
    kube = RecordingKube()
    r = Reconciler(as_kube(kube), Metrics(), identity="test")
    before, after = epd_body(1, 10), epd_body(2, 20)
    after["spec"]["encoder"] = {**after["spec"]["encoder"], "image": NEW_IMAGE}
    old, new = compatibility_generation(parse_epd(before)), compatibility_generation(parse_epd(spec_only(after)))
    assert old != new
    kube.stored[("EPDDeployment", NS, NAME)] = after
    r.epd_event(None, after)
    owner = apply.owner_reference(after)
    for obj in render(parse_epd(before)):
        live = apply.adopt(obj, owner)
        live["metadata"].update(uid=f"uid-{obj['kind']}-{obj['metadata']['name']}", resourceVersion="5")
        r.child_event(None, live)
    r.pod_event(None, pod("encoder", old, ready=True, revision=6))
    r.pod_event(None, pod("decode", old, ready=True, revision=7))
    assert await queued(r) == FULL
    assert await r.full_pass(KEY) == "success"
    assert kube.dry_runs() > 0 and waiting_for_encoders(kube)
    return r, kube, old, new, after


async def test_while_consumers_are_held_only_a_ready_encoder_of_the_awaited_generation_asks_for_a_full_pass():
    r, kube, old, new, _ = await held_reconciler()
    decode = r.cache.get("Deployment", NS, f"{NAME}-decode")
    assert decode is not None
    # A new encoder pod that cannot start, over and over; consumer pods and the held Deployment changing;
    # an encoder of the old generation Ready: each refreshes the status only.
    for revision in range(100, 105):
        r.pod_event("MODIFIED", pod("encoder", new, ready=False, revision=revision))
        assert await queued(r) == STATUS
    r.pod_event("MODIFIED", pod("decode", old, ready=True, revision=110))
    r.pod_event("MODIFIED", pod("encoder", old, ready=True, revision=111, n=1))
    r.child_event("MODIFIED", {**decode, "metadata": {**decode["metadata"], "resourceVersion": "112"}})
    assert await queued(r) == STATUS
    # A Ready encoder pod of the awaited generation that is being deleted ends nothing.
    r.pod_event("DELETED", pod("encoder", new, ready=True, revision=113, n=2))
    assert await queued(r) == STATUS
    dry_runs = kube.dry_runs()
    assert await r.status_pass(KEY) == "success"
    assert kube.dry_runs() == dry_runs and waiting_for_encoders(kube)

    # The awaited encoder Ready: a full pass, which applies the consumers and ends the hold.
    r.pod_event("MODIFIED", pod("encoder", new, ready=True, revision=120))
    assert await queued(r) == FULL
    assert await r.full_pass(KEY) == "success"
    applied = {call[1] for call in kube.calls if call[0] == "apply" and not call[4]}
    assert ("Deployment", f"{NAME}-decode") in applied
    assert not waiting_for_encoders(kube)
    r.pod_event("MODIFIED", pod("encoder", new, ready=True, revision=121))
    assert await queued(r) == STATUS  # nothing is held any more


async def test_a_spec_that_turns_invalid_drops_the_hold():
    r, kube, _, new, _ = await held_reconciler()
    invalid = copy.deepcopy(kube.stored[("EPDDeployment", NS, NAME)])
    invalid["metadata"].update(generation=3, resourceVersion="200")
    invalid["spec"]["decode"] = {**invalid["spec"]["decode"], "replicas": -1}
    kube.stored[("EPDDeployment", NS, NAME)] = invalid
    r.epd_event("MODIFIED", invalid)
    assert await queued(r) == FULL
    dry_runs = kube.dry_runs()
    assert await r.full_pass(KEY) == "invalid"
    assert kube.dry_runs() == dry_runs and not waiting_for_encoders(kube)
    # An encoder of the generation the hold waited for turning Ready no longer applies anything.
    r.pod_event("MODIFIED", pod("encoder", new, ready=True, revision=210))
    assert await queued(r) == STATUS


async def test_the_watch_event_of_a_full_passs_own_status_write_queues_nothing():
    kube = RecordingKube()
    r = Reconciler(as_kube(kube), Metrics(), identity="test")
    body = epd_body(1, 10)
    kube.stored[("EPDDeployment", NS, NAME)] = body
    r.epd_event(None, body)
    assert await queued(r) == FULL
    kube.on_status = lambda written: r.epd_event("MODIFIED", written)  # delivered before the pass ends
    assert await r.full_pass(KEY) == "success"
    assert kube.statuses() and await queued(r) is None
