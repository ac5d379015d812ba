"""How a backend call can end badly, seen from the pipeline, and the replies the client gets.

Two outcomes, two classes, because the pipeline treats them oppositely:
- `RetryableFailure`: the call broke, timed out, answered 5xx or an unusable reply (or 400 to a
  metadata-only body). Nothing reached the client, so another instance may be tried.
- `BackendRejection`: the backend refused the request as a client error (4xx other than 408 and
  429). Another instance would answer the same, so the client gets this reply as it is.
The transport's own error (`upstream.TransportError`) becomes a `RetryableFailure` in pipeline.py.
"""

from __future__ import annotations

from .http_messages import CONTENT_TYPE, REQUEST_ID, Response
from .protocol import error_body

JSON = "application/json"


class RetryableFailure(Exception):
    """A backend call failed before anything reached the client: it may be retried elsewhere."""

    def __init__(self, kind: str, role: str, status: int = 502, body: bytes = b"", content_type: str = JSON) -> None:
        super().__init__(kind)
        self.kind = kind  # connect | timeout | status | reply | read
        self.role = role  # the tier that failed: encoder | prefill | decode
        self.status = status
        self.body = body
        self.content_type = content_type

    def response(self, rid: str) -> Response:
        """What the client gets once no retry is left."""
        if self.kind == "status" and self.body:
            return Response(
                body=self.body, status=self.status, headers={CONTENT_TYPE: self.content_type, REQUEST_ID: rid}
            )
        status = 504 if self.kind == "timeout" else 502
        return json_error(status, f"{self.role} failed ({self.kind})", rid, "upstream_error")


class BackendRejection(Exception):
    """A backend refused the request as a client error: relayed to the client as it is."""

    def __init__(self, status: int, body: bytes, content_type: str) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.content_type = content_type

    def response(self, rid: str) -> Response:
        return Response(body=self.body, status=self.status, headers={CONTENT_TYPE: self.content_type, REQUEST_ID: rid})


def json_error(
    status: int, message: str, rid: str | None = None, err_type: str = "invalid_request_error", param: str | None = None
) -> Response:
    headers = {CONTENT_TYPE: JSON}
    if rid:
        headers[REQUEST_ID] = rid
    return Response(body=error_body(message, status, err_type, param), status=status, headers=headers)


def is_client_error(status: int) -> bool:
    """4xx that another instance would answer the same way (not timeouts or throttling)."""
    return 400 <= status < 500 and status not in (408, 429)
