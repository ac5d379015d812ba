"""The unit tier is pure: a test here starts no process and opens no network connection or listener.

Python's audit events (PEP 578) report every process start (subprocess, os.fork/exec/spawn/posix_spawn,
os.system, and so multiprocessing) and every socket connect, bind and name lookup. While a unit test runs
(its setup, call and teardown), such an event raises :class:`ImpureTest` at the call that caused it, and
the test fails naming it even when the code under test catches the error. A test that needs processes or
loopback sockets belongs in ``tests/loopback``; one that needs the control plane in ``tests/integration``.

C code that opens sockets without Python's socket module (uvloop's libuv transports) raises no audit
event; the unit tier runs on asyncio's own event loop, which does.
"""

from __future__ import annotations

import sys
from collections.abc import Generator
from typing import Any

import pytest

FORBIDDEN = {
    "subprocess.Popen": "starts a process",
    "os.fork": "forks a process",
    "os.forkpty": "forks a process",
    "os.exec": "executes a program",
    "os.spawn": "starts a process",
    "os.posix_spawn": "starts a process",
    "os.system": "runs a shell command",
    "socket.connect": "connects a socket",
    "socket.bind": "binds a socket",
    "socket.getaddrinfo": "resolves a host name",
    "socket.gethostbyname": "resolves a host name",
}


class ImpureTest(RuntimeError):
    """Raised at the call that makes a unit test impure."""


class _Guard:
    def __init__(self) -> None:
        self.active = False
        self.violations: list[str] = []

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active or event not in FORBIDDEN:
            return
        what = f"{event} {FORBIDDEN[event]}: {_describe(args)}"
        self.violations.append(what)
        raise ImpureTest(f"unit tests are pure; {what} (move the test to tests/loopback)")


def _describe(args: tuple[Any, ...]) -> str:
    shown = []
    for arg in args:
        text = repr(arg)
        shown.append(text if len(text) <= 120 else text[:117] + "...")
    return ", ".join(shown)


guard = _Guard()
sys.addaudithook(guard)


def _guarded(item: pytest.Item, phase: str) -> Generator[None, None, None]:
    guard.violations.clear()
    guard.active = True
    try:
        return (yield)
    finally:
        guard.active = False
        if guard.violations:
            # replaces whatever the test raised: a caught ImpureTest can surface as any other failure
            raise pytest.fail.Exception(
                f"{item.nodeid} is not pure ({phase}): " + "; ".join(dict.fromkeys(guard.violations)),
                pytrace=False,
            )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _guarded(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _guarded(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _guarded(item, "teardown"))
