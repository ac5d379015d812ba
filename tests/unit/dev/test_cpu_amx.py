"""The AMX permission request every process of the vLLM CPU venv makes (`dev/builds/cpu_vllm/amx.py`)."""

from __future__ import annotations

import ctypes
import importlib.util
import sys
from types import ModuleType
from typing import Any

import pytest

from dev.builds import venv

XEON = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu avx512f amx_bf16 amx_tile amx_int8\n"
EPYC = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 sha_ni\n"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("amx_under_test", venv.AMX_SOURCE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


amx = _load()


class Syscalls:
    """Records arch_prctl calls; answers with `result` and, for GET, writes `mask`."""

    def __init__(self, result: int = 0, mask: int = 0) -> None:
        self.calls: list[tuple[int, ...]] = []
        self.result, self.mask = result, mask

    def __call__(self, number: Any, code: Any, arg: Any) -> int:
        if code.value == amx.ARCH_GET_XCOMP_PERM:
            arg._obj.value = self.mask
            self.calls.append((number.value, code.value))
        else:
            self.calls.append((number.value, code.value, arg.value))
        return self.result


@pytest.mark.parametrize(
    ("cpuinfo", "expected"),
    [
        (XEON, True),
        (EPYC, False),
        ("flags\t: avx512f amx_bf16 amx_int8\n", False),  # the tile state is amx_tile's
        ("flags\t: fpu amx_tile_x\n", False),  # a whole flag, not a prefix
        ("processor\t: 0\n", False),
        (EPYC + "\n" + XEON, False),  # the first CPU's flags decide: the reader stops there
    ],
)
def test_amx_is_read_from_the_first_flags_line(cpuinfo, expected):
    assert amx.cpu_has_amx(cpuinfo.splitlines()) is expected


def test_a_cpu_with_amx_asks_for_the_tile_data_state_once():
    syscalls = Syscalls()
    assert amx.request(XEON.splitlines(), "x86_64", "Linux", syscalls) == "granted"
    assert syscalls.calls == [(158, 0x1023, 18)]


@pytest.mark.parametrize(
    ("cpuinfo", "machine", "system"),
    [(EPYC, "x86_64", "Linux"), (XEON, "aarch64", "Linux"), (XEON, "x86_64", "Darwin")],
)
def test_nothing_is_asked_where_there_is_no_amx_or_no_such_call(cpuinfo, machine, system):
    syscalls = Syscalls()
    assert amx.request(cpuinfo.splitlines(), machine, system, syscalls) == "no AMX"
    assert syscalls.calls == []


def test_a_refusal_is_reported_with_the_kernels_reason(monkeypatch):
    monkeypatch.setattr(ctypes, "get_errno", lambda: 22)
    assert amx.request(XEON.splitlines(), "x86_64", "Linux", Syscalls(result=-1)) == "refused: Invalid argument"


@pytest.mark.parametrize(
    ("mask", "result", "expected"), [(1 << 18 | 1 << 17, 0, True), (1 << 17, 0, False), (1 << 18, -1, False)]
)
def test_granted_reads_bit_18_of_the_permitted_features(mask, result, expected):
    syscalls = Syscalls(result=result, mask=mask)
    assert amx.granted(syscalls) is expected
    assert syscalls.calls == [(158, 0x1022)]


@pytest.mark.skipif(sys.platform != "linux", reason="arch_prctl is Linux's")
def test_the_module_asked_at_import_as_this_cpu_requires():
    with open("/proc/cpuinfo") as cpuinfo:
        has_amx = amx.cpu_has_amx(cpuinfo)
    if not has_amx:
        assert amx.STATE == "no AMX"
    else:
        assert amx.STATE == "granted" and amx.granted()


def test_the_venv_installs_the_module_and_a_pth_line_that_imports_it(tmp_path):
    venv._install_amx_request(tmp_path)
    assert (tmp_path / "epd_cpu_amx.py").read_text() == venv.AMX_SOURCE.read_text()
    assert (tmp_path / "epd_cpu_amx.pth").read_text() == "import epd_cpu_amx\n"
