"""The local images' inputs and archives (dev/builds/images.py, dev/builds/oci.py), without building anything."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
import yaml

from dev.builds import images
from dev.builds.images import REPO, dockerfile_inputs
from dev.builds.oci import single_file_layer, write_archive


def test_the_operator_image_is_keyed_by_every_file_its_dockerfile_copies():
    inputs = {str(p.relative_to(REPO)) for p in dockerfile_inputs(REPO / "images" / "operator" / "Dockerfile")}
    assert {"images/operator/Dockerfile", "images/operator/requirements.txt", "pyproject.toml"} <= inputs
    assert "operator/epd_operator/__init__.py" in inputs
    assert not [p for p in inputs if "__pycache__" in p or ".egg-info" in p]


def test_an_archive_names_its_image_for_containerd_and_buildah(tmp_path: Path):
    binary = tmp_path / "pause"
    binary.write_bytes(b"\x7fELF not really")
    layer = single_file_layer(tmp_path / "layer.tar", binary, "/pause")
    archive = write_archive(
        tmp_path / "out" / "pause.tar", "registry.k8s.io/pause:3.10", layer, {"Entrypoint": ["/pause"]}
    )
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        (entry,) = index["manifests"]
        manifest = json.load(tar.extractfile(f"blobs/sha256/{entry['digest'].split(':')[1]}"))  # type: ignore[arg-type]
        config = json.load(tar.extractfile(f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"))  # type: ignore[arg-type]
    assert {"oci-layout", "index.json"} <= names
    assert entry["annotations"] == {
        "io.containerd.image.name": "registry.k8s.io/pause:3.10",
        "org.opencontainers.image.ref.name": "registry.k8s.io/pause:3.10",
    }
    assert config["config"]["Entrypoint"] == ["/pause"]
    assert len(config["rootfs"]["diff_ids"]) == len(manifest["layers"]) == 1
    assert f"blobs/sha256/{manifest['layers'][0]['digest'].split(':')[1]}" in names


def test_without_go_the_images_command_says_what_to_install_instead_of_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.setenv("PATH", str(tmp_path))  # no go, no buildah: nothing can be started either
    monkeypatch.setattr(images, "IMAGES", tmp_path / "images")
    assert images.main(["build", "pause"]) == 1
    assert capsys.readouterr().err.strip() == "make images: building the local images needs Go (https://go.dev/dl)"


def test_with_docker_the_chart_s_and_the_example_s_names_are_built_saved_and_loaded_like_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The Docker path tags what the chart (its default image: repository and appVersion) and the example
    expect, and saves each as an archive, which `load` imports into the node; no process runs here: the
    docker commands are recorded."""
    values = yaml.safe_load((REPO / "charts" / "epd-operator" / "values.yaml").read_text())
    assert images.operator_image() == f"{values['image']['repository']}:{images.chart_app_version()}"
    example = (REPO / "examples" / "epd-local-cpu.yaml").read_text()
    assert f"image: {images.VLLM_CPU_IMAGE}" in example
    ran: list[list[str]] = []

    def docker(argv: list[str], **_: object) -> None:
        ran.append(argv)
        if argv[1] == "save":
            Path(argv[3]).write_text("archive")

    monkeypatch.setattr(images, "IMAGES", tmp_path)
    monkeypatch.setattr(images.subprocess, "run", docker)
    monkeypatch.setattr(images, "BUILDERS", {**images.BUILDERS, "pause": lambda: tmp_path / "pause.tar"})
    archives = images.build(images.DEFAULT_IMAGES, docker=True)
    assert archives == {
        "pause": tmp_path / "pause.tar",
        "operator": tmp_path / "operator-docker.tar",
        "vllm-cpu": tmp_path / "vllm-cpu-docker.tar",
    }
    tags = [argv[3] for argv in ran if argv[1] == "build"]
    assert tags == [images.operator_image(), images.VLLM_CPU_IMAGE]
    assert [argv[-1] for argv in ran if argv[1] == "save"] == tags
