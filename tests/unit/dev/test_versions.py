"""The Kubernetes versions are pinned once (dev/k8s_binaries.py); every page and target that names them says
the same: the tested range in docs/install.md, the versions the tests run on, kubectl's cache path."""

from __future__ import annotations

import re

from dev.k8s_binaries import NEWEST, OLDEST, minor
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
