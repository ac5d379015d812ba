"""Size an EPDDeployment for a 2-core CPU machine, through its own spec fields.

The examples are sized for GPU nodes: a 114688-token encoder budget (vLLM then profiles the
vision tower with hundreds of dummy videos), CUDA-graph/compile warm-up, 32k contexts. On two
cores that turns a 30 s start into minutes. Rather than editing rendered flags, the local run
changes the spec the way a user would (`maxModelLen`, `maxNumBatchedTokens`, `extraArgs`), so
`render()` still produces every flag and the result says exactly what was changed.
"""

from __future__ import annotations

import copy
from typing import Any

MAX_MODEL_LEN = 2048
# Large enough for a few 64-token images of the tiny model per step, small enough to profile fast.
MAX_NUM_BATCHED_TOKENS = 2048
TIER_ARGS = [
    "--enforce-eager",  # no torch.compile warm-up (a minute on two cores)
    "--max-num-seqs",
    "4",
]
MAX_IMAGES = 4


def media_limit(videos: int) -> list[str]:
    # Every video allowed is profiled at start with a dummy video as long as the token budget
    # permits: none unless asked for.
    return ["--limit-mm-per-prompt", f'{{"image":{MAX_IMAGES},"video":{videos}}}']


TIERS = ("encoder", "prefill", "decode")


def fit_to_cpu(spec_obj: dict[str, Any], videos: int = 0) -> tuple[dict[str, Any], list[str]]:
    """A copy of an EPDDeployment (as a mapping) sized for this machine, and what was changed.
    `videos`: how many videos one request may carry (0: images only, the quickest start)."""
    obj = copy.deepcopy(spec_obj)
    spec = obj.setdefault("spec", {})
    changes: list[str] = []
    model = spec.setdefault("model", {})
    if model.get("maxModelLen") != MAX_MODEL_LEN:
        changes.append(f"model.maxModelLen {model.get('maxModelLen')} -> {MAX_MODEL_LEN}")
        model["maxModelLen"] = MAX_MODEL_LEN
    for name in TIERS:
        tier = spec.get(name)
        if tier is None:
            continue
        if tier.get("maxNumBatchedTokens", MAX_NUM_BATCHED_TOKENS + 1) > MAX_NUM_BATCHED_TOKENS:
            changes.append(f"{name}.maxNumBatchedTokens -> {MAX_NUM_BATCHED_TOKENS}")
            tier["maxNumBatchedTokens"] = MAX_NUM_BATCHED_TOKENS
        added = [*TIER_ARGS, *media_limit(videos)]
        tier["extraArgs"] = [*tier.get("extraArgs", []), *added]
        changes.append(f"{name}.extraArgs += {' '.join(added)}")
    return obj, changes
