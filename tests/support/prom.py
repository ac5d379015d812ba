"""Prometheus exposition text read the way Prometheus reads it: prometheus_client's parser, then
samples by name and labels. A substring check passes on a different label order or value format
and fails on a harmless one; these do neither."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def samples(text: str | bytes) -> list[Sample]:
    if isinstance(text, bytes):
        text = text.decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def sample_values(text: str | bytes, name: str, **labels: str) -> list[float]:
    """The values of the samples of `name` whose labels include `labels`, in exposition order."""
    return [s.value for s in samples(text) if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def metric_value(text: str | bytes, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0 when there are none)."""
    return sum(sample_values(text, name, **labels))
