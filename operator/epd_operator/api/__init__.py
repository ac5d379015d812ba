"""The EPDDeployment API (serving.epd.dev/v1alpha1): models, validation and the generated CRD."""

from .spec import API_VERSION, GROUP, KIND, PLURAL, SHORT_NAME, VERSION, EPDDeployment, EPDDeploymentSpec
from .status import EPDDeploymentStatus
from .tiers import Tier
from .validation import FieldError, SpecError, parse_epd

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "SHORT_NAME",
    "VERSION",
    "EPDDeployment",
    "EPDDeploymentSpec",
    "EPDDeploymentStatus",
    "FieldError",
    "SpecError",
    "Tier",
    "parse_epd",
]
