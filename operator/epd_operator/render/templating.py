"""Loading the jinja2 templates of `render/templates/`: manifest shapes, filled with values computed in Python.

Templates produce YAML; structured values go in through the `json` filter (JSON is YAML flow
syntax), so no value is ever re-indented or re-quoted by hand.
"""

from __future__ import annotations

import functools
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import yaml

TEMPLATE_DIR = Path(__file__).parent / "templates"
# libyaml's loader when PyYAML has it: the operator renders on every reconcile.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# The templates' `json` filter: non-ASCII text stays as written.
_json = functools.partial(json.dumps, ensure_ascii=False)


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,  # a missing value is a bug, never an empty field
        autoescape=False,
        keep_trailing_newline=True,
    )
    env.filters["json"] = _json
    return env


def render_documents(template: str, **values: Any) -> list[dict[str, Any]]:
    """Every YAML document `template` renders to, as plain dicts."""
    text = _environment().get_template(template).render(**values)
    return [doc for doc in yaml.load_all(text, Loader=_LOADER) if doc is not None]


def render_one(template: str, **values: Any) -> dict[str, Any]:
    docs = render_documents(template, **values)
    if len(docs) != 1:
        raise AssertionError(f"template {template} rendered {len(docs)} documents, expected one")
    return docs[0]
