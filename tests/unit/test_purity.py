"""The unit tier's purity guard (tests/unit/conftest.py) stops a process start and a socket connect or bind
at the call, and fails the test that made it."""

from __future__ import annotations

import socket
import subprocess

import pytest

from tests.unit.conftest import ImpureTest, guard


def test_a_process_a_connect_and_a_bind_are_stopped_at_the_call():
    with pytest.raises(ImpureTest, match="starts a process"):
        subprocess.run(["true"], check=False)
    with socket.socket() as sock:
        with pytest.raises(ImpureTest, match="connects a socket"):
            sock.connect(("127.0.0.1", 9))
        with pytest.raises(ImpureTest, match="binds a socket"):
            sock.bind(("127.0.0.1", 0))
    assert len(guard.violations) == 3
    guard.violations.clear()  # recorded for the report that fails the test; this test made them on purpose
