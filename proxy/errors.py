"""What an upstream failure becomes, without I/O: outcome, HTTP status, cause, and the error body.

Classification is a registry (exception type -> :class:`Failure` factory), most specific first.
A failure before the response head reaches the client as a 502 (504 for the tap's own timeout)
with a JSON body naming deltatap, the link and the cause; after the head it can only be passed on
as the broken stream it is (the tap closes the downstream connection the same way).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from deltatap.core.vocab import Outcome

log = logging.getLogger("deltatap.tap")


@dataclass(frozen=True)
class Failure:
    outcome: Outcome
    status: int  # sent when the response head was not forwarded yet
    error_type: str  # short machine-readable cause (span error.type, metrics label)
    cause: str  # human-readable cause, never containing request or response content

    def body(self, link: str, upstream: str) -> bytes:
        doc = {
            "error": {
                "message": f"deltatap tap on link {link!r}: {self.cause} (upstream {upstream})",
                "type": self.error_type,
                "source": "deltatap",
                "link": link,
                "upstream": upstream,
                "cause": self.cause,
            }
        }
        return json.dumps(doc).encode()


def _describe(exc: BaseException) -> str:
    """The exception's type and only text that cannot hold bytes from the wire: an OSError's errno and strerror,
    an SSL error's OpenSSL message. Other messages may quote their input (``int(b'token=…')``, a
    UnicodeDecodeError, a parser's "bad line b'Set-Cookie: …'"), so they stay in the tap's debug log, out of the
    span (``deltatap.error.cause``) and the 502 body."""
    name = type(exc).__name__
    if isinstance(exc, (ssl.SSLError, ssl.CertificateError)):
        text = str(exc).strip()
    elif isinstance(exc, OSError) and exc.errno is not None:
        text = f"[Errno {exc.errno}] {exc.strerror or os.strerror(exc.errno)}"
    else:
        if str(exc).strip():
            log.debug("%s (its message is kept out of the span)", name, exc_info=exc)
        return name
    return f"{name}: {text}" if text else name


_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def resource_exhausted(exc: OSError) -> Failure:
    """The tap itself ran out of file descriptors or buffers: its own failure, not the upstream's."""
    what = {errno.EMFILE: "its file descriptors (EMFILE: raise `ulimit -n` for the tap)",
            errno.ENFILE: "the system's file descriptors (ENFILE)"}.get(exc.errno or 0, f"buffers ({errno.errorcode.get(exc.errno or 0, exc.errno)})")
    return Failure(Outcome.UPSTREAM_ERROR, 503, "tap_resource_exhausted", f"the tap ran out of {what}")


def connect_failure(exc: BaseException) -> Failure:
    """A connection to the upstream that could not be opened (refused, unreachable, name not found, no answer
    within the connect timeout, TLS handshake failed)."""
    if isinstance(exc, OSError) and exc.errno in _RESOURCE_ERRNOS:
        return resource_exhausted(exc)
    if isinstance(exc, ssl.SSLError) or isinstance(exc, ssl.CertificateError):
        return Failure(Outcome.UPSTREAM_ERROR, 502, "upstream_tls", f"TLS with the upstream failed: {_describe(exc)}")
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        why = "no answer to the TCP connect"
    elif isinstance(exc, socket.gaierror):
        why = f"host name not found ({exc.strerror or exc})"
    elif isinstance(exc, OSError) and exc.errno:
        why = os.strerror(exc.errno).lower()
    else:
        why = _describe(exc)
    return Failure(Outcome.UPSTREAM_ERROR, 502, "upstream_unreachable", f"cannot connect to the upstream: {why}")


TAP_TIMEOUT = Failure(Outcome.TIMEOUT, 504, "upstream_timeout", "the tap's upstream timeout expired")

_CLASSIFIERS: list[tuple[type[BaseException], Callable[[BaseException], Failure]]] = [
    (asyncio.TimeoutError, lambda e: TAP_TIMEOUT),
    (ssl.SSLError, lambda e: Failure(Outcome.UPSTREAM_ERROR, 502, "upstream_tls", f"TLS with the upstream failed: {_describe(e)}")),
    (ConnectionResetError, lambda e: Failure(Outcome.UPSTREAM_ERROR, 502, "upstream_reset", "the upstream reset the connection")),
    (OSError, lambda e: Failure(Outcome.UPSTREAM_ERROR, 502, "upstream_error", _describe(e))),
]


def classify(exc: BaseException) -> Failure:
    for typ, make in _CLASSIFIERS:
        if isinstance(exc, typ):
            return make(exc)
    return Failure(Outcome.UPSTREAM_ERROR, 502, "tap_internal_error", f"deltatap internal error: {_describe(exc)}")
