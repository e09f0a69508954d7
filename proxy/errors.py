"""What an upstream failure becomes, without I/O: outcome, HTTP status, cause, and the error body.

Classification is a registry (exception type -> :class:`Failure` factory), most specific first.
A failure before the response head reaches the client as a 502 (504 for the tap's own timeout)
with a JSON body naming deltatap, the link and the cause; after the head it can only be passed on
as the broken stream it is (the tap closes the downstream connection the same way).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from deltatap.core.vocab import Outcome


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
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_CLASSIFIERS: list[tuple[type[BaseException], Callable[[BaseException], Failure]]] = [
    (asyncio.TimeoutError, lambda e: Failure(Outcome.TIMEOUT, 504, "upstream_timeout", "the tap's upstream timeout expired")),
    (aiohttp.ServerTimeoutError, lambda e: Failure(Outcome.TIMEOUT, 504, "upstream_timeout", "the tap's upstream timeout expired")),
    (aiohttp.ClientSSLError, lambda e: Failure(Outcome.UPSTREAM_ERROR, 502, "upstream_tls", f"TLS with the upstream failed: {_describe(e)}")),
    (ssl.SSLError, lambda e: Failure(Outcome.UPSTREAM_ERROR, 502, "upstream_tls", f"TLS with the upstream failed: {_describe(e)}")),
    (
        aiohttp.ClientConnectorError,
        lambda e: Failure(Outcome.UPSTREAM_ERROR, 502, "upstream_unreachable", f"cannot connect to the upstream: {_describe(getattr(e, 'os_error', e))}"),
    ),
    (
        aiohttp.ServerDisconnectedError,
        lambda e: Failure(Outcome.UPSTREAM_ERROR, 502, "upstream_closed", "the upstream closed the connection before the response ended"),
    ),
    (
        aiohttp.ClientPayloadError,
        lambda e: Failure(Outcome.UPSTREAM_ERROR, 502, "upstream_broken_stream", f"the upstream's response body broke off: {_describe(e)}"),
    ),
    (
        aiohttp.ClientResponseError,
        lambda e: Failure(Outcome.UPSTREAM_ERROR, 502, "upstream_bad_response", f"the upstream sent an invalid response: {_describe(e)}"),
    ),
    (ConnectionResetError, lambda e: Failure(Outcome.UPSTREAM_ERROR, 502, "upstream_reset", "the upstream reset the connection")),
    (aiohttp.ClientError, lambda e: Failure(Outcome.UPSTREAM_ERROR, 502, "upstream_error", _describe(e))),
    (OSError, lambda e: Failure(Outcome.UPSTREAM_ERROR, 502, "upstream_error", _describe(e))),
]


def classify(exc: BaseException) -> Failure:
    for typ, make in _CLASSIFIERS:
        if isinstance(exc, typ):
            return make(exc)
    return Failure(Outcome.UPSTREAM_ERROR, 502, "tap_internal_error", f"deltatap internal error: {_describe(exc)}")
