"""Check rendered `vllm serve` command lines with vLLM's own argument parser, 0.32's and 0.33's.

The operator renders vLLM command lines it cannot run here; the only authority on whether
vLLM accepts them is vLLM itself, in every release the operator claims (0.32, and 0.33, the
default image). This module is two things in one file:

* imported by tests (dev venv): ``check_serve_commands(argvs, version)`` sends every command line
  to a checker process of that vLLM release and returns one error (or ``None``) per command line.
  0.32's checker runs in the cached vLLM CPU venv (`dev.builds.venv`); 0.33's runs the same interpreter
  with 0.33's wheel first on its path (`dev.builds.vllm_wheel`: the wheel without its dependencies, so its
  parser and config objects run over the CPU venv's packages). A checker starts once per test
  process and release (importing vLLM costs seconds) and is reused; each command line then costs
  well under a second.
* run as a script inside the vLLM venv: the checker. It first answers with the vLLM version it
  imported, then reads one JSON list of argvs per line on stdin and answers one JSON list of
  errors per line on stdout. No server is started and no model is loaded: it parses with
  ``make_arg_parser(FlexibleArgumentParser())``, runs ``validate_parsed_serve_args`` and
  ``AsyncEngineArgs.from_cli_args`` (which builds vLLM's transfer config objects from the JSON
  flags), and resolves the EC/KV connector names through vLLM's connector factories.

An argv may start with ``vllm serve`` (as rendered), ``serve``, or directly with the model.
The model (a hub id or a path) is replaced by the local tiny model: ``from_cli_args`` looks the
model up and ``HF_HUB_OFFLINE`` is set, so nothing is downloaded. Builds the vLLM venv, 0.33's
folder and the tiny model on first use.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

# ---------------------------------------------------------------------------------------------
# Checker side: runs inside the vLLM venv, imports nothing from this repository.
# ---------------------------------------------------------------------------------------------


def _serve_arguments(argv: list[str], local_model: str | None) -> list[str]:
    """Drop the `vllm serve` prefix and point the model at a local path when one is given."""
    args = list(argv)
    if args[:2] == ["vllm", "serve"]:
        args = args[2:]
    elif args[:1] == ["serve"]:
        args = args[1:]
    elif args and Path(args[0]).name == "vllm":
        raise ValueError(f"not a `vllm serve` command line: {argv[:3]}")
    if local_model:
        if args and not args[0].startswith("-"):
            args[0] = local_model
        for i, arg in enumerate(args):
            if arg == "--model" and i + 1 < len(args):
                args[i + 1] = local_model
            elif arg.startswith("--model="):
                args[i] = f"--model={local_model}"
    return args


class _ParseError(Exception):
    pass


def _raise_instead_of_exit(message: str) -> None:
    raise _ParseError(message)


def _checker_main() -> None:
    import contextlib
    import importlib.metadata
    import io
    import logging

    from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.engine.arg_utils import AsyncEngineArgs

    try:  # 0.32
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    except ImportError:  # 0.33
        from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    logging.disable(logging.WARNING)  # vLLM's warnings would interleave with the JSON replies
    local_model = os.environ.get("EPD_TINY_MODEL") or None

    def resolve_connector(factory, config, name_field: str, label: str) -> None:
        if config is None:
            return
        name = getattr(config, name_field)
        try:
            factory.get_connector_class(config)
        except ImportError as exc:
            # The name resolved to a module that needs an optional package (NIXL, Mooncake, ...)
            # this CPU venv lacks: the name is valid, the package belongs to the image.
            if name not in factory._registry:
                raise ValueError(f"{label} connector {name!r}: {exc}") from exc

    def check(argv: list[str]) -> str | None:
        parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
        parser.error = _raise_instead_of_exit  # argparse would otherwise sys.exit()
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                args = parser.parse_args(_serve_arguments(argv, local_model))
            args.subparser = "serve"
            if args.model_tag is not None:  # `vllm serve` gives the positional model precedence
                args.model = args.model_tag
            validate_parsed_serve_args(args)
            engine_args = AsyncEngineArgs.from_cli_args(args)
            resolve_connector(ECConnectorFactory, engine_args.ec_transfer_config, "ec_connector", "EC")
            resolve_connector(KVConnectorFactory, engine_args.kv_transfer_config, "kv_connector", "KV")
        except (_ParseError, SystemExit) as exc:
            return f"vllm serve rejected the arguments: {exc}"
        except Exception as exc:  # any exception is vLLM refusing the command line
            return f"{type(exc).__name__}: {exc}"
        return None

    reply = sys.stdout
    sys.stdout = sys.stderr  # anything vLLM prints must not corrupt the protocol
    reply.write(json.dumps({"vllm": importlib.metadata.version("vllm")}) + "\n")
    reply.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        results = [check(argv) for argv in json.loads(line)]
        reply.write(json.dumps(results) + "\n")
        reply.flush()


# ---------------------------------------------------------------------------------------------
# Test side: runs in the dev venv.
# ---------------------------------------------------------------------------------------------


# The releases the operator claims: the CPU venv's, and the default image's (parser only).
VLLM_VERSIONS = ("0.32.0", "0.33.0")


class _Checker:
    """One long-lived checker process of one vLLM release, shared by every caller in this process."""

    def __init__(self, version: str) -> None:
        from dev.builds import tiny_model, venv, vllm_wheel

        python = venv.ensure()
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        env.pop("PYTHONPATH", None)
        env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        if version != venv.VLLM_VERSION:
            vllm_wheel.ensure(version)
            env.update(vllm_wheel.check_env(version))
        # AsyncEngineArgs.from_cli_args looks the model up, and the hub is offline.
        env["EPD_TINY_MODEL"] = str(tiny_model.ensure())
        self._proc = subprocess.Popen(
            [str(python), __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd="/",  # keep this repository's packages off the checker's import path
        )
        self._lock = threading.Lock()
        hello = self._read()
        imported = json.loads(hello).get("vllm", "")
        if imported.split("+")[0] != version:
            self.close()
            raise RuntimeError(f"the vLLM {version} argument checker imported vLLM {imported!r}")

    def _read(self) -> str:
        assert self._proc.stdout
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(
                f"the vLLM argument checker exited (code {self._proc.poll()}); "
                f"run `{sys.executable} {__file__}` with the vLLM venv's python to see why"
            )
        return line

    def check(self, argvs: list[list[str]]) -> list[str | None]:
        with self._lock:
            assert self._proc.stdin
            try:
                self._proc.stdin.write(json.dumps(argvs) + "\n")
                self._proc.stdin.flush()
            except BrokenPipeError:
                pass  # _read reports the exit
            return json.loads(self._read())

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


_checkers: dict[str, _Checker] = {}
_checker_lock = threading.Lock()


def check_serve_commands(argvs: list[list[str]], version: str = VLLM_VERSIONS[0]) -> list[str | None]:
    """Ask vLLM `version`'s own parser about each command line: ``None`` if accepted, else the error.

    Builds what that release needs on first use (minutes, cached). Pass all command lines of a
    test at once: the answer comes back in one round trip.
    """
    if version not in VLLM_VERSIONS:
        raise ValueError(f"vLLM {version} is not one of the checked releases {VLLM_VERSIONS}")
    if not all(isinstance(argv, list) and all(isinstance(a, str) for a in argv) for argv in argvs):
        raise TypeError("check_serve_commands takes a list of argvs, each a list of strings")
    with _checker_lock:
        checker = _checkers.get(version)
        if checker is None:
            checker = _checkers[version] = _Checker(version)
            atexit.register(checker.close)
    return checker.check(argvs)


if __name__ == "__main__":
    _checker_main()
