"""Pure rendering: an EPDDeployment becomes the Kubernetes objects that run it.

`render(epd)` is what the operator applies and `epdctl render` prints; it does no I/O.
"""

from .manifests import config_hash, render, tier_hashes
from .vllm import serve_command

__all__ = ["config_hash", "render", "serve_command", "tier_hashes"]
