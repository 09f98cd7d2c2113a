"""Turn Hugging Face Hub failures into a retry or one actionable line: what every step
reads the same way (`unknown_hub_host`, `http_transient`, `transport_failure`), and the
initializers' messages (`HubErrors`); the exporter words its own refusals."""

from __future__ import annotations

import httpx2
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from kubetune import env
from kubetune.errors import BadInputError
from kubetune.redact import strip_userinfo
from kubetune.remote import settings
from kubetune.retry import TransientFailure
from kubetune.remote.unknown_host import unknown_host_error


def unknown_hub_host(exc: BaseException, endpoint: str) -> BadInputError | None:
    """One line for a hub host name that does not exist, naming where it came from."""
    variable = env.HF_ENDPOINT if settings.hub_endpoint() else None
    return unknown_host_error(exc, endpoint, variable,
                              f"the default hub {endpoint}: set {env.HF_ENDPOINT} to a mirror "
                              "the cluster can reach")


def retry_after(response: httpx2.Response | None) -> float | None:
    if response is None:
        return None
    value = response.headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff


def status_of(exc: BaseException) -> int | None:
    return getattr(getattr(exc, "response", None), "status_code", None)


def http_transient(exc: HfHubHTTPError) -> TransientFailure | None:
    """A retry for a throttled or failing hub (its own pace, where it says one)."""
    status = status_of(exc)
    if status is not None and (status == 429 or status >= 500):
        return TransientFailure(f"HTTP {status} from the hub", retry_after(exc.response))
    return None


def transport_failure(exc: BaseException, endpoint: str) -> TransientFailure | None:
    """A retry for a connection that failed or dropped; an unknown host raises one line."""
    unknown = unknown_hub_host(exc, endpoint)
    if unknown is not None:
        raise unknown from None
    # httpx's "Connection refused" names no address: say which hub, so a wrong
    # HF_ENDPOINT is seen at once.
    where = f" (hub at {strip_userinfo(endpoint)})"
    if isinstance(exc, httpx2.TransportError):
        return TransientFailure(f"{type(exc).__name__}: {str(exc) or 'connection failed'}{where}")
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return TransientFailure(f"{type(exc).__name__}: {exc}{where}")
    return None


class HubErrors:
    """Knows the repo being fetched, so every message names it."""

    def __init__(self, repo_id: str, repo_type: str, endpoint: str, revision: str | None,
                 has_token: bool) -> None:
        self.repo_id = repo_id
        self.repo_type = repo_type
        self.endpoint = endpoint
        self.revision = revision
        self.has_token = has_token

    @property
    def page(self) -> str:
        prefix = "datasets/" if self.repo_type == "dataset" else ""
        return f"{self.endpoint}/{prefix}{self.repo_id}"

    def bad_input(self, exc: HfHubHTTPError) -> BadInputError | None:
        status = exc.response.status_code if exc.response is not None else None
        kind = "dataset" if self.repo_type == "dataset" else "model"
        token_hint = ("" if self.has_token else
                      " (no token was given: set ACCESS_TOKEN or HF_TOKEN for a private repo)")
        if isinstance(exc, GatedRepoError):
            return BadInputError(f"gated repo {self.repo_id}: accept its licence at {self.page} "
                                 "with the account whose token you pass (ACCESS_TOKEN or HF_TOKEN)")
        if isinstance(exc, RevisionNotFoundError):
            return BadInputError(f"revision {self.revision or 'main'!r} not found in {kind} repo "
                                 f"{self.repo_id} (check REVISION)")
        if isinstance(exc, RemoteEntryNotFoundError):
            return BadInputError(f"a file listed in {kind} repo {self.repo_id} is missing on the "
                                 "hub (deleted meanwhile? pin REVISION to a commit)")
        if isinstance(exc, RepositoryNotFoundError):
            message = exc.server_message or ""
            if status == 401 and "Invalid credentials" in message:
                return BadInputError(f"the hub at {self.endpoint} rejected the token (invalid or "
                                     f"expired) for {self.repo_id}: check ACCESS_TOKEN / HF_TOKEN")
            return BadInputError(f"{kind} repo {self.repo_id} not found, or the token cannot see "
                                 f"it{token_hint}")
        if status == 401 and self.has_token:
            return BadInputError(f"the hub at {self.endpoint} rejected the token (invalid or "
                                 f"expired) for {self.repo_id}: check ACCESS_TOKEN / HF_TOKEN")
        if status == 401:
            return BadInputError(f"{kind} repo {self.repo_id} not found, or the token cannot see "
                                 f"it{token_hint}")
        if status == 403:
            return BadInputError(f"{kind} repo {self.repo_id}: access denied; the token lacks read "
                                 f"permission on it{token_hint}")
        if status == 404:
            return BadInputError(f"{kind} repo {self.repo_id} not found, or the token cannot see "
                                 f"it{token_hint}")
        if status is not None and 400 <= status < 500 and status not in (408, 429):
            return BadInputError(f"the hub refused a request for {self.repo_id} with HTTP {status}")
        return None

    def classify(self, exc: BaseException) -> TransientFailure | None:
        """For `kubetune.retry.call`: transient failures retry, bad input raises at once."""
        if isinstance(exc, HfHubHTTPError):
            bad = self.bad_input(exc)
            if bad is not None:
                raise bad from None
            # 408, 429, 5xx, or no response at all: the hub may answer next time.
            return http_transient(exc) or TransientFailure(
                f"HTTP {status_of(exc) or '?'} from the hub", retry_after(exc.response))
        return transport_failure(exc, self.endpoint)
