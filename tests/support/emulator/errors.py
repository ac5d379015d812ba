"""API failures as Kubernetes ``Status`` objects, worded as kube-apiserver words them."""
from __future__ import annotations

from typing import Any

from tests.support.emulator.resources import ResourceType


class ApiError(Exception):
    """A failure rendered as a Kubernetes ``Status`` object."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> dict[str, Any]:
        return {'apiVersion': 'v1', 'kind': 'Status', 'metadata': {}, 'status': 'Failure',
                'message': self.message, 'reason': self.reason, 'details': self.details, 'code': self.code}


def invalid(rtype: ResourceType, name: str, errors: list[str]) -> ApiError:
    what = f'{rtype.kind}.{rtype.group}' if rtype.group else rtype.kind
    causes = [{'reason': 'FieldValueInvalid', 'message': e, 'field': e.split(':', 1)[0]} for e in errors]
    return ApiError(422, 'Invalid', f'{what} "{name}" is invalid: [{", ".join(errors)}]'
                    if len(errors) > 1 else f'{what} "{name}" is invalid: {errors[0]}',
                    {'name': name, 'group': rtype.group, 'kind': rtype.kind, 'causes': causes})


def not_found(rtype: ResourceType, name: str) -> ApiError:
    what = f'{rtype.plural}.{rtype.group}' if rtype.group else rtype.plural
    return ApiError(404, 'NotFound', f'{what} "{name}" not found',
                    {'name': name, 'group': rtype.group, 'kind': rtype.plural})


def conflict(rtype: ResourceType, name: str, why: str = 'the object has been modified; please apply '
              'your changes to the latest version and try again') -> ApiError:
    what = f'{rtype.plural}.{rtype.group}' if rtype.group else rtype.plural
    return ApiError(409, 'Conflict', f'Operation cannot be fulfilled on {what} "{name}": {why}',
                    {'name': name, 'group': rtype.group, 'kind': rtype.plural})
