"""A host name that does not exist is the user's to fix, not a network hiccup.

An offline cluster, or a typo in HF_ENDPOINT / ENDPOINT, makes the resolver answer "Name
or service not known" (EAI_NONAME). Retried as transient it costs minutes of backoff on
every pod and restart, then ends with no hint; it is one line and exit 65 at once instead.
A temporary resolver failure (EAI_AGAIN: the DNS server did not answer) stays transient.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from kubetune.errors import BadInputError


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _host_in(exc: BaseException) -> str | None:
    """The host the failed request was for, where the exception says (httpx, urllib3)."""
    for link in _chain(exc):
        try:
            host = link.request.url.host  # httpx / httpx2 transport errors
        except (AttributeError, RuntimeError):
            host = getattr(getattr(link, "conn", None), "host", None)  # urllib3
        if host:
            return str(host)
    return None


def is_unknown_host(exc: BaseException) -> bool:
    return any(isinstance(link, socket.gaierror) and link.errno == socket.EAI_NONAME
               for link in _chain(exc))


def unknown_host_error(exc: BaseException, endpoint: str | None, variable: str | None,
                       default_hint: str) -> BadInputError | None:
    """A BadInputError for ``exc`` when its host name does not exist, else None.

    ``endpoint`` is the URL the request was built from and ``variable`` the environment
    variable that set it (None: our default, described by ``default_hint``).
    """
    if not is_unknown_host(exc):
        return None
    endpoint_host = urlsplit(endpoint).hostname if endpoint else None
    host = _host_in(exc) or endpoint_host or "?"
    if variable and (endpoint_host is None or host == endpoint_host):
        origin = f"from {variable}={endpoint}"
    elif endpoint_host is None or host == endpoint_host:
        origin = default_hint
    else:
        origin = f"a redirect from {endpoint}"
    return BadInputError(f"host {host} does not exist (DNS: name or service not known; "
                         f"{origin}): fix the name, or give the cluster a route to it")
