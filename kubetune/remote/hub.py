"""The Hugging Face Hub as every step reaches it: endpoint, token, client, timeouts.

``HF_ENDPOINT`` names a mirror (default https://huggingface.co); the token is Kubeflow's
``ACCESS_TOKEN`` or the hub's own ``HF_TOKEN`` / ``HF_TOKEN_PATH`` (`kubetune.remote.credentials`).
"""

from __future__ import annotations

import logging
import os
from urllib.parse import quote

from kubetune import env

# No bars: a pod's log is not a terminal. Set before huggingface_hub reads its constants.
os.environ.setdefault(env.HF_HUB_DISABLE_PROGRESS_BARS, "1")
os.environ.setdefault(env.HF_HUB_DISABLE_TELEMETRY, "1")

from kubetune.remote import endpoint_values, settings  # noqa: E402

# huggingface_hub parses HF_ENDPOINT as it is imported (urllib's ValueError for a bad port
# would be a traceback, with a piece of a password in it): checked before.
_mirror = settings.hub_endpoint()
if _mirror:
    endpoint_values.endpoint_url(_mirror.value, _mirror.variable)

import httpx2  # noqa: E402
from huggingface_hub import HfApi  # noqa: E402
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status  # noqa: E402

from kubetune.remote import credentials  # noqa: E402

# One INFO line per request would bury the progress lines.
for _noisy in ("httpx", "httpx2", "huggingface_hub"):
    logging.getLogger(_noisy).setLevel(logging.WARNING)

DEFAULT_ENDPOINT = "https://huggingface.co"


def endpoint() -> str:
    """The hub's base URL, without a trailing slash; a malformed ``HF_ENDPOINT`` is one
    line (httpx would refuse it on every attempt, retried as if the hub were down)."""
    named = settings.hub_endpoint()
    return endpoint_values.endpoint_url(named.value, named.variable) if named else DEFAULT_ENDPOINT


def token(given: str | None = None) -> str | None:
    """``given`` (an option's value), else the one the environment holds."""
    return given or credentials.hf_token()


def http_timeout(seconds: float | None = None) -> httpx2.Timeout:
    """``seconds`` (default ``KUBETUNE_HTTP_TIMEOUT_S``) per request; connecting, at most 30."""
    seconds = settings.http_timeout_s() if seconds is None else seconds
    return httpx2.Timeout(seconds, connect=min(seconds, 30.0))


def api(hub_token: str | None, *, bounded: bool = True, timeout_s: float | None = None) -> HfApi:
    """An `HfApi` on `endpoint` with ``hub_token`` (None: anonymous, never a cached login).

    ``bounded``: huggingface_hub's shared client has no timeout, and a stalled hub would
    hang the pod; a download bounds every request by ``KUBETUNE_HTTP_TIMEOUT_S`` (or
    ``timeout_s``: a quick check's shorter bound).
    """
    if bounded:
        get_session().timeout = http_timeout(timeout_s)
    return HfApi(endpoint=endpoint(), token=hub_token or False)


def file_url(repo_id: str, path: str, revision: str | None = None) -> str:
    """The hub's download URL of one file of a model repo (``revision``: default main)."""
    return f"{endpoint()}/{repo_id}/resolve/{quote(revision or 'main', safe='')}/{quote(path)}"


def read_small_file(repo_id: str, path: str, hub_token: str | None,
                    revision: str | None = None) -> bytes:
    """One file of a model repo, whole, in one bounded request (a single attempt: the
    caller's `kubetune.retry` loop retries). For small files only: `config.json`."""
    response = get_session().get(file_url(repo_id, path, revision),
                                 headers=build_hf_headers(token=hub_token or False),
                                 timeout=http_timeout(), follow_redirects=True)
    hf_raise_for_status(response)
    return response.content
