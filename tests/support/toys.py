"""A toy CRD exercising the schema features the emulator enforces (defaults, enums,
int-or-string, preserved fields, CEL incl. a transition rule, status and scale subresources)."""
from __future__ import annotations

from typing import Any

TOY_CRD: dict[str, Any] = {
    'apiVersion': 'apiextensions.k8s.io/v1', 'kind': 'CustomResourceDefinition',
    'metadata': {'name': 'widgets.toys.example.com'},
    'spec': {
        'group': 'toys.example.com', 'scope': 'Namespaced',
        'names': {'plural': 'widgets', 'singular': 'widget', 'kind': 'Widget', 'shortNames': ['wd']},
        'versions': [{
            'name': 'v1', 'served': True, 'storage': True,
            'subresources': {'status': {}, 'scale': {'specReplicasPath': '.spec.replicas',
                                                     'statusReplicasPath': '.status.replicas'}},
            'selectableFields': [{'jsonPath': '.spec.model'}],
            'additionalPrinterColumns': [{'name': 'Replicas', 'type': 'integer', 'jsonPath': '.spec.replicas'}],
            'schema': {'openAPIV3Schema': {
                'type': 'object',
                'properties': {
                    'spec': {
                        'type': 'object', 'required': ['model'],
                        'x-kubernetes-validations': [
                            {'rule': 'self.replicas <= self.maxReplicas',
                             'message': 'replicas must not exceed maxReplicas'},
                            {'rule': 'self.model == oldSelf.model', 'message': 'model is immutable'},
                        ],
                        'properties': {
                            'model': {'type': 'string', 'minLength': 1},
                            'replicas': {'type': 'integer', 'minimum': 0, 'default': 1},
                            'maxReplicas': {'type': 'integer', 'default': 4},
                            'port': {'x-kubernetes-int-or-string': True},
                            'mode': {'type': 'string', 'enum': ['fast', 'slow']},
                            'extra': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True},
                        },
                    },
                    'status': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True},
                },
            }},
        }],
    },
}


def widget(name: str = 'w1', **spec: Any) -> dict[str, Any]:
    return {'apiVersion': 'toys.example.com/v1', 'kind': 'Widget', 'metadata': {'name': name},
            'spec': {'model': 'tiny', **spec}}
