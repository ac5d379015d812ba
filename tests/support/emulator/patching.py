"""
Patch flavours of the Kubernetes API and the field-ownership bookkeeping of server-side apply.

Approximations, stated plainly:
- Strategic merge patch knows no per-type patch strategies: lists whose items are all dicts
  with a ``name`` are merged by ``name`` (containers, env, volumes, ports…), ``$patch: delete``
  on such an item removes it; ``metadata.finalizers`` merges as a set; all other lists replace.
- Server-side apply tracks ownership per leaf field (named list items are addressed by name,
  other lists are atomic). Conflicts are raised when another manager owns a field that the
  apply sets to a different value, unless ``force=true``. Fields a manager applied before and
  omits now are removed when nobody else owns them. Defaulting/normalisation subtleties of
  the real structured-merge-diff library are not reproduced.
"""
from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch

Path = tuple[str, ...]


class PatchError(ValueError):
    pass


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _is_named_list(items: Any) -> bool:
    return isinstance(items, list) and bool(items) and all(isinstance(i, dict) and 'name' in i for i in items)


def strategic_merge(target: Any, patch: Any, *, path: Path = ()) -> Any:
    if not isinstance(patch, dict):
        if isinstance(patch, list) and path == ('metadata', 'finalizers') and isinstance(target, list):
            return target + [f for f in patch if f not in target]
        if _is_named_list(patch) and (_is_named_list(target) or target == []):
            merged = [copy.deepcopy(t) for t in target]
            index = {item['name']: pos for pos, item in enumerate(merged)}
            for item in patch:
                if item.get('$patch') == 'delete':
                    merged = [m for m in merged if m['name'] != item['name']]
                    index = {m['name']: pos for pos, m in enumerate(merged)}
                elif item['name'] in index:
                    merged[index[item['name']]] = strategic_merge(merged[index[item['name']]], item, path=path)
                else:
                    index[item['name']] = len(merged)
                    merged.append(copy.deepcopy(item))
            return merged
        return copy.deepcopy(patch)
    if patch.get('$patch') == 'replace':
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != '$patch'}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith('$'):
            continue  # directives like $setElementOrder are ordering hints only
        if value is None:
            result.pop(key, None)
        else:
            result[key] = strategic_merge(result.get(key), value, path=(*path, key))
    return result


def json_patch(target: dict[str, Any], operations: Any) -> dict[str, Any]:
    """RFC 6902 JSON patch; a failed ``test`` op is a conflict upstream, hence its own type."""
    if not isinstance(operations, list):
        raise PatchError('a JSON patch must be a list of operations')
    try:
        return jsonpatch.apply_patch(target, operations)
    except jsonpatch.JsonPatchTestFailed as exc:
        raise PatchTestFailed(str(exc)) from exc
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, KeyError, IndexError, TypeError) as exc:
        raise PatchError(f'the JSON patch cannot be applied: {exc}') from exc


class PatchTestFailed(PatchError):
    pass


# --- field ownership (managedFields) ----------------------------------------------------------

def _item_key(item: dict[str, Any]) -> str:
    return 'k:' + json.dumps({'name': item['name']}, separators=(',', ':'))


def leaf_paths(obj: Any, prefix: Path = ()) -> dict[Path, Any]:
    """Leaf fields of an object as ``f:``/``k:`` paths (the vocabulary of ``fieldsV1``)."""
    if isinstance(obj, dict) and obj:
        out: dict[Path, Any] = {}
        for key, value in obj.items():
            out.update(leaf_paths(value, (*prefix, f'f:{key}')))
        return out
    if _is_named_list(obj):
        out = {}
        for item in obj:
            out.update(leaf_paths({k: v for k, v in item.items()}, (*prefix, _item_key(item))))
        return out
    return {prefix: obj}


def owned_paths_of(obj: dict[str, Any]) -> dict[Path, Any]:
    """Fields a writer can own: everything but identity and server-managed metadata."""
    meta = obj.get('metadata') or {}
    body = {k: v for k, v in obj.items() if k not in ('apiVersion', 'kind', 'metadata')}
    kept_meta = {k: meta[k] for k in ('labels', 'annotations') if meta.get(k)}
    if kept_meta:
        body['metadata'] = kept_meta
    return leaf_paths(body) if body else {}


def remove_path(obj: Any, path: Path) -> None:
    *parents, last = path
    node = obj
    for part in parents:
        node = _child(node, part)
        if node is None:
            return
    if isinstance(node, dict) and last.startswith('f:'):
        node.pop(last[2:], None)
    elif isinstance(node, list) and last.startswith('k:'):
        name = json.loads(last[2:])['name']
        node[:] = [item for item in node if item.get('name') != name]


def _child(node: Any, part: str) -> Any:
    if isinstance(node, dict) and part.startswith('f:'):
        return node.get(part[2:])
    if isinstance(node, list) and part.startswith('k:'):
        name = json.loads(part[2:])['name']
        return next((item for item in node if isinstance(item, dict) and item.get('name') == name), None)
    return None


def fields_v1(paths: set[Path]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path in sorted(paths):
        node = tree
        for part in path:
            node = node.setdefault(part, {})
    return tree


def render_path(path: Path) -> str:
    return ''.join('.' + p[2:] if p.startswith('f:') else f'[{p[2:]}]' for p in path)
