"""Credentials, from an env value or a mounted Secret file, registered for redaction.

Every secret can be given inline (``ACCESS_TOKEN=...``) or as a file path
(``ACCESS_TOKEN_FILE=/var/run/secrets/hf/token``), the way a Kubernetes Secret is
mounted. Whatever is read is registered with `kubetune.redact` before it is used, so it
never reaches a log line or an error message.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from kubetune import env
from kubetune.errors import BadInputError
from kubetune.redact import register_secret
from kubetune.remote import endpoint_values, settings

FILE_SUFFIX = "_FILE"


def _one_line(value: str, where: str) -> str | None:
    """``value`` without the whitespace around it (a Secret file's trailing newline);
    registered for redaction before anything can print it, each line on its own."""
    register_secret(value)
    value = value.strip()
    if any(c.isspace() for c in value):
        # A header or a signature built from it would fail with the value in the message.
        raise BadInputError(f"{where} holds more than one line or word; a token or key is "
                            "one: fix the Secret")
    return value or None


def secret(*names: str) -> str | None:
    """The first of ``names`` set inline, or through ``<NAME>_FILE``; None if none is."""
    # Secrets are read here alone (each registered for redaction before any use).
    for name in names:
        value = os.environ.get(name)
        if value:
            return _one_line(value, name)
        path = os.environ.get(name + FILE_SUFFIX)
        if path:
            try:
                value = Path(path).read_text()
            except OSError as exc:
                raise BadInputError(f"{name}{FILE_SUFFIX} names {path}, which cannot be read: "
                                    f"{exc.strerror}") from None
            return _one_line(value, f"the file {name}{FILE_SUFFIX} names ({path})")
    return None


def hf_token() -> str | None:
    """Kubeflow's ACCESS_TOKEN first, then Hugging Face's own HF_TOKEN."""
    token = secret(env.ACCESS_TOKEN, env.HF_TOKEN)
    path = os.environ.get(env.HF_TOKEN_PATH)
    if token is None and path:
        try:
            value = Path(path).read_text()
        except OSError:
            return None
        token = _one_line(value, f"the file {env.HF_TOKEN_PATH} names ({path})")
    return token


@dataclass
class S3Credentials:
    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    role_arn: str | None = None


def s3_credentials() -> S3Credentials:
    """Kubeflow's S3 variables; unset keys fall back to boto3's standard chain. Each value
    is checked here, where it is read: one line naming the variable, not a library's
    exception (or a request signed with an empty secret)."""
    endpoint, region, role = settings.s3_endpoint(), settings.s3_region(), settings.s3_role_arn()
    key_id, secret_key = secret(env.S3_ACCESS_KEY_ID), secret(env.S3_SECRET_ACCESS_KEY)
    if (key_id is None) != (secret_key is None):
        given, missing = ((env.S3_ACCESS_KEY_ID, env.S3_SECRET_ACCESS_KEY) if key_id else
                          (env.S3_SECRET_ACCESS_KEY, env.S3_ACCESS_KEY_ID))
        # boto3 would sign with the half it has (an empty secret) and the store answer
        # SignatureDoesNotMatch, far from the cause.
        raise BadInputError(f"{given} is set but {missing} is not: set both (or their "
                            f"{FILE_SUFFIX} variants), or neither for the standard AWS chain")
    return S3Credentials(
        endpoint_url=endpoint_values.endpoint_url(endpoint.value, endpoint.variable)
        if endpoint else None,
        region=endpoint_values.region(region.value, region.variable) if region else None,
        access_key_id=key_id,
        secret_access_key=secret_key,
        role_arn=endpoint_values.role_arn(role.value, role.variable) if role else None,
    )
