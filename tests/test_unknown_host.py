"""An offline cluster: a host name that does not exist ends the step at once (exit 65,
naming the host and its variable); a resolver that did not answer is retried."""

from __future__ import annotations

import socket

import httpx2
import pytest
from botocore.exceptions import EndpointConnectionError

from kubetune.remote.hub_errors import HubErrors
from kubetune.remote.s3_errors import S3Errors
from kubetune.errors import BadInputError
from kubetune.retry import TransientFailure
from tests.support.cli import clean_env, error_lines, kubetune

UNRESOLVABLE = "nonexistent.invalid"  # the .invalid TLD never resolves (RFC 2606)


def test_an_unknown_hub_host_fails_at_once_without_a_retry(tmp_path):
    # The default budget (8 attempts with backoff) is left as it is: none of it is spent.
    term = tmp_path / "termination-log"
    result = kubetune("init-model", env=clean_env(
        STORAGE_URI="hf://org/name", OUTPUT_PATH=str(tmp_path / "model"),
        HF_ENDPOINT=f"https://{UNRESOLVABLE}", KUBETUNE_TERMINATION_LOG=str(term)))
    assert result.returncode == 65, result.stderr
    assert "retry" not in result.stderr
    [line] = error_lines(result)
    assert f"host {UNRESOLVABLE} does not exist" in line
    assert f"HF_ENDPOINT=https://{UNRESOLVABLE}" in line
    assert term.read_text().strip() == line.removeprefix("error: ")
    assert not (tmp_path / "model").exists()


def _resolver_failure(code: int, message: str) -> socket.gaierror:
    # What the resolver raised for a real lookup, so the chain below is the libraries' own.
    return socket.gaierror(code, message)


def _httpx_error(code: int, message: str) -> httpx2.ConnectError:
    try:
        try:
            raise _resolver_failure(code, message)
        except socket.gaierror as cause:
            raise httpx2.ConnectError(str(cause)) from cause
    except httpx2.ConnectError as exc:
        return exc


def test_the_resolvers_own_answer_for_an_invalid_name_is_eai_noname():
    with pytest.raises(socket.gaierror) as caught:
        socket.getaddrinfo(UNRESOLVABLE, 443)
    assert caught.value.errno == socket.EAI_NONAME


def test_a_resolver_that_did_not_answer_stays_transient(monkeypatch):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    errors = HubErrors("org/name", "model", "https://hub.example", None, False)
    again = _httpx_error(socket.EAI_AGAIN, "Temporary failure in name resolution")
    assert isinstance(errors.classify(again), TransientFailure)
    gone = _httpx_error(socket.EAI_NONAME, "Name or service not known")
    with pytest.raises(BadInputError, match="host hub.example does not exist.*default hub"):
        errors.classify(gone)


def test_s3_names_the_variable_the_endpoint_came_from(monkeypatch):
    monkeypatch.setenv("ENDPOINT", f"http://{UNRESOLVABLE}:9000")
    errors = S3Errors("bucket", "prefix")
    for code, outcome in ((socket.EAI_AGAIN, "transient"), (socket.EAI_NONAME, "bad input")):
        try:
            try:
                raise _resolver_failure(code, "resolver")
            except socket.gaierror as cause:
                raise EndpointConnectionError(endpoint_url=f"http://{UNRESOLVABLE}:9000") \
                    from cause
        except EndpointConnectionError as exc:
            if outcome == "transient":
                assert isinstance(errors.classify(exc), TransientFailure)
            else:
                with pytest.raises(BadInputError, match=f"ENDPOINT=http://{UNRESOLVABLE}:9000"):
                    errors.classify(exc)
