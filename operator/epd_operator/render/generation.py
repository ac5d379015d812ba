"""The compatibility generation: what producers and consumers must agree on to exchange embeddings and KV.

An encoder's EC output and a prefill's KV blocks are read by other pods. Their wire format depends on the
vLLM build (the image), the connectors and their settings, and the model (its embedding shapes), so a
change of any of these makes old and new pods unable to talk. Every vLLM pod carries the generation as a
label; the router pairs encoder, prefill and decode only within one generation, so tiers may roll at
their own pace. Anything else (resources, replicas, probes, placement) leaves the generation alone.
"""

from __future__ import annotations

import hashlib
import json

from ..api.spec import EPDDeployment
from .naming import tier_of, vllm_roles

# Connector settings that only the janitor or the Mooncake master's placement read: changing them must
# not roll every tier.
EC_SETTINGS_OUTSIDE_HANDSHAKE = {"sharedStorage": {"maxSize", "ttlSeconds"}, "mooncake": {"master"}}
# The prefill's side-channel port travels in each request's kv_transfer_params (`remote_port`), so a
# decode of the old port setting still finds a prefill of the new one.
KV_SETTINGS_OUTSIDE_HANDSHAKE = {"nixl": {"sideChannelPort"}}
# Short enough to read in `kubectl get pods -L`, long enough that two generations of one EPDDeployment
# never collide in practice (40 bits).
GENERATION_LENGTH = 10


def compatibility_inputs(epd: EPDDeployment) -> dict[str, object]:
    """What the EC and KV handshakes depend on, and nothing else."""
    spec = epd.spec
    return {
        "model": spec.model.name,
        "source": spec.model.source.json_data() if spec.model.source else None,
        "images": {role: tier_of(epd, role).image or spec.image for role in vllm_roles(epd)},
        "ecTransfer": spec.ecTransfer.json_data(exclude_none=True, exclude=EC_SETTINGS_OUTSIDE_HANDSHAKE),
        "kvTransfer": (
            spec.kvTransfer.json_data(exclude_none=True, exclude=KV_SETTINGS_OUTSIDE_HANDSHAKE)
            if spec.kvTransfer
            else None
        ),
    }


def compatibility_generation(epd: EPDDeployment) -> str:
    payload = json.dumps(compatibility_inputs(epd), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()[:GENERATION_LENGTH]
