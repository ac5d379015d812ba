"""Prometheus exposition text read the way Prometheus reads it: prometheus_client's parser, then
samples by name and labels. A substring check passes on a different label order or value format
and fails on a harmless one; these do neither."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

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


class Exposes(Protocol):
    def exposition(self) -> tuple[bytes, str]: ...


@contextlib.contextmanager
def serve_exposition(metrics: Exposes) -> Iterator[int]:
    """`metrics.exposition()` served at /metrics (any path) on a loopback port, for a real Prometheus
    to scrape; yields the port."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body, content_type = metrics.exposition()
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def log_tail(path: Path) -> str:
    """The end of a component's log, for a failure message."""
    return path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"
