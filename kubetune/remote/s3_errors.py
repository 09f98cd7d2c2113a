"""Turn S3 failures into a retry or one actionable line: the codes and exceptions every
step reads the same way (`transient`, `transport_failure`, the code tables), and the
initializers' messages (`S3Errors`); the exporter words its own from the same tables."""

from __future__ import annotations

from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from botocore.exceptions import ConnectionError as BotocoreConnectionError
from botocore.exceptions import HTTPClientError
from urllib3.exceptions import ProtocolError, ReadTimeoutError as Urllib3ReadTimeout

from kubetune import env
from kubetune.errors import BadInputError, TransientError
from kubetune.remote import settings
from kubetune.retry import TransientFailure
from kubetune.remote.unknown_host import unknown_host_error

TRANSIENT_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
                   "RequestTimeTooSkewed", "InternalError", "ServiceUnavailable",
                   "RequestLimitExceeded", "503", "500", "502", "504"}
CREDENTIAL_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken",
                    "ExpiredToken", "TokenRefreshRequired", "InvalidClientTokenId"}
DENIED_CODES = {"AccessDenied", "403", "AllAccessDisabled"}
# What botocore and urllib3 raise when a connection fails or drops mid-body.
TRANSPORT_ERRORS = (EndpointConnectionError, ConnectionClosedError, ConnectTimeoutError,
                    ReadTimeoutError, IncompleteReadError, ResponseStreamingError,
                    BotocoreConnectionError, HTTPClientError, ProtocolError, Urllib3ReadTimeout,
                    ConnectionError, TimeoutError)
NO_CREDENTIALS = (NoCredentialsError, PartialCredentialsError)
NO_CREDENTIALS_MESSAGE = ("no S3 credentials: set ACCESS_KEY_ID and SECRET_ACCESS_KEY (or "
                          "their *_FILE variants), ROLE_ARN, or the standard AWS chain")


def unknown_s3_host(exc: BaseException) -> BadInputError | None:
    """One line for an S3 host name that does not exist, naming the variable it came from."""
    endpoint = settings.s3_endpoint()
    if endpoint:
        return unknown_host_error(exc, endpoint.value, endpoint.variable, "")
    return unknown_host_error(exc, None, None, f"AWS's endpoint for the region: set "
                                               f"{env.S3_ENDPOINT} for another store")


def retry_after(exc: ClientError) -> float | None:
    """The seconds an S3 error's Retry-After header asks for, if any."""
    headers = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    try:
        return float(headers["retry-after"]) if "retry-after" in headers else None
    except ValueError:
        return None


def code_of(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def is_missing_key(exc: ClientError) -> bool:
    """The object is not there (GET's NoSuchKey, HEAD's bare 404)."""
    return code_of(exc) in ("NoSuchKey", "404")


def status_of(exc: ClientError) -> int | None:
    return exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def transient(exc: ClientError, said: str = "S3") -> TransientFailure | None:
    """A retry for a throttled or failing store (its own pace, where it says one), logged
    as ``<said> <code>``."""
    code, status = code_of(exc), status_of(exc)
    if code in TRANSIENT_CODES or (status is not None and status >= 500) or status == 429:
        return TransientFailure(f"{said} {code or status}", retry_after(exc))
    return None


def transport_failure(exc: BaseException) -> TransientFailure | None:
    """A retry for a connection that failed or dropped; an unknown host raises one line."""
    unknown = unknown_s3_host(exc)
    if unknown is not None:
        raise unknown from None
    if isinstance(exc, TRANSPORT_ERRORS):
        return TransientFailure(f"{type(exc).__name__}: {exc}")
    return None


class S3Errors:
    def __init__(self, bucket: str, prefix: str) -> None:
        self.bucket = bucket
        self.prefix = prefix

    def client_error(self, exc: ClientError, key: str | None = None) -> Exception:
        """A BadInputError, a TransientError, or a TransientFailure (retry) for ``exc``."""
        code, status = code_of(exc), status_of(exc)
        where = f"s3://{self.bucket}/{key}" if key else f"bucket {self.bucket}"
        retry = transient(exc)
        if retry is not None:
            return retry
        if code == "NoSuchBucket":
            return BadInputError(f"bucket {self.bucket} does not exist (check STORAGE_URI and "
                                 "ENDPOINT / REGION)")
        if is_missing_key(exc) and key:
            return BadInputError(f"{where} vanished while downloading (deleted meanwhile?)")
        if code in CREDENTIAL_CODES:
            return BadInputError(f"{where}: the S3 credentials were rejected ({code}): check "
                                 "ACCESS_KEY_ID / SECRET_ACCESS_KEY or ROLE_ARN")
        if code in DENIED_CODES or status == 403:
            return BadInputError(f"{where}: access denied (the credentials lack s3:ListBucket / "
                                 "s3:GetObject on it)")
        if code in ("PreconditionFailed", "412"):
            # The object changed between listing and download: a fresh run lists it again.
            return TransientError(f"{where} changed while downloading: rerun to fetch the new "
                                  "version")
        if code == "AuthorizationHeaderMalformed" or code == "PermanentRedirect":
            return BadInputError(f"bucket {self.bucket} is in another region: set REGION")
        return BadInputError(f"{where}: S3 refused the request ({code or status})")

    def classify(self, exc: BaseException) -> TransientFailure | None:
        if isinstance(exc, ClientError):
            mapped = self.client_error(exc)
            if isinstance(mapped, TransientFailure):
                return mapped
            raise mapped from None
        if isinstance(exc, NO_CREDENTIALS):
            raise BadInputError(NO_CREDENTIALS_MESSAGE) from None
        return transport_failure(exc)


def role_classify(role_arn: str):
    """`kubetune.retry` classify for STS AssumeRole: a refused role is one line, not a retry."""
    errors = S3Errors("-", "")

    def classify(exc: BaseException) -> TransientFailure | None:
        if isinstance(exc, ClientError):
            mapped = errors.client_error(exc)
            if isinstance(mapped, TransientFailure):
                return mapped
            code = code_of(exc) or "error"
            raise BadInputError(f"cannot assume ROLE_ARN {role_arn} ({code}): check the role's "
                                "trust policy and the credentials the pod has") from None
        return errors.classify(exc)

    return classify
