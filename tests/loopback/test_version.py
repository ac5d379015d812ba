"""Every command (`epdctl`, `epd-router`, `epd-operator`) reports the package version, run as a process."""

import subprocess
import sys

import pytest

from epd_operator import __version__


@pytest.mark.parametrize(
    "module, prog",
    [
        ("epd_operator.cli", "epdctl"),
        ("epd_operator.router.main", "epd-router"),
        ("epd_operator.controller.main", "epd-operator"),
    ],
)
def test_every_command_reports_its_version(module, prog):
    r = subprocess.run(
        [sys.executable, "-c", f"import sys; from {module} import main; sys.argv[0] = {prog!r}; main()", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout.strip() == f"{prog} {__version__}", r.stderr
