"""OCI image archives written directly, for images that need no build step: one layer from a tar
stream plus an image config (the pause image, the Debian base from mmdebstrap's tarball).

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
from typing import Any


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
        image_config = {
            "architecture": "amd64",
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff.hexdigest()}"]},
            "history": [{"created_by": f"epd-operator dev/oci.py: {name}"}],
        }
        partial = archive.with_suffix(".partial")
        with tarfile.open(partial, "w") as out:
            layer_digest, layer_size = _file_blob(out, gz)
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
                    "layers": [
                        {
                            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                            "digest": layer_digest,
                            "size": layer_size,
                        }
                    ],
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
    return archive


def single_file_layer(tar_path: Path, source: Path, dest: str, mode: int = 0o755) -> Path:
    """An uncompressed layer tar holding one file (e.g. a static binary) at ``dest``."""
    with tarfile.open(tar_path, "w") as out:
        info = out.gettarinfo(str(source), arcname=dest.lstrip("/"))
        info.mode, info.uid, info.gid, info.uname, info.gname = mode, 0, 0, "", ""
        with source.open("rb") as f:
            out.addfile(info, f)
    return tar_path
