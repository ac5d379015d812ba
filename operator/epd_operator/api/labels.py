"""Label and annotation keys the operator writes and reads: one home for each.

The router discovers its backends by these labels, the controller finds its children by them, and the
API refuses them in users' pod overlays, so they are a contract between all three.
"""

from __future__ import annotations

NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
ROLE_LABEL = "serving.epd.dev/role"
# On vLLM pods: the compatibility generation (render/generation.py). The router pairs encoder, prefill
# and decode pods only when this label agrees.
GENERATION_LABEL = "serving.epd.dev/compat-generation"
MANAGED_BY = "epd-operator"
APP_NAME = "epd"

# On pod templates: a hash of what the pods run, so a change rolls only the tiers it touches.
CONFIG_HASH_ANNOTATION = "serving.epd.dev/config-hash"
# On every child: a hash of what the operator last applied (drift and change detection).
APPLIED_HASH_ANNOTATION = "serving.epd.dev/applied-hash"

OPERATOR_POD_LABELS = (NAME_LABEL, INSTANCE_LABEL, COMPONENT_LABEL, MANAGED_BY_LABEL, ROLE_LABEL, GENERATION_LABEL)
OPERATOR_POD_ANNOTATIONS = (CONFIG_HASH_ANNOTATION,)
