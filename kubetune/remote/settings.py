"""What the clients of remote stores read from the environment, each value in one place:
which endpoint a store is reached at (with the variable that named it, for the error lines
that tell the user what to fix), the S3 region and role, and the timeout of one request.

Read when a client is made (not at import): a step's tests and `kubetune local` set these
per run. The values are checked where they are used (`endpoint_values`), since a bad one
must be one line naming the variable, whichever client reads it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from kubetune import env
from kubetune.env_numbers import env_float

DEFAULT_HTTP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Named:
    """A value and the variable it came from."""
    variable: str
    value: str


def first_set(*variables: str) -> Named | None:
    """The first of ``variables`` with a non-empty value (Kubeflow's name before the
    library's own alternative)."""
    # The one reader of these values: this process's environment as the pod spec set it.
    return next((Named(name, os.environ[name]) for name in variables if os.environ.get(name)),
                None)


def s3_endpoint() -> Named | None:
    """``ENDPOINT`` (Kubeflow's), else boto3's own ``AWS_ENDPOINT_URL``."""
    return first_set(env.S3_ENDPOINT, env.AWS_ENDPOINT_URL)


def s3_region() -> Named | None:
    return first_set(env.S3_REGION, env.AWS_DEFAULT_REGION)


def s3_role_arn() -> Named | None:
    return first_set(env.S3_ROLE_ARN)


def hub_endpoint() -> Named | None:
    """``HF_ENDPOINT`` (a mirror), unchecked; None: the default hub."""
    return first_set(env.HF_ENDPOINT)


def http_timeout_s(environ: Mapping[str, str] | None = None) -> float:
    """Seconds one request may take to connect or to answer (``KUBETUNE_HTTP_TIMEOUT_S``);
    ``environ``: a pod spec's values, checked before it runs (default: this process's)."""
    return env_float(env.HTTP_TIMEOUT_S, DEFAULT_HTTP_TIMEOUT_S, minimum=1, environ=environ)
