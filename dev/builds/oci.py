"""OCI image archives written directly, for images that need no build step: one layer from a tar
stream plus an image config (the pause image, the Debian base from mmdebstrap's tarball), or another
image's layers plus one more (the CPU vLLM image: the base and a prepared venv).

The archive is an OCI image layout in a tar file, as ``buildah push oci-archive:`` writes one, named
by the ``io.containerd.image.name`` and ``org.opencontainers.image.ref.name`` annotations so that
``ctr images import`` and ``buildah`` both find it under that name.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import IO, Any


def _blob(out: tarfile.TarFile, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    info.mode = 0o644
    out.addfile(info, io.BytesIO(data))
    return f"sha256:{digest}"


def _file_blob(out: tarfile.TarFile, path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    info = tarfile.TarInfo(f"blobs/sha256/{h.hexdigest()}")
    info.size = path.stat().st_size
    info.mode = 0o644
    with path.open("rb") as f:
        out.addfile(info, f)
    return f"sha256:{h.hexdigest()}", info.size


def _write_layout(
    archive: Path, name: str, layers: list[tuple[Path, str, str]], diff_ids: list[str], config: dict[str, Any]
) -> None:
    """Write the archive: ``layers`` as (blob file, its media type, what made it), bottom first."""
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created_by": made_by} for _, _, made_by in layers],
    }
    partial = archive.with_suffix(".partial")
    with tarfile.open(partial, "w") as out:
        descriptors = []
        for blob, media_type, _ in layers:
            digest, size = _file_blob(out, blob)
            descriptors.append({"mediaType": media_type, "digest": digest, "size": size})
        config_bytes = json.dumps(image_config, sort_keys=True).encode()
        config_digest = _blob(out, config_bytes)
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": config_digest,
                    "size": len(config_bytes),
                },
                "layers": descriptors,
            },
            sort_keys=True,
        ).encode()
        manifest_digest = _blob(out, manifest)
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": manifest_digest,
                    "size": len(manifest),
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name,
                    },
                }
            ],
        }
        for fname, data in (
            ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
            ("index.json", json.dumps(index).encode()),
        ):
            info = tarfile.TarInfo(fname)
            info.size = len(data)
            info.mode = 0o644
            out.addfile(info, io.BytesIO(data))
    shutil.move(partial, archive)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return f"sha256:{h.hexdigest()}"


def write_archive(
    archive: Path, name: str, layer_tar: Path, config: dict[str, Any], *, compress_level: int = 1
) -> Path:
    """Write an OCI archive of one image: ``layer_tar`` (an uncompressed tar of the root filesystem)
    as its only layer, ``config`` as its runtime config (Entrypoint, Cmd, Env, User, WorkingDir)."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=archive.parent) as tmp:
        gz = Path(tmp) / "layer.tar.gz"
        diff = hashlib.sha256()
        with layer_tar.open("rb") as src, gzip.open(gz, "wb", compresslevel=compress_level) as dst:
            while chunk := src.read(1 << 20):
                diff.update(chunk)
                dst.write(chunk)
        layer = (gz, "application/vnd.oci.image.layer.v1.tar+gzip", f"epd-operator dev/builds/oci.py: {name}")
        _write_layout(archive, name, [layer], [f"sha256:{diff.hexdigest()}"], config)
    return archive


def write_layered_archive(archive: Path, name: str, base: Path, layer_tar: Path, config: dict[str, Any]) -> Path:
    """Write an OCI archive of ``base`` (an archive this module wrote) with ``layer_tar`` on top, stored
    uncompressed (a layer of gigabytes of compiled code gains little from gzip and costs minutes), and
    ``config`` as its runtime config."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=archive.parent) as tmp, tarfile.open(base) as src:
        index = json.load(_member(src, "index.json"))
        manifest = json.load(_member(src, _blob_path(index["manifests"][0]["digest"])))
        base_config = json.load(_member(src, _blob_path(manifest["config"]["digest"])))
        layers: list[tuple[Path, str, str]] = []
        history = [h.get("created_by", "") for h in base_config.get("history", []) if not h.get("empty_layer")]
        for i, descriptor in enumerate(manifest["layers"]):
            blob = Path(tmp) / f"base-{i}"
            with blob.open("wb") as f:
                shutil.copyfileobj(_member(src, _blob_path(descriptor["digest"])), f, 1 << 20)
            layers.append((blob, descriptor["mediaType"], history[i] if i < len(history) else f"{base.name}"))
        layers.append((layer_tar, "application/vnd.oci.image.layer.v1.tar", f"epd-operator dev/builds/oci.py: {name}"))
        diff_ids = [*base_config["rootfs"]["diff_ids"], _sha256(layer_tar)]
        _write_layout(archive, name, layers, diff_ids, config)
    return archive


def _blob_path(digest: str) -> str:
    return "blobs/" + digest.replace(":", "/", 1)


def _member(src: tarfile.TarFile, name: str) -> IO[bytes]:
    f = src.extractfile(name)
    if f is None:
        raise ValueError(f"{src.name!r}: {name} is not a file")
    return f


def single_file_layer(tar_path: Path, source: Path, dest: str, mode: int = 0o755) -> Path:
    """An uncompressed layer tar holding one file (e.g. a static binary) at ``dest``."""
    with tarfile.open(tar_path, "w") as out:
        info = out.gettarinfo(str(source), arcname=dest.lstrip("/"))
        info.mode, info.uid, info.gid, info.uname, info.gname = mode, 0, 0, "", ""
        with source.open("rb") as f:
            out.addfile(info, f)
    return tar_path
