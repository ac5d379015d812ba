"""Building blocks of the `EPDDeployment` API shared by its subjects: the strict base model, the upstream
Kubernetes types fields embed (checked against their generated schemas), bounds on lists and labels, and the
small leaf models (environment variables, resources, Secret references)."""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from . import kube_schemas
from .quantity import Quantity

# A free-form Kubernetes object kept as is (the status, which only the operator writes).
KubeObject = dict[str, Any]

# Bounds on the pass-through lists: they keep the CEL rules that walk them within the API server's cost limits.
MAX_LIST_ITEMS = 64
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"


def _kube_check(name: str, value: dict[str, Any]) -> dict[str, Any]:
    """`value` checked against the upstream type `name`'s schema (bound to each field's type by KubeType at
    import, called at validation: a module-level function, not a closure made at import)."""
    problems = kube_schemas.validate(name, value)  # every path is below the value ('.key', '[0]'): it is a dict
    if problems:
        raise PydanticCustomError(
            "kube_schema",
            "{summary}",
            {"summary": "; ".join(f"{p}: {m}" for p, m in problems), "problems": problems},
        )
    return value


@dataclass(frozen=True)
class KubeType:
    """An upstream Kubernetes type (`"Affinity"`, `"MetricSpec"`, ...) on a `dict[str, Any]` field: its
    generated schema in the CRD, the same schema checked in Python with a path for every problem, and
    its name in the API reference."""

    name: str

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(functools.partial(_kube_check, self.name), handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return copy.deepcopy(kube_schemas.schema(self.name))  # a cached document: the caller may add to it


# The upstream types fields embed (type aliases a type checker reads as plain dicts).
Affinity = Annotated[KubeObject, KubeType("Affinity")]
EnvFromSource = Annotated[KubeObject, KubeType("EnvFromSource")]
EnvVarSource = Annotated[KubeObject, KubeType("EnvVarSource")]
HorizontalPodAutoscalerBehavior = Annotated[KubeObject, KubeType("HorizontalPodAutoscalerBehavior")]
MetricSpec = Annotated[KubeObject, KubeType("MetricSpec")]
KEDATrigger = Annotated[KubeObject, KubeType("KEDATrigger")]
KEDAFallback = Annotated[KubeObject, KubeType("KEDAFallback")]
PodSecurityContext = Annotated[KubeObject, KubeType("PodSecurityContext")]
SecurityContext = Annotated[KubeObject, KubeType("SecurityContext")]
Toleration = Annotated[KubeObject, KubeType("Toleration")]
TopologySpreadConstraint = Annotated[KubeObject, KubeType("TopologySpreadConstraint")]
Volume = Annotated[KubeObject, KubeType("Volume")]
VolumeMount = Annotated[KubeObject, KubeType("VolumeMount")]


LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]
# Bounds on `extraArgs`: a CEL rule reads the consumer tiers' arguments (scale to zero needs consumers that
# encode media), and the API server prices a rule by the longest list and strings it may walk.
MAX_EXTRA_ARGS = 256
ExtraArg = Annotated[str, Field(max_length=4096)]


class Strict(BaseModel):
    # strict: no coercion (`replicas: "2"`), because the CRD's schema refuses it too and
    # `epdctl validate` must not pass what `kubectl apply` rejects.
    model_config = ConfigDict(extra="forbid", populate_by_name=True, validate_default=True, strict=True)

    def json_data(self, **options: Any) -> dict[str, Any]:
        """The model as JSON-native data, as rendered objects carry it (lists, not tuples; strings, not
        enums): pydantic's JSON mode with `model_dump`'s options."""
        return self.model_dump(mode="json", **options)


class SecretKeyRef(Strict):
    name: str = Field(min_length=1, description="Secret name.")
    key: str = Field("token", min_length=1, description="Key inside the Secret.")


class EnvVar(Strict):
    name: str = Field(min_length=1, description="Variable name.")
    value: str | None = Field(None, description="Literal value.")
    valueFrom: EnvVarSource | None = Field(
        None, description="core/v1 EnvVarSource (`secretKeyRef`, `configMapKeyRef`, `fieldRef`, ...)."
    )


class Resources(Strict):
    limits: dict[str, Quantity] = Field(default_factory=dict, description="Container limits, e.g. `nvidia.com/gpu: 1`.")
    requests: dict[str, Quantity] = Field(default_factory=dict, description="Container requests.")
