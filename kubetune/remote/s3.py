"""An S3 client as every step makes it.

Credentials: Kubeflow's ``ACCESS_KEY_ID`` / ``SECRET_ACCESS_KEY`` (inline or ``*_FILE``),
``ROLE_ARN`` (assumed through STS), else boto3's standard chain (IRSA, instance profile,
``AWS_*``). ``ENDPOINT`` points at MinIO, Ceph or any S3-compatible store. botocore makes
single attempts: `kubetune.retry` is the one retry loop, and botocore's own would multiply
it (``total_max_attempts``; ``max_attempts`` counts retries after the first).
"""

from __future__ import annotations

import boto3
from botocore.config import Config

from kubetune import retry
from kubetune.redact import register_secret
from kubetune.remote import credentials, settings
from kubetune.remote.s3_errors import role_classify

SINGLE_ATTEMPT = {"total_max_attempts": 1, "mode": "standard"}


def _session(creds: credentials.S3Credentials, session_name: str) -> boto3.session.Session:
    session = boto3.session.Session(aws_access_key_id=creds.access_key_id,
                                    aws_secret_access_key=creds.secret_access_key,
                                    region_name=creds.region)
    if not creds.role_arn:
        return session
    # STS is reached through boto3's own endpoint resolution (AWS_ENDPOINT_URL_STS for a
    # local STS); ENDPOINT names the object store only.
    sts = session.client("sts", config=Config(retries=SINGLE_ATTEMPT))
    assumed = retry.call(lambda: sts.assume_role(RoleArn=creds.role_arn,
                                                 RoleSessionName=session_name),
                         f"assume role {creds.role_arn}",
                         classify=role_classify(creds.role_arn))["Credentials"]
    for value in (assumed["AccessKeyId"], assumed["SecretAccessKey"], assumed["SessionToken"]):
        register_secret(value)
    return boto3.session.Session(aws_access_key_id=assumed["AccessKeyId"],
                                 aws_secret_access_key=assumed["SecretAccessKey"],
                                 aws_session_token=assumed["SessionToken"],
                                 region_name=creds.region)


def client(session_name: str, **config):
    """An S3 client for the store the environment names, as ``session_name`` (the
    AssumeRole session: which step it was). ``config``: more botocore `Config` options."""
    creds = credentials.s3_credentials()
    timeout = settings.http_timeout_s()
    options = {"connect_timeout": min(timeout, 30.0), "read_timeout": timeout, **config}
    return _session(creds, session_name).client(
        "s3", endpoint_url=creds.endpoint_url, config=Config(retries=SINGLE_ATTEMPT, **options))
