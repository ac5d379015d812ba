"""What the real node decides without running anything (dev/node/real_node.py): which images an archive
holds, and which of them containerd already has complete and unpacked."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

from dev.builds.oci import single_file_layer, write_archive
from dev.node.containerd import archive_images, ready_images


def _layout(path: Path, index: dict[str, Any]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in (
            ("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
            ("index.json", json.dumps(index).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_an_archive_written_here_names_its_image_and_manifest(tmp_path: Path):
    binary = tmp_path / "echo"
    binary.write_bytes(b"\x7fELF not really")
    layer = single_file_layer(tmp_path / "layer.tar", binary, "/echo")
    archive = write_archive(tmp_path / "echo.tar", "localhost/epd-echo:dev", layer, {"Entrypoint": ["/echo"]})
    with tarfile.open(archive) as tar:
        (entry,) = json.load(tar.extractfile("index.json"))["manifests"]  # type: ignore[arg-type]
    assert archive_images(archive) == {"localhost/epd-echo:dev": entry["digest"]}


def test_a_buildah_archive_is_named_by_its_oci_ref_name(tmp_path: Path):
    # `buildah push IMAGE oci-archive:FILE:IMAGE` writes only the OCI annotation, the full reference.
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": "sha256:" + "3f" * 32,
                "size": 762,
                "annotations": {"org.opencontainers.image.ref.name": "ghcr.io/epd-operator/epd-operator:0.1.0"},
            }
        ],
    }
    assert archive_images(_layout(tmp_path / "op.tar", index)) == {
        "ghcr.io/epd-operator/epd-operator:0.1.0": "sha256:" + "3f" * 32
    }


def test_an_archive_whose_names_cannot_be_matched_is_always_imported(tmp_path: Path):
    # A bare tag: `ctr images import` names it import-<date>:<tag>, never the same twice.
    bare = {
        "manifests": [{"digest": "sha256:" + "ab" * 32, "annotations": {"org.opencontainers.image.ref.name": "v1"}}]
    }
    assert archive_images(_layout(tmp_path / "bare.tar", bare)) == {}
    assert archive_images(_layout(tmp_path / "unnamed.tar", {"manifests": [{"digest": "sha256:" + "ab" * 32}]})) == {}
    docker = tmp_path / "docker.tar"
    with tarfile.open(docker, "w") as tar:
        info = tarfile.TarInfo("manifest.json")
        tar.addfile(info, io.BytesIO(b""))
    assert archive_images(docker) == {}
    (tmp_path / "garbage.tar").write_bytes(b"not a tar")
    assert archive_images(tmp_path / "garbage.tar") == {}


# `ctr images check` from containerd 1.6.20, as the node's containerd prints it (REF TYPE DIGEST STATUS SIZE UNPACKED).
CHECK = """\
REF                        TYPE                                       DIGEST                                                                  STATUS         SIZE                UNPACKED
localhost/epd-echo:dev     application/vnd.oci.image.manifest.v1+json sha256:fa8c92f391938753ca83e85d28521e35e957b68ab7734f26dcc4a8c19dd45fda complete (2/2) 2.6 MiB/2.6 MiB     true
registry.k8s.io/pause:3.10 application/vnd.oci.image.manifest.v1+json sha256:3b35d5bb6ab88cd42b84b9ad9fe465c2ff7a64306ddcd65cd0645876e0bd8628 complete (2/2) 678.1 KiB/678.1 KiB true
localhost/half:imported    application/vnd.oci.image.manifest.v1+json sha256:1111111111111111111111111111111111111111111111111111111111111111 incomplete (1/2) 1.0 KiB/2.0 GiB   false
localhost/packed:only      application/vnd.oci.image.manifest.v1+json sha256:2222222222222222222222222222222222222222222222222222222222222222 complete (2/2) 1.0 KiB/1.0 KiB     false
"""


def test_only_complete_and_unpacked_images_count_as_present():
    assert ready_images(CHECK) == {
        "localhost/epd-echo:dev": "sha256:fa8c92f391938753ca83e85d28521e35e957b68ab7734f26dcc4a8c19dd45fda",
        "registry.k8s.io/pause:3.10": "sha256:3b35d5bb6ab88cd42b84b9ad9fe465c2ff7a64306ddcd65cd0645876e0bd8628",
    }
    assert ready_images("") == {}
