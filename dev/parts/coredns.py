"""CoreDNS (github.com/coredns/coredns), the local cluster's DNS, built once from the Go module proxy
into ``~/.cache/epd-operator/coredns/<version>/``.

The release's own ``main`` compiles in every plugin (cloud DNS providers' SDKs included). The binary
built here is CoreDNS's ``coremain`` with the plugins the cluster's Corefile uses (``PLUGINS``): a
``main`` package importing those plugins, built static (``CGO_ENABLED=0``) in the release's module
against its own go.mod and go.sum (``dev/builds/go_module.py``). Cold (empty Go build cache, dependencies downloaded): 21.5 minutes on a 2-core machine at a
load average of 14-20, 5.7 CPU-minutes.

    python -m dev.parts.coredns      # build (or find) it and print its path
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from dev.builds import go_module

MODULE = "github.com/coredns/coredns"
VERSION = "v1.15.0"
# The plugins dev/parts/cluster_dns.py's Corefile names; the rest of CoreDNS's directives stay known to the
# Corefile parser but are not compiled in.
PLUGINS = ("errors", "health", "ready", "kubernetes", "cache", "template")

_MAIN = """package main

import (
\t"github.com/coredns/coredns/coremain"
{imports}
)

func main() {{
\tcoremain.Run()
}}
"""

# Keyed by the version and the plugin set.
COREDNS = go_module.GoBinary(
    "coredns",
    MODULE,
    VERSION,
    "./cmd/epd-coredns",
    f"coredns-{hashlib.sha256(' '.join(PLUGINS).encode()).hexdigest()[:8]}",
    files={"cmd/epd-coredns/main.go": _MAIN.format(imports="\n".join(f'\t_ "{MODULE}/plugin/{p}"' for p in PLUGINS))},
)


def ensure() -> Path:
    """The CoreDNS binary, built when absent."""
    return go_module.ensure(COREDNS)


if __name__ == "__main__":
    print(ensure())
