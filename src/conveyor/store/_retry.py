"""Which failures of an object store a retry may mend, and the retry loop.

A request to a store fails in one of two ways. Either it got no complete
answer (a connection refused or dropped, a timeout, a body cut short):
always worth another try, as is an answer that seemed whole but is not
the object (``_whole.WrongBytes``, an ``OSError``: fewer or more bytes than
its size, or another MD5). Or the store answered with an error: worth
another try only when the store says it failed or is busy (HTTP 5xx, 429,
408, or a throttling code), never for a missing object or a refused
permission (404, 403), which no retry mends.

The HTTP stacks under fsspec report a dropped connection with classes of
their own, most of them not ``OSError`` (botocore's
``EndpointConnectionError``, aiohttp's ``ServerDisconnectedError``...).
They are recognized by module and class name along the exception's MRO, so
that conveyor imports none of those packages.
"""

from __future__ import annotations

import errno
import random
import time
from typing import Any, Callable, Optional

#: Errors a retry will not mend.
_FINAL = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)

#: Local conditions that outlast any backoff: a full disk, a quota, a read-only file system.
_FINAL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})

#: Base classes, as (module, name), of the errors with which the HTTP stacks under fsspec say that a
#: request got no complete answer; each covers its subclasses. botocore's ConnectionError covers
#: EndpointConnectionError, ConnectTimeoutError and ProxyConnectionError; its HTTPClientError covers
#: ConnectionClosedError, ReadTimeoutError and ResponseStreamingError; aiohttp's ClientConnectionError
#: covers ServerDisconnectedError, ClientConnectorError and ServerTimeoutError.
_NO_ANSWER = frozenset(
    {
        ("botocore.exceptions", "ConnectionError"),
        ("botocore.exceptions", "HTTPClientError"),
        ("botocore.exceptions", "IncompleteReadError"),
        ("aiohttp.client_exceptions", "ClientConnectionError"),
        ("aiohttp.client_exceptions", "ClientPayloadError"),
        ("urllib3.exceptions", "ProtocolError"),
        ("urllib3.exceptions", "TimeoutError"),
        ("http.client", "IncompleteRead"),
        ("fsspec.exceptions", "FSTimeoutError"),
    }
)

#: Connection errors whose cause outlasts any backoff: a certificate that does not verify.
_NO_ANSWER_FINAL = frozenset(
    {("aiohttp.client_exceptions", "ClientConnectorCertificateError"), ("ssl", "SSLCertVerificationError")}
)

#: Error codes with which stores ask to be asked again later (S3 and the services that copy its API).
_BUSY_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "RequestTimeout",
        "InternalError",
        "ServiceUnavailable",
    }
)

#: The longest pause between two attempts, whatever ``backoff_s`` and the count of failures.
_MAX_PAUSE_S = 30.0


def worth_retrying(error: BaseException) -> bool:
    """A dropped or refused connection, a timeout, a body cut short, a store
    that failed or is busy (5xx, 429, a throttling code): yes. A missing
    object, a refused permission (404, 403), another answer of the store,
    a full disk, a bug: no.

    >>> worth_retrying(ConnectionResetError()), worth_retrying(FileNotFoundError())
    (True, False)
    """
    if isinstance(error, _FINAL) or _is_any(error, _NO_ANSWER_FINAL):
        return False
    if isinstance(error, OSError) and error.errno in _FINAL_ERRNOS:
        return False
    # (s3fs raises the store's answer as an OSError ``from`` botocore's ClientError, which carries it)
    for carrier in (error, error.__cause__):
        answer = _answer(carrier) if carrier is not None else None
        if answer is not None:
            return _busy(*answer)
    if _is_any(error, _NO_ANSWER) or isinstance(error, (ConnectionError, TimeoutError)):
        return True
    return isinstance(error, OSError)


def _is_any(error: BaseException, names: frozenset) -> bool:
    return any((cls.__module__, cls.__name__) in names for cls in type(error).__mro__)


def _answer(error: BaseException) -> Optional[tuple[Optional[int], Optional[str]]]:
    """The store's answer that ``error`` carries, as (HTTP status, error code); None if it carries none."""
    response = getattr(error, "response", None)
    if isinstance(response, dict):  # botocore's ClientError
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = response.get("Error", {}).get("Code")
        if status is None and isinstance(code, str) and code.isdigit():
            status = int(code)
        return status, code
    status = getattr(error, "status", None)  # aiohttp's ClientResponseError
    if isinstance(status, int):
        return status, None
    status = getattr(response, "status_code", None)  # requests' HTTPError
    return (status, None) if isinstance(status, int) else None


def _busy(status: Optional[int], code: Optional[str]) -> bool:
    """Whether the store's answer asks to be asked again: it failed or is busy (and neither 403 nor 404)."""
    if status in (403, 404):
        return False
    return code in _BUSY_CODES or (status is not None and (status >= 500 or status in (408, 429)))


def retry(
    what: str,
    action: Callable[[], Any],
    *,
    retries: int,
    backoff_s: float,
    progress: Optional[Callable[[], Any]] = None,
) -> Any:
    """``action()``, called again after a pause while it fails in a way
    worth retrying, at most ``retries`` failures in a row; after the n-th,
    the pause is ``backoff_s`` × 2ⁿ⁻¹ (at most ``_MAX_PAUSE_S``), ± half so
    that workers do not retry in step. ``progress()``, when given, tells how
    far the work got (a download's byte count): a failure after progress
    starts the count again. The last error is raised with a note of the
    attempts made."""
    attempts = in_a_row = 0
    mark = progress() if progress is not None else None
    while True:
        attempts += 1
        try:
            return action()
        except Exception as error:
            if progress is not None and progress() != mark:
                mark, in_a_row = progress(), 0
            in_a_row += 1
            if in_a_row > retries or not worth_retrying(error):
                if attempts > 1 and hasattr(error, "add_note"):
                    error.add_note(f"(conveyor: {what} failed {attempts} times; the last error is above)")
                raise
        time.sleep(min(_MAX_PAUSE_S, backoff_s * 2 ** (in_a_row - 1)) * random.uniform(0.5, 1.5))
