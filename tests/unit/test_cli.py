"""`epdctl`: validate, render, crd, docs and the janitor entry, as a user meets them (files, stdin, bad input);
render prints what the operator would apply as multi-document YAML."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml

from epd_operator.api.crd import build_crd
from epd_operator.cli import main
from epd_operator.render import render
from tests.support.render_examples import EXAMPLES_DIR, NIXL_AUTOSCALED, SHARED_STORAGE, example

GOOD = """\
apiVersion: serving.epd.dev/v1alpha1
kind: EPDDeployment
metadata: {name: %s}
spec:
  model: {name: Qwen/Qwen2.5-VL-3B-Instruct}
  encoder: {}
  prefill: {}
  decode: {}
  kvTransfer: {}
  ecTransfer: {connector: CPU, cpu: {bytes: 4Gi}}
"""


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exit_:
        # as the interpreter exits: None is success, a message is 1
        code = 0 if exit_.code is None else exit_.code if isinstance(exit_.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "epd.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_validate_says_what_it_found_for_each_document(tmp_path, capsys):
    code, out, err = run(["validate", "-f", write(tmp_path, GOOD % "a" + "---\n" + GOOD % "b")], capsys)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "EPDDeployment a: valid (E/P/D, EC connector CPU)",
        "EPDDeployment b: valid (E/P/D, EC connector CPU)",
    ]


def test_validate_reads_stdin(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO(GOOD % "piped"))
    code, out, _ = run(["validate", "-f", "-"], capsys)
    assert code == 0 and "piped: valid" in out


def test_one_bad_document_fails_the_file_and_is_named(tmp_path, capsys):
    bad = (GOOD % "bad").replace("decode: {}", "decode: {replicas: -1}")
    code, out, err = run(["validate", "-f", write(tmp_path, GOOD % "good" + "---\n" + bad)], capsys)
    assert (code, out) == (1, "")
    assert "EPDDeployment bad: spec.decode.replicas:" in err
    assert "good" not in err


def test_documents_of_other_api_groups_are_left_alone(tmp_path, capsys):
    others = "apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n---\napiVersion: apps/v1\nkind: Deployment\n---\n"
    code, out, err = run(["validate", "-f", write(tmp_path, others + GOOD % "good")], capsys)
    assert (code, err) == (0, "")
    assert out.splitlines() == ["EPDDeployment good: valid (E/P/D, EC connector CPU)"]


def test_another_kind_of_this_api_group_is_refused(tmp_path, capsys):
    typo = (GOOD % "typo").replace("kind: EPDDeployment", "kind: EPDDeploymnet")
    code, out, err = run(["validate", "-f", write(tmp_path, typo)], capsys)
    assert (code, out) == (1, "")
    assert "EPDDeployment typo: kind:" in err


@pytest.mark.parametrize(
    "text, complaint",
    [
        ("", "no EPDDeployment in the file"),
        ("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n", "no EPDDeployment in the file"),
        ("spec: [unclosed\n", "while parsing"),
        ("- just\n- a list\n", "document 0: <root>: an EPDDeployment must be a mapping"),
    ],
)
def test_unusable_files_fail_with_a_reason(tmp_path, capsys, text, complaint):
    code, out, err = run(["validate", "-f", write(tmp_path, text)], capsys)
    assert (code, out) == (1, "")
    assert complaint in err


def test_a_missing_file_fails_with_its_name(tmp_path, capsys):
    code, out, err = run(["validate", "-f", str(tmp_path / "nope.yaml")], capsys)
    assert (code, out) == (1, "")
    assert "nope.yaml" in err


def test_crd_prints_the_generated_crd(capsys):
    code, out, _ = run(["crd"], capsys)
    assert code == 0
    assert list(yaml.load_all(out, Loader=yaml.CSafeLoader)) == [build_crd()]  # libyaml: the CRD is 0.5 MB


def test_docs_is_listed_in_the_help(capsys):
    code, out, _ = run(["--help"], capsys)
    assert code == 0
    assert "docs" in out and "janitor" in out


def test_janitor_help_is_the_janitors_own(capsys):
    code, out, _ = run(["janitor", "--help"], capsys)
    assert code == 0
    assert "--ttl-seconds" in out and "--max-size" in out


def test_no_command_is_a_usage_error(capsys):
    code, _, err = run([], capsys)
    assert code == 2 and "usage: epdctl" in err


def test_render_prints_every_object_as_yaml_documents(capsys):
    main(["render", "-f", str(EXAMPLES_DIR / NIXL_AUTOSCALED)])
    out = capsys.readouterr().out
    assert out.startswith("---\n")
    assert list(yaml.safe_load_all(out)) == render(example(NIXL_AUTOSCALED))


def test_render_into_another_namespace(capsys):
    main(["render", "-f", str(EXAMPLES_DIR / SHARED_STORAGE), "-n", "team-a"])
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert {doc["metadata"]["namespace"] for doc in docs} == {"team-a"}
    assert docs == render(example(SHARED_STORAGE, **{"metadata.namespace": "team-a"}))


def test_render_a_keda_tier_needs_a_prometheus_from_the_spec_or_the_flag(tmp_path, capsys):
    doc = yaml.safe_load((EXAMPLES_DIR / SHARED_STORAGE).read_text())
    doc["spec"]["encoder"]["autoscaling"] = {"engine": "KEDA", "minReplicas": 0, "maxReplicas": 2}
    path = tmp_path / "keda.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, out, err = run(["render", "-f", str(path)], capsys)
    assert (code, out) == (1, "")
    assert f"epdctl: {path}: EPDDeployment qwen-vl: spec.encoder.autoscaling.keda.prometheusAddress: " in err
    main(["render", "-f", str(path), "--keda-prometheus-address", "http://prom:9090"])
    (so,) = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d["kind"] == "ScaledObject"]
    assert so["spec"]["triggers"][0]["metadata"]["serverAddress"] == "http://prom:9090"


def test_a_bad_spec_prints_nothing_and_exits_1(tmp_path, capsys):
    doc = yaml.safe_load((EXAMPLES_DIR / SHARED_STORAGE).read_text())
    doc["spec"]["encoder"]["replicas"] = -1
    doc["spec"]["ecTransfer"]["mooncake"] = {"protocol": "tcp"}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(SystemExit) as exit_:
        main(["render", "-f", str(path)])
    assert exit_.value.code == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "spec.encoder.replicas" in captured.err


# ----------------------------------------------------------------------------- validate --server, on a stand-in Kube
# What the cluster says is tested against the real control plane (tests/integration/test_epdctl_server.py); here
# only what epdctl makes of each answer: the namespace it fills in, the dry run it asks for, the lines it prints.


class StandInKube:
    """`epd_operator.kube.Kube` as `_validate_on_server` uses it: a login, then one dry-run apply per document."""

    def __init__(self, credentials):
        self.credentials = credentials
        self.applied: list[tuple[dict, str, bool]] = []
        self.answers: dict[str, BaseException] = {}  # metadata.name -> what its apply raises
        self.closed = False
        KUBES.append(self)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.closed = True

    async def login(self):
        return await self.credentials()

    async def apply(self, doc, *, field_manager, dry_run):
        self.applied.append((doc, field_manager, dry_run))
        answer = ANSWERS.get(doc["metadata"]["name"])
        if answer is not None:
            raise answer
        return doc


KUBES: list[StandInKube] = []
ANSWERS: dict[str, BaseException] = {}
SERVER = "https://10.0.0.1:6443"


@pytest.fixture
def cluster(monkeypatch):
    """The stand-in Kube, logged in to SERVER with context namespace `ctx-ns`; the credentials' arguments."""
    from epd_operator import kube
    from epd_operator.kube import Credentials

    KUBES.clear()
    ANSWERS.clear()
    asked: list[tuple] = []

    async def load_credentials(kubeconfig=None, context=None):
        asked.append((kubeconfig, context))
        return Credentials.from_token(SERVER, "t", namespace="ctx-ns")

    monkeypatch.setattr(kube, "Kube", StandInKube)
    monkeypatch.setattr(kube, "load_credentials", load_credentials)
    return asked


