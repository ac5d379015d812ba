"""vLLM for CPU on Intel CPUs with AMX: ask Linux for the AMX tile state when Python starts.

Linux (5.16 and later) gives a process the AMX tile data state (XTILEDATA) only after the process
asked for it with ``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``; an AMX instruction run
before that kills the process with SIGILL. vLLM 0.32's CPU attention kernel
(``cpu_attention_with_kv_cache``) takes its AMX path without asking: a decode worker whose first
forward pass runs that kernel (after the NIXL connector loaded the prompt's KV, before any oneDNN
operation that would have asked) dies with ``Illegal instruction``. Asking once per process, at
interpreter start, is what this module does. The permission is per process (threads share it) and a
forked child inherits it; a spawned one starts a new interpreter and asks again.

``dev/builds/venv.py`` installs this file into the vLLM CPU venv as the module ``epd_cpu_amx`` with a
``.pth`` file that imports it, so every Python process of that venv asks: the local runner's tiers,
``make demo``, the e2e tests, the benchmarks, and the node's image (``localhost/epd-vllm-cpu``), which
carries the same venv. It asks only where the CPU reports AMX (``amx_tile`` in /proc/cpuinfo) on
x86-64 Linux; elsewhere it does nothing. GPU images do not need it: there vLLM's attention runs on
the GPU, and PyTorch's own CPU kernels ask before they use AMX.

The module must stay importable by any Python 3 without the project on the path (a ``.pth`` line
imports it in every interpreter start of the venv), so it imports only the standard library.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterable

SYS_ARCH_PRCTL = 158  # x86-64's syscall number
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18
CPUINFO = "/proc/cpuinfo"

# What the request came to in this process: "granted", "no AMX" (nothing asked), or "refused: ...".
STATE = "not asked"

Syscall = Callable[..., int]


def cpu_has_amx(cpuinfo: Iterable[str]) -> bool:
    """Whether the first CPU's flags in /proc/cpuinfo's lines include AMX tiles (reads no further)."""
    for line in cpuinfo:
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return "amx_tile" in value.split()
    return False


def _libc_syscall() -> Syscall:
    libc = ctypes.CDLL(None, use_errno=True)
    call: Syscall = libc.syscall
    return call


def granted(syscall: Syscall | None = None) -> bool:
    """Whether this process may use the AMX tile state now (ARCH_GET_XCOMP_PERM's bit 18)."""
    call = syscall or _libc_syscall()
    mask = ctypes.c_uint64(0)
    if call(ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(ARCH_GET_XCOMP_PERM), ctypes.byref(mask)) != 0:
        return False
    return bool(mask.value & (1 << XFEATURE_XTILEDATA))


def request(cpuinfo: Iterable[str], machine: str, system: str, syscall: Syscall | None = None) -> str:
    """Ask for the AMX tile state where the CPU has it; returns what happened (see STATE)."""
    if system != "Linux" or machine not in ("x86_64", "AMD64") or not cpu_has_amx(cpuinfo):
        return "no AMX"
    call = syscall or _libc_syscall()
    if call(ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(ARCH_REQ_XCOMP_PERM), ctypes.c_long(XFEATURE_XTILEDATA)) == 0:
        return "granted"
    return f"refused: {os.strerror(ctypes.get_errno())}"


def _at_start() -> str:
    uname = os.uname()
    try:
        with open(CPUINFO, encoding="ascii", errors="replace") as cpuinfo:
            return request(cpuinfo, uname.machine, uname.sysname)
    except OSError:
        return "no AMX"


STATE = _at_start()
