"""The Kubernetes versions are pinned once (dev/builds/k8s_binaries.py); every page and target that names them says
the same: the tested range in docs/install.md, the versions the tests run on, kubectl's cache path."""

from __future__ import annotations

import re

from dev.builds.k8s_binaries import NEWEST, OLDEST, minor
from dev.paths import REPO


def test_the_docs_and_the_makefile_name_the_pinned_versions():
    install = (REPO / "docs" / "install.md").read_text()
    assert f"**Tested range: {minor(OLDEST)} – {minor(NEWEST)}.**" in install
    assert f"real {NEWEST.lstrip('v')} control plane" in install and f"a {OLDEST.lstrip('v')} kube-apiserver" in install
    pages = [REPO / "README.md", REPO / "Makefile", *(REPO / "docs").glob("*.md")]
    for page in pages:
        text = page.read_text()
        for path_version in re.findall(r"epd-operator/k8s/(v\d+\.\d+\.\d+)", text):
            assert path_version == NEWEST, f"{page.name} names kubectl's folder of {path_version}, not {NEWEST}"
    makefile = (REPO / "Makefile").read_text()
    assert (
        f"the Kubernetes {minor(NEWEST)} control plane" in makefile and f"{minor(OLDEST)}'s kube-apiserver" in makefile
    )


def test_the_charts_the_api_s_schemas_and_the_schema_library_follow_the_pinned_range():
    from epd_operator.api import kube_schemas

    assert minor(OLDEST) == kube_schemas.KUBERNETES_VERSION
    for chart in ("epd-operator", "epd-deployment"):
        chart_yaml = (REPO / "charts" / chart / "Chart.yaml").read_text()
        assert f'kubeVersion: ">={minor(OLDEST)}.0-0"' in chart_yaml
    assert f'"kubernetes-validate=={minor(NEWEST)}.0"' in (REPO / "pyproject.toml").read_text()


def test_every_kubernetes_patch_version_a_page_names_is_a_pinned_one():
    allowed = {v.lstrip("v") for v in (NEWEST, OLDEST)} | {f"{minor(v)}.0" for v in (NEWEST, OLDEST)}
    for page in [REPO / "README.md", REPO / "Makefile", *(REPO / "docs").glob("*.md")]:
        for version in re.findall(r"(?<![\w.])v?(1\.3\d\.\d+)(?![\w.])", page.read_text()):
            assert version in allowed, f"{page.name} names Kubernetes {version}; the pins are {NEWEST} and {OLDEST}"
