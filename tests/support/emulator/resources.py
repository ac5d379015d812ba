"""The resource types the emulator serves: a fixed set of built-ins plus CRDs registered at runtime."""
from __future__ import annotations

import dataclasses
from typing import Any

_GENERATION_GROUPS = frozenset({'apps', 'autoscaling', 'policy', 'networking.k8s.io', 'apiextensions.k8s.io'})
VERBS = ['create', 'delete', 'deletecollection', 'get', 'list', 'patch', 'update', 'watch']


@dataclasses.dataclass
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    subresources: tuple[str, ...] = ()
    short_names: tuple[str, ...] = ()
    singular: str = ''
    categories: tuple[str, ...] = ()
    crd: dict[str, Any] | None = None  # the CRD object for custom resources; None for built-ins
    printer_columns: tuple[dict[str, Any], ...] = ()
    selectable_fields: tuple[str, ...] = ()  # CRD ``selectableFields`` as dotted paths

    @property
    def api_version(self) -> str:
        return f'{self.group}/{self.version}' if self.group else self.version

    @property
    def group_plural(self) -> tuple[str, str]:
        """The storage identity: all served versions of a resource share one set of objects."""
        return self.group, self.plural

    @property
    def tracks_generation(self) -> bool:
        """Whether objects carry ``metadata.generation`` (spec-bearing kinds; not e.g. ConfigMaps)."""
        return self.crd is not None or self.group in _GENERATION_GROUPS

    @property
    def has_status(self) -> bool:
        return 'status' in self.subresources

    def discovery_entries(self) -> list[dict[str, Any]]:
        entry = {
            'name': self.plural, 'singularName': self.singular or self.kind.lower(),
            'namespaced': self.namespaced, 'kind': self.kind, 'verbs': VERBS,
            'shortNames': list(self.short_names), 'categories': list(self.categories),
        }
        entries = [entry]
        for sub in self.subresources:
            kind = 'Scale' if sub == 'scale' else self.kind
            group = 'autoscaling' if sub == 'scale' else self.group
            version = 'v1' if sub == 'scale' else self.version
            entries.append({'name': f'{self.plural}/{sub}', 'singularName': '', 'namespaced': self.namespaced,
                            'kind': kind, 'group': group, 'version': version, 'verbs': ['get', 'patch', 'update']})
        return entries


def _b(group: str, version: str, plural: str, kind: str, namespaced: bool = True,
       subresources: tuple[str, ...] = (), short: tuple[str, ...] = ()) -> ResourceType:
    return ResourceType(group, version, plural, kind, namespaced, subresources, short)


