"""The Kubernetes components' one `go build` (dev/builds/k8s_binaries.py): the wrapper module that makes
k8s.io/kubernetes consumable re-pins each staging module to its published tag, and nothing else."""

from __future__ import annotations

from dev.builds.k8s_binaries import wrapper_go_mod

# The shape of k8s.io/kubernetes' go.mod: its staging modules replaced by local folders, other replaces and
# requirements beside them.
KUBERNETES_GO_MOD = """module k8s.io/kubernetes

go 1.24.0

require (
\tgithub.com/spf13/cobra v1.9.1
\tk8s.io/api v0.0.0
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tk8s.io/kube-proxy => ./staging/src/k8s.io/kube-proxy
)

replace github.com/example/fork => github.com/example/fork v1.0.0
"""


def test_the_wrapper_requires_the_release_and_re_pins_only_its_staging_modules_to_their_tags():
    assert wrapper_go_mod("v1.99.3", KUBERNETES_GO_MOD) == (
        "module epd.local/k8s-wrapper\n"
        "\n"
        "go 1.24\n"
        "\n"
        "require k8s.io/kubernetes v1.99.3\n"
        "\n"
        "replace k8s.io/api => k8s.io/api v0.99.3\n"
        "replace k8s.io/client-go => k8s.io/client-go v0.99.3\n"
        "replace k8s.io/kube-proxy => k8s.io/kube-proxy v0.99.3\n"
    )
