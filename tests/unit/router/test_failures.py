"""router/failures.py: what the client gets when a backend call fails or refuses, word for word."""

from __future__ import annotations

import orjson
import pytest

from epd_operator.router.failures import BackendRejection, RetryableFailure, is_client_error, json_error


def error_of(body: bytes) -> dict:
    return orjson.loads(body)["error"]


def test_a_failed_calls_own_answer_is_relayed_when_it_has_a_body():
    failure = RetryableFailure("status", "decode", 503, b"busy", "text/plain")
    assert (str(failure), failure.kind, failure.role) == ("status", "status", "decode")
    reply = failure.response("r-1")
    assert (reply.status, reply.body, reply.headers) == (
        503,
        b"busy",
        {"Content-Type": "text/plain", "x-request-id": "r-1"},
    )


@pytest.mark.parametrize(
    ("failure", "status", "message"),
    [
        (RetryableFailure("status", "prefill", 500), 502, "prefill failed (status)"),  # no body to relay
        (RetryableFailure("connect", "encoder"), 502, "encoder failed (connect)"),
        (RetryableFailure("timeout", "decode"), 504, "decode failed (timeout)"),
    ],
)
def test_otherwise_the_client_gets_the_routers_own_error(failure, status, message):
    reply = failure.response("r-2")
    assert (reply.status, reply.headers) == (status, {"Content-Type": "application/json", "x-request-id": "r-2"})
    assert error_of(reply.body) == {"message": message, "type": "upstream_error", "param": None, "code": status}


def test_a_failure_defaults_to_a_json_bad_gateway():
    failure = RetryableFailure("read", "decode")
    assert (failure.status, failure.body, failure.content_type) == (502, b"", "application/json")


def test_a_rejection_is_relayed_as_the_backend_gave_it():
    rejection = BackendRejection(400, b'{"error": "bad"}', "application/json; charset=utf-8")
    assert (str(rejection), rejection.status) == ("400", 400)
    reply = rejection.response("r-3")
    assert (reply.status, reply.body, reply.headers) == (
        400,
        b'{"error": "bad"}',
        {"Content-Type": "application/json; charset=utf-8", "x-request-id": "r-3"},
    )


def test_json_errors_name_their_request_when_there_is_one():
    reply = json_error(413, "too large", param="body")
    assert (reply.status, reply.headers) == (413, {"Content-Type": "application/json"})
    assert error_of(reply.body) == {
        "message": "too large",
        "type": "invalid_request_error",
        "param": "body",
        "code": 413,
    }
    assert json_error(400, "bad", "r-4").headers == {"Content-Type": "application/json", "x-request-id": "r-4"}


@pytest.mark.parametrize(
    ("status", "client"),
    [(399, False), (400, True), (404, True), (408, False), (429, False), (499, True), (500, False)],
)
def test_client_errors_are_4xx_but_timeouts_and_throttling(status, client):
    assert is_client_error(status) is client