BUILTINS: list[ResourceType] = [
    _b('', 'v1', 'namespaces', 'Namespace', False, ('status',), ('ns',)),
    _b('', 'v1', 'pods', 'Pod', True, ('status',), ('po',)),
    _b('', 'v1', 'services', 'Service', True, ('status',), ('svc',)),
    _b('', 'v1', 'configmaps', 'ConfigMap', short=('cm',)),
    _b('', 'v1', 'secrets', 'Secret'),
    _b('', 'v1', 'serviceaccounts', 'ServiceAccount', short=('sa',)),
    _b('', 'v1', 'persistentvolumeclaims', 'PersistentVolumeClaim', True, ('status',), ('pvc',)),
    _b('', 'v1', 'endpoints', 'Endpoints', short=('ep',)),
    _b('', 'v1', 'events', 'Event', short=('ev',)),
    _b('', 'v1', 'nodes', 'Node', False, ('status',), ('no',)),
    _b('apps', 'v1', 'deployments', 'Deployment', True, ('status', 'scale'), ('deploy',)),
    _b('apps', 'v1', 'statefulsets', 'StatefulSet', True, ('status', 'scale'), ('sts',)),
    _b('apps', 'v1', 'replicasets', 'ReplicaSet', True, ('status', 'scale'), ('rs',)),
    _b('apps', 'v1', 'daemonsets', 'DaemonSet', True, ('status',), ('ds',)),
    _b('autoscaling', 'v2', 'horizontalpodautoscalers', 'HorizontalPodAutoscaler', True, ('status',), ('hpa',)),
    _b('policy', 'v1', 'poddisruptionbudgets', 'PodDisruptionBudget', True, ('status',), ('pdb',)),
    _b('rbac.authorization.k8s.io', 'v1', 'roles', 'Role'),
    _b('rbac.authorization.k8s.io', 'v1', 'rolebindings', 'RoleBinding'),
    _b('rbac.authorization.k8s.io', 'v1', 'clusterroles', 'ClusterRole', False),
    _b('rbac.authorization.k8s.io', 'v1', 'clusterrolebindings', 'ClusterRoleBinding', False),
    _b('discovery.k8s.io', 'v1', 'endpointslices', 'EndpointSlice'),
    _b('coordination.k8s.io', 'v1', 'leases', 'Lease'),
    _b('events.k8s.io', 'v1', 'events', 'Event', short=('ev',)),
    _b('networking.k8s.io', 'v1', 'networkpolicies', 'NetworkPolicy', short=('netpol',)),
    _b('apiextensions.k8s.io', 'v1', 'customresourcedefinitions', 'CustomResourceDefinition', False,
       ('status',), ('crd', 'crds')),
]


def types_from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """One ResourceType per served version of a CRD."""
    spec = crd.get('spec', {})
    names = spec.get('names', {})
    result = []
    for version in spec.get('versions', []):
        if not version.get('served', True):
            continue
        subresources = tuple(sorted((version.get('subresources') or {}).keys()))
        result.append(ResourceType(
            group=spec['group'], version=version['name'], plural=names['plural'], kind=names['kind'],
            namespaced=spec.get('scope', 'Namespaced') == 'Namespaced', subresources=subresources,
            short_names=tuple(names.get('shortNames') or ()), singular=names.get('singular', ''),
            categories=tuple(names.get('categories') or ()), crd=crd,
            printer_columns=tuple(version.get('additionalPrinterColumns') or ()),
            selectable_fields=tuple(f['jsonPath'].lstrip('.') for f in version.get('selectableFields') or ()),
        ))
    return result


def crd_definition_errors(crd: dict[str, Any]) -> list[str]:
    """The structural checks the API server makes on a CRD before accepting it."""
    errors = []
    spec = crd.get('spec') or {}
    names = spec.get('names') or {}
    for field in ('group', 'names', 'scope', 'versions'):
        if not spec.get(field):
            errors.append(f'spec.{field}: Required value')
    for field in ('plural', 'kind'):
        if not names.get(field):
            errors.append(f'spec.names.{field}: Required value')
    if spec.get('scope') not in (None, 'Namespaced', 'Cluster'):
        errors.append(f'spec.scope: Unsupported value: "{spec.get("scope")}": supported values: "Cluster", "Namespaced"')
    expected = f"{names.get('plural')}.{spec.get('group')}"
    if crd.get('metadata', {}).get('name') != expected:
        errors.append(f'metadata.name: Invalid value: "{crd.get("metadata", {}).get("name")}": must be spec.names.plural+"."+spec.group')
    versions = spec.get('versions') or []
    if versions and sum(1 for v in versions if v.get('storage')) != 1:
        errors.append('spec.versions: Invalid value: must have exactly one version marked as storage version')
    for index, version in enumerate(versions):
        if not (version.get('schema') or {}).get('openAPIV3Schema'):
            errors.append(f'spec.versions[{index}].schema.openAPIV3Schema: Required value: schemas are required')
        elif version['schema']['openAPIV3Schema'].get('type') != 'object':
            errors.append(f'spec.versions[{index}].schema.openAPIV3Schema.type: Required value: must be object at the root')
    return errors
