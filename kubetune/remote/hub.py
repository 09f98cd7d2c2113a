"""The Hugging Face Hub as every step reaches it: endpoint, token, client, timeouts.

``HF_ENDPOINT`` names a mirror (default https://huggingface.co); the token is Kubeflow's
``ACCESS_TOKEN`` or the hub's own ``HF_TOKEN`` / ``HF_TOKEN_PATH`` (`kubetune.credentials`).
"""

from __future__ import annotations

import logging
import os

from kubetune import env

# No bars: a pod's log is not a terminal. Set before huggingface_hub reads its constants.
os.environ.setdefault(env.HF_HUB_DISABLE_PROGRESS_BARS, "1")
os.environ.setdefault(env.HF_HUB_DISABLE_TELEMETRY, "1")

import httpx2  # noqa: E402
from huggingface_hub import HfApi  # noqa: E402
from huggingface_hub.utils import get_session  # noqa: E402

from kubetune import credentials  # noqa: E402
from kubetune.env_numbers import env_float  # noqa: E402

# One INFO line per request would bury the progress lines.
for _noisy in ("httpx", "httpx2", "huggingface_hub"):
    logging.getLogger(_noisy).setLevel(logging.WARNING)

DEFAULT_ENDPOINT = "https://huggingface.co"


def endpoint() -> str:
    """The hub's base URL, without a trailing slash."""
    return (os.environ.get(env.HF_ENDPOINT) or DEFAULT_ENDPOINT).rstrip("/")


def token(given: str | None = None) -> str | None:
    """``given`` (an option's value), else the one the environment holds."""
    return given or credentials.hf_token()


def http_timeout() -> httpx2.Timeout:
    seconds = env_float(env.HTTP_TIMEOUT_S, 60.0, minimum=1)
    return httpx2.Timeout(seconds, connect=min(seconds, 30.0))


def api(hub_token: str | None, *, bounded: bool = True) -> HfApi:
    """An `HfApi` on `endpoint` with ``hub_token`` (None: anonymous, never a cached login).

    ``bounded``: huggingface_hub's shared client has no timeout, and a stalled hub would
    hang the pod; a download bounds every request by ``KUBETUNE_HTTP_TIMEOUT_S``.
    """
    if bounded:
        get_session().timeout = http_timeout()
    return HfApi(endpoint=endpoint(), token=hub_token or False)
