"""Garbage collection by ownerReferences, foreground deletion and namespace teardown.

A mixin of the emulator: it relies on the emulator's ``store``, ``types``, ``_delete``, ``_update``
and ``_remove``. Approximation: dependents go when *all* their owners are gone (dangling refs
next to live owners are not pruned), and objects created with owners that never existed are kept.
"""
from __future__ import annotations

import asyncio
from typing import Any

from tests.support.emulator.resources import ResourceType
from tests.support.emulator.store import Key


class GarbageCollector:
    store: Any
    types: dict[tuple[str, str, str], ResourceType]
    _gc_scheduled: bool
    _delete: Any  # the emulator's write paths, which honour finalizers and emit watch events
    _update: Any
    _remove: Any


    def _dependents(self, uid: str) -> list[tuple[Key, dict[str, Any]]]:
        return self.store.iter_all(lambda o: any(r.get('uid') == uid for r in o['metadata'].get('ownerReferences') or []))

    def _orphan_dependents(self, uid: str) -> None:
        for key, dep in self._dependents(uid):
            refs = [r for r in dep['metadata']['ownerReferences'] if r.get('uid') != uid]
            new = {**dep, 'metadata': {**dep['metadata'], 'ownerReferences': refs, 'resourceVersion': str(self.store.next_rv())}}
            if not refs:
                del new['metadata']['ownerReferences']
            self.store.put(key, new, dep)

    def _schedule_gc(self) -> None:
        # Background, as upstream: the owner is gone (and the response sent) before dependents go.
        if not self._gc_scheduled:
            self._gc_scheduled = True
            asyncio.get_running_loop().call_soon(self.collect_garbage)

    def _rtype_for_key(self, key: Key) -> ResourceType:
        return next(t for t in self.types.values() if t.group_plural == key)

    def collect_garbage(self) -> None:
        """Delete dependents whose owners are all gone, and finish foreground/namespace deletions."""
        self._gc_scheduled = False
        changed = True
        while changed:
            changed = False
            for key, obj in self.store.iter_all():
                meta = obj['metadata']
                if self.store.get(key, meta.get('namespace'), meta['name']) is not obj:
                    continue  # changed earlier in this pass
                rtype = self._rtype_for_key(key)
                refs = meta.get('ownerReferences') or []
                owners_alive = [self._owner_alive(r['uid']) for r in refs if r.get('uid')]
                if refs and not meta.get('deletionTimestamp') and not any(owners_alive):
                    self._delete(rtype, meta.get('namespace'), meta['name'], {}, {}, False)
                    changed = True
                elif meta.get('deletionTimestamp') and 'foregroundDeletion' in (meta.get('finalizers') or []):
                    deps = self._dependents(meta['uid'])
                    for dep_key, dep in deps:
                        if not dep['metadata'].get('deletionTimestamp'):
                            self._delete(self._rtype_for_key(dep_key), dep['metadata'].get('namespace'),
                                         dep['metadata']['name'], {'propagationPolicy': 'Foreground'}, {}, False)
                            changed = True
                    if not deps:
                        rest = [f for f in meta['finalizers'] if f != 'foregroundDeletion']
                        self._update(rtype, obj, {**obj, 'metadata': {**meta, 'finalizers': rest}}, None,
                                     'garbage-collector', 'Update', False)
                        changed = True
                elif key == ('', 'namespaces') and meta.get('deletionTimestamp'):
                    contents = self.store.iter_all(lambda o: o['metadata'].get('namespace') == meta['name'])
                    for dep_key, dep in contents:
                        if not dep['metadata'].get('deletionTimestamp'):
                            self._delete(self._rtype_for_key(dep_key), meta['name'], dep['metadata']['name'], {}, {}, False)
                            changed = True
                    if not contents and not meta.get('finalizers'):
                        self._remove(rtype, obj)
                        changed = True

    def _owner_alive(self, uid: str) -> bool:
        where = self.store.by_uid.get(uid)
        if where is None:
            return False
        owner = self.store.get(where[0], *where[1])
        # An owner being deleted in the foreground keeps its dependents only until the GC takes them.
        return owner is not None and 'foregroundDeletion' not in (owner['metadata'].get('finalizers') or [])
