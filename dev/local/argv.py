"""Command-line text as the kubelet and argparse read it: `$(VAR)` expansion, and flags matched in
both `--flag value` and `--flag=value` forms (argparse keeps a flag's last occurrence)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand_vars(value: str, env: dict[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion: defined names are replaced, `$$` escapes, the rest stays."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return VAR_REF.sub(sub, value)


def flag_value(args: list[str], flag: str) -> str | None:
    """The last value given for `flag` (argparse keeps the last occurrence), or None."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


def map_flag_values(args: list[str], flag: str, fn: Callable[[str], str]) -> list[str]:
    out = list(args)
    for i, arg in enumerate(out):
        if arg == flag and i + 1 < len(out):
            out[i + 1] = fn(out[i + 1])
        elif arg.startswith(flag + "="):
            out[i] = f"{flag}={fn(arg[len(flag) + 1 :])}"
    return out


def set_flag(args: list[str], flag: str, value: str) -> list[str]:
    if flag_value(args, flag) is None:
        return [*args, flag, value]
    return map_flag_values(args, flag, lambda _: value)


def drop_flags(args: list[str], flags: Iterable[str]) -> list[str]:
    """Remove each of `flags` with its value."""
    flags = set(flags)
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in flags:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out