def with_namespace(name: str, namespace: str | None) -> str:
    text = GOOD % name
    return (
        text.replace(f"metadata: {{name: {name}}}", f"metadata: {{name: {name}, namespace: {namespace}}}")
        if namespace
        else text
    )


def test_server_dry_runs_each_document_in_its_namespace_else_the_flags_else_the_contexts(tmp_path, capsys, cluster):
    text = with_namespace("a", "spec-ns") + "---\n" + GOOD % "b"
    argv = ["validate", "-f", write(tmp_path, text), "--server", "--kubeconfig", "/k/config", "--context", "c1"]
    code, out, err = run(argv, capsys)
    assert (code, err) == (0, "")
    assert out.splitlines()[2:] == [
        f"EPDDeployment spec-ns/a: accepted by {SERVER} (dry run, nothing changed)",
        f"EPDDeployment ctx-ns/b: accepted by {SERVER} (dry run, nothing changed)",
    ]
    assert cluster == [("/k/config", "c1")]
    (kube,) = KUBES
    assert [(d["metadata"]["namespace"], manager, dry) for d, manager, dry in kube.applied] == [
        ("spec-ns", "epdctl", True),
        ("ctx-ns", "epdctl", True),
    ]
    assert kube.closed
    _, out, _ = run(["validate", "-f", write(tmp_path, text), "--server", "-n", "flag-ns"], capsys)
    assert "EPDDeployment spec-ns/a: accepted" in out and "EPDDeployment flag-ns/b: accepted" in out
    assert cluster[-1] == (None, None)


