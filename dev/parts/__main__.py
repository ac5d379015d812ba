"""``python -m dev.parts list | build NAME...``: the registered cluster parts (``dev/parts/registry.py``), and
their builds into the cache (``make k8s-node`` and ``make k8s`` build theirs so)."""

from __future__ import annotations

import argparse
import sys

from dev.builds.go_module import GoMissing
from dev.parts.registry import PARTS, part


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.parts", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="every registered part, whether it is built, and what it serves")
    build = sub.add_parser("build", help="build (or find) the parts' binaries; print their paths")
    build.add_argument("names", nargs="+", choices=list(PARTS), metavar="NAME", help=", ".join(PARTS))
    args = parser.parse_args(argv)
    if args.command == "list":
        for name, kind in PARTS.items():
            state = "built" if kind().built() else "not built"
            print(f"{name:20} {state:10} {kind.starts:25} {kind.summary}")
        return 0
    try:
        for name in args.names:
            for path in part(name)().build():
                print(path)
    except GoMissing as exc:
        print(f"python -m dev.parts build: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
