"""`epdctl render`: what the operator would apply, as multi-document YAML on stdout."""

from __future__ import annotations

import pytest
import yaml

from epd_operator.cli import main
from epd_operator.render import render
from tests.support.render_examples import EXAMPLES_DIR, NIXL_AUTOSCALED, SHARED_STORAGE, example


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