def test_server_without_a_namespace_anywhere_uses_default(tmp_path, capsys, monkeypatch, cluster):
    from epd_operator import kube
    from epd_operator.kube import Credentials

    async def no_namespace(kubeconfig=None, context=None):
        return Credentials.from_token(SERVER, "t")

    monkeypatch.setattr(kube, "load_credentials", no_namespace)
    code, out, _ = run(["validate", "-f", write(tmp_path, GOOD % "b"), "--server"], capsys)
    assert code == 0 and f"EPDDeployment default/b: accepted by {SERVER}" in out


def test_server_refusals_name_the_document_the_status_and_each_refused_field(tmp_path, capsys, cluster):
    from epd_operator.kube import ApiError

    status = {
        "reason": "Invalid",
        "message": 'EPDDeployment.serving.epd.dev "bad" is invalid',
        "details": {"causes": [{"field": "spec.decode.replicas", "message": "must be <= 1"}, {"message": "no field"}]},
    }
    ANSWERS["bad"] = ApiError(422, status, "PATCH /apis/x")
    ANSWERS["worse"] = ApiError(403, "forbidden: not json", "PATCH /apis/x")
    text = GOOD % "bad" + "---\n" + GOOD % "worse" + "---\n" + GOOD % "good"
    path = write(tmp_path, text)
    code, out, err = run(["validate", "-f", path, "--server"], capsys)
    assert code == 1
    assert out.splitlines()[3:] == [f"EPDDeployment ctx-ns/good: accepted by {SERVER} (dry run, nothing changed)"]
    assert err.splitlines() == [
        f"epdctl: {path}: EPDDeployment ctx-ns/bad: refused by {SERVER} (422 Invalid): "
        'EPDDeployment.serving.epd.dev "bad" is invalid',
        "  spec.decode.replicas: must be <= 1",
        f"epdctl: {path}: EPDDeployment ctx-ns/worse: refused by {SERVER} (403 ): "
        "PATCH /apis/x: HTTP 403: forbidden: not json",
    ]


def test_server_unreachable_stops_at_the_first_document(tmp_path, capsys, cluster):
    ANSWERS["a"] = OSError("connection refused")
    code, out, err = run(["validate", "-f", write(tmp_path, GOOD % "a" + "---\n" + GOOD % "b"), "--server"], capsys)
    assert code == 1
    assert err == f"epdctl: {SERVER}: connection refused\n"
    assert [d["metadata"]["name"] for d, _, _ in KUBES[0].applied] == ["a"]
    assert "accepted" not in out


def test_server_without_credentials_says_why(tmp_path, capsys, monkeypatch, cluster):
    from epd_operator import kube
    from epd_operator.kube import CredentialsError

    async def none(kubeconfig=None, context=None):
        raise CredentialsError("no Kubernetes credentials: not in a pod")

    monkeypatch.setattr(kube, "load_credentials", none)
    code, out, err = run(["validate", "-f", write(tmp_path, GOOD % "a"), "--server"], capsys)
    assert (code, err) == (1, "epdctl: no Kubernetes credentials: not in a pod\n")
    assert out == "EPDDeployment a: valid (E/P/D, EC connector CPU)\n"
    assert KUBES[0].applied == []


def test_without_server_no_cluster_is_asked(tmp_path, capsys, cluster):
    code, _, _ = run(["validate", "-f", write(tmp_path, GOOD % "a")], capsys)
    assert code == 0 and KUBES == [] and cluster == []


def test_yaml_output_keeps_key_order_and_writes_multi_line_strings_as_blocks():
    from epd_operator.cli import dump_yaml

    text = dump_yaml([{"kind": "ConfigMap", "data": {"b": "one line", "a": "two\nlines\n"}}, {"x": 1}])
    assert text == "---\nkind: ConfigMap\ndata:\n  b: one line\n  a: |\n    two\n    lines\n---\nx: 1\n"


