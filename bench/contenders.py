"""The routers compared side by side, and how each is started against the fake backends.

- direct: the client talks to the consumer itself (PD in E+PD, D in E/P/D): the floor.
- vllm-proxy: vLLM 0.32's `disagg_epd_proxy.py`, run as shipped (its own logging included);
  vllm-proxy-quiet: the same with its per-request logging off.
- epd-router: ours, one worker process.
- aiohttp-floor, raw-floor: the same upstream calls and nothing else, through aiohttp or
  through raw asyncio protocols: what the HTTP layer alone costs, apart from a router's logic.
- vllm-router: the Rust router. Its wheel has no EPD mode, so it runs plain (E+PD) or
  P/D (E/P/D) and never calls the encoder: a reference floor for a compiled router, not
  a like-for-like contender.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from dev.ports import free_port

from . import thirdparty

CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class Topology:
    name: str  # "E+PD" or "E/P/D"
    encoder: str
    decode: str  # PD in E+PD, D in E/P/D
    prefill: str | None = None


@dataclass(frozen=True)
class Contender:
    name: str
    calls_encoder: bool  # does it do the EPD work (encoder fan-out + rewrite)?
    note: str = ""

    def argv(self, topo: Topology, port: int) -> list[str] | None:
        """Command line of the router process; None when nothing has to run."""
        return None


class Direct(Contender):
    pass


class VllmProxy(Contender):
    def argv(self, topo: Topology, port: int) -> list[str]:
        python = thirdparty.bench_venv()
        return [
            str(python),
            str(thirdparty.vllm_proxy_script()),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--encode-servers-urls",
            topo.encoder,
            "--prefill-servers-urls",
            topo.prefill or "disable",
            "--decode-servers-urls",
            topo.decode,
        ]


class QuietVllmProxy(VllmProxy):
    """vLLM's proxy with its per-request INFO logging (its own and uvicorn's access log) off."""

    def argv(self, topo: Topology, port: int) -> list[str]:
        python, *rest = super().argv(topo, port)
        quiet = (
            "import logging, runpy, sys; logging.disable(logging.INFO); "
            "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
        )
        return [python, "-c", quiet, *rest]


class EpdRouter(Contender):
    def argv(self, topo: Topology, port: int) -> list[str]:
        exe = shutil.which("epd-router", path=str(Path(sys.executable).parent)) or "epd-router"
        return [
            exe,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--encode-servers-urls",
            topo.encoder,
            "--prefill-servers-urls",
            topo.prefill or "disable",
            "--decode-servers-urls",
            topo.decode,
            "--workers",
            "1",
        ]


class VllmRouter(Contender):
    def argv(self, topo: Topology, port: int) -> list[str]:
        argv = [
            *thirdparty.vllm_router_argv(thirdparty.bench_venv()),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--prometheus-port",
            str(free_port()),
            "--policy",
            "round_robin",
        ]
        if topo.prefill:
            return [*argv, "--vllm-pd-disaggregation", "--prefill", topo.prefill, "none", "--decode", topo.decode]
        return [*argv, "--worker-urls", topo.decode]


@dataclass(frozen=True)
class Floor(Contender):
    """A pass-through making the same upstream calls with no router logic."""

    module: str = ""

    def argv(self, topo: Topology, port: int) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            self.module,
            "--port",
            str(port),
            "--encoder",
            topo.encoder,
            "--decode",
            topo.decode,
        ]
        return [*argv, "--prefill", topo.prefill] if topo.prefill else argv


def parse_floor_args(description: str, argv: list[str] | None) -> argparse.Namespace:
    """The command line of a floor process, as Floor.argv writes it."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--encoder", required=True)
    parser.add_argument("--prefill")
    parser.add_argument("--decode", required=True)
    return parser.parse_args(argv)


DIRECT = Direct("direct", calls_encoder=False, note="client → consumer, no router (the floor)")
VLLM_PROXY = VllmProxy("vllm-proxy", calls_encoder=True, note="vLLM 0.32 disagg_epd_proxy.py")
VLLM_PROXY_QUIET = QuietVllmProxy(
    "vllm-proxy-quiet",
    calls_encoder=True,
    note="the same proxy with its per-request INFO logging off (a reference: "
    "the targets compare with the proxy as shipped)",
)
EPD_ROUTER = EpdRouter("epd-router", calls_encoder=True, note="ours, 1 worker")
VLLM_ROUTER = VllmRouter(
    "vllm-router",
    calls_encoder=False,
    note=f"vllm-router {thirdparty.VLLM_ROUTER_VERSION}, plain / P/D mode, no encoder call",
)
AIOHTTP_FLOOR = Floor(
    "aiohttp-floor",
    calls_encoder=True,
    module="bench.aiohttp_floor",
    note="the same calls through aiohttp with no logic: the floor for an aiohttp router",
)
RAW_FLOOR = Floor(
    "raw-floor",
    calls_encoder=True,
    module="bench.raw_floor",
    note="the same calls through raw asyncio protocols on uvloop with no logic: "
    "the floor for a Python router without an HTTP framework",
)
ALL = (DIRECT, VLLM_PROXY, VLLM_PROXY_QUIET, EPD_ROUTER, VLLM_ROUTER, AIOHTTP_FLOOR, RAW_FLOOR)
