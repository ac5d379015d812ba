"""Where the development tools keep things: the repository, and the cache every build fills once
(``~/.cache/epd-operator``, or ``EPD_CACHE``), which fresh clones and later runs reuse."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("EPD_CACHE", Path.home() / ".cache" / "epd-operator"))
