"""Redaction of query strings before they go into a span (``url.query``).

Query strings (span attribute ``url.query``) often carry credentials (``?key=…``, ``?token=…``, signed-URL
signatures). :func:`redact_query` keeps the structure and every key as sent, and replaces each value by a short
keyed hash: ``key=SECRET&stream=true`` becomes ``key=~1f0c6a1d2e9b&stream=~4b2a…``. Equal values hash equal (with
the same key), so spans still show that two requests carried the same value without showing the value.

* Hash: HMAC-SHA256 over the value's bytes as sent (not percent-decoded), first :data:`HASH_DIGITS` lowercase
  hex digits, after :data:`REDACTED_PREFIX`. The key is the body fingerprint's
  (:func:`deltatap.core.fingerprint.resolve_key`: ``--fingerprint-key``, ``$DELTATAP_FINGERPRINT_KEY``, then the
  public default). With the public default key a short or guessable value can be found by trying candidates; set
  a key of your own where that matters.
* Allow-list: values of the keys named in ``keep`` (compared with the key percent-decoded, case-sensitive) are
  kept as sent (``deltatap tap --query-keep stream``).
* Pieces are split on ``&`` only and keep their order; a piece without ``=`` is a key with no value (kept, as
  URLSearchParams reads it); an empty value stays empty.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Collection
from urllib.parse import unquote_plus

from deltatap.core.fingerprint import resolve_key

__all__ = ["HASH_DIGITS", "REDACTED_PREFIX", "hash_value", "redact_query", "parse_keep"]

HASH_DIGITS = 12
REDACTED_PREFIX = "~"


def hash_value(value: str | bytes, key: str | bytes | None = None) -> str:
    """``~`` + the first :data:`HASH_DIGITS` hex digits of HMAC-SHA256(key, value)."""
    data = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)
    return REDACTED_PREFIX + hmac.new(resolve_key(key), data, hashlib.sha256).hexdigest()[:HASH_DIGITS]


def redact_query(query: str, keep: Collection[str] = (), key: str | bytes | None = None) -> str:
    """``query`` (without ``?``) with every value hashed except those of the keys in ``keep``."""
    if not query:
        return query
    mac_key = resolve_key(key)
    out = []
    for piece in query.split("&"):
        name, eq, value = piece.partition("=")
        if not eq or not value or (keep and unquote_plus(name) in keep):
            out.append(piece)
        else:
            out.append(f"{name}={hash_value(value, mac_key)}")
    return "&".join(out)


def parse_keep(values: Collection[str] | None, what: str = "--query-keep") -> frozenset[str]:
    """The allow-list from repeated flags or a config list; each entry may hold several keys separated by commas.
    Raises ValueError naming ``what`` for an empty key or one with ``=`` or ``&``."""
    keys: set[str] = set()
    for raw in values or ():
        for k in str(raw).split(","):
            k = k.strip()
            if not k or "=" in k or "&" in k:
                raise ValueError(f"{what}: {raw!r} is not a query key (expected a name such as stream, or a,b)")
            keys.add(k)
    return frozenset(keys)