def test_a_document_without_a_name_is_named_by_its_place_in_the_file(tmp_path, capsys):
    nameless = (GOOD % "x").replace("metadata: {name: x}", "metadata: {labels: {a: b}}")
    no_metadata = (GOOD % "x").replace("metadata: {name: x}\n", "")
    code, out, err = run(
        ["validate", "-f", write(tmp_path, GOOD % "good" + "---\n" + nameless + "---\n" + no_metadata)], capsys
    )
    assert (code, out) == (1, "")
    assert "EPDDeployment document 1: metadata.name:" in err
    assert "EPDDeployment document 2: metadata" in err


def test_render_gives_the_router_the_image_named_on_the_command_line(capsys):
    main(["render", "-f", str(EXAMPLES_DIR / SHARED_STORAGE), "--router-image", "registry.example/router:7"])
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    (router,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "qwen-vl-router"]
    assert router["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/router:7"
    assert docs == render(example(SHARED_STORAGE), default_router_image="registry.example/router:7")


# ----------------------------------------------------------------------------- the command line itself


def flags_of(parser) -> dict[str, tuple]:
    """Each option of `parser` as --help shows it: (help, metavar, required)."""
    return {" ".join(a.option_strings): (a.help, a.metavar, a.required) for a in parser._actions if a.option_strings}


def test_each_command_and_flag_says_what_it_does_in_the_help():
    import argparse

    from epd_operator.api.router import DEFAULT_ROUTER_IMAGE
    from epd_operator.cli import build_parser

    parser = build_parser()
    assert (parser.prog, parser.description) == (
        "epdctl",
        "Work with EPDDeployment specs (serving.epd.dev/v1alpha1).",
    )
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert {c.dest: c.help for c in sub._choices_actions} == {
        "render": "print the Kubernetes objects an EPDDeployment becomes (multi-document YAML)",
        "validate": "check EPDDeployment specs; exit 1 naming each bad field",
        "crd": "print the generated CustomResourceDefinition",
        "docs": "print the Markdown reference of every spec field (docs/api.md's field reference)",
        "janitor": "bound a shared-storage encoder cache (runs as a sidecar; see `epdctl janitor --help`)",
    }
    file_help = "YAML file with EPDDeployments ('-' for stdin); documents of other API groups are skipped"
    help_help = ("show this help message and exit", None, False)
    # keys: every spelling of the flag
    assert flags_of(sub.choices["render"]) == {
        "-h --help": help_help,
        "-f --file": (file_help, None, True),
        "-n --namespace": ("namespace to render into (default: the spec's, else 'default')", None, False),
        "--router-image": (
            "router/janitor image when the spec names none (the operator's --router-image; "
            f"default {DEFAULT_ROUTER_IMAGE})",
            None,
            False,
        ),
        "--keda-prometheus-address": (
            "the Prometheus a KEDA-scaled tier's load trigger queries when its spec names none "
            "(the operator's --keda-prometheus-address)",
            "URL",
            False,
        ),
    }
    assert flags_of(sub.choices["validate"]) == {
        "-h --help": help_help,
        "-f --file": (file_help, None, True),
        "--server": (
            "also ask the cluster: a server-side dry-run apply (its installed CRD, admission policies, quotas, "
            "permissions); nothing is changed",
            None,
            False,
        ),
        "-n --namespace": (
            "with --server: namespace of specs that name none (default: the kubeconfig context's)",
            None,
            False,
        ),
        "--kubeconfig": ("with --server: kubeconfig path(s) (default: in-cluster, else $KUBECONFIG)", None, False),
        "--context": ("with --server: kubeconfig context (default: the current one)", None, False),
    }
    assert flags_of(sub.choices["docs"]) == {
        "-h --help": help_help,
        "-o --output": (
            "rewrite the reference in this Markdown file, between its api-reference markers (docs/api.md)",
            None,
            False,
        ),
    }


def test_version_names_the_release(capsys):
    from epd_operator import __version__

    code, out, _ = run(["--version"], capsys)
    assert (code, out) == (0, f"epdctl {__version__}\n")


@pytest.mark.parametrize("argv", [["render"], ["validate"]])
def test_a_command_without_its_file_is_a_usage_error(capsys, argv):
    code, _, err = run(argv, capsys)
    assert code == 2
    assert err.endswith(f"epdctl {argv[0]}: error: the following arguments are required: -f/--file\n")


def test_no_command_names_what_is_missing(capsys):
    code, _, err = run([], capsys)
    assert code == 2 and err.endswith("epdctl: error: the following arguments are required: command\n")


def test_the_command_line_is_read_from_argv(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["epdctl", "crd"])
    main()
    assert yaml.load(capsys.readouterr().out, Loader=yaml.CSafeLoader) == build_crd()
