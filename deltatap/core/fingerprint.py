"""Keyed fingerprints of request bodies, for joining spans across components that strip headers.

Every observer on a path (taps, load generator, reference stack) hashes the request body it saw
with the same key and puts the result on span attribute ``deltatap.body.fingerprint``
(:data:`deltatap.vocab.Attr.BODY_FINGERPRINT`). The collector then joins spans whose trace and
correlation headers were stripped by a component, by fingerprint plus a time window.

* Algorithm: HMAC-SHA256 over the exact body bytes, first 128 bits as 32 lowercase hex digits.
  A body a component rewrites (a firewall that modifies the prompt) gets a different fingerprint
  on the far side: that is intended; such hops join by time window alone or not at all.
* Key, first match wins: the ``key`` argument (the ``--fingerprint-key`` flag of a command),
  the ``DELTATAP_FINGERPRINT_KEY`` environment variable, then :data:`DEFAULT_KEY`. All observers
  of one deployment must use the same key. The default key is public, so with it a fingerprint
  only hides the prompt from someone who cannot guess the prompt; set your own key where prompts
  are sensitive.
* An empty body has no fingerprint (``None``): it would join every bodiless request.

API: ``Fingerprinter(key=None)`` with ``update(bytes)``, ``size`` and ``result() -> str | None``
(incremental: feed request-body chunks as they stream past); ``fingerprint(body, key=None)`` for a
whole body; ``resolve_key(key=None) -> bytes``.

Cost: the HMAC's key setup (two SHA-256 blocks and a Python object) is done once per key; each
``Fingerprinter`` copies that keyed state (one C call: hashlib's OpenSSL HMAC where Python has it, else
:meth:`hmac.HMAC.copy`), so a request pays for hashing its body, not for the setup. The digest is the same.
"""

from __future__ import annotations

import hashlib
import hmac
import os

__all__ = ["DEFAULT_KEY", "ENV_KEY", "Fingerprinter", "fingerprint", "resolve_key"]

ENV_KEY = "DELTATAP_FINGERPRINT_KEY"
DEFAULT_KEY = "deltatap-default-fingerprint-key"
HEX_DIGITS = 32


def resolve_key(key: str | bytes | None = None) -> bytes:
    """The key to use: argument, then ``DELTATAP_FINGERPRINT_KEY``, then :data:`DEFAULT_KEY`."""
    if key is None or key == "":
        key = os.environ.get(ENV_KEY) or DEFAULT_KEY
    return key.encode("utf-8") if isinstance(key, str) else bytes(key)


_KEYED_MAX = 64
_keyed: dict[str | bytes, object] = {}  # a key as given (or resolved, for None) -> its keyed HMAC state, never updated


def _keyed_state(key: str | bytes | None) -> object:
    """The keyed, empty HMAC-SHA256 state of ``key`` (made once per key): ``copy()`` it to hash a body."""
    if key is None or key == "" or not isinstance(key, (str, bytes)):
        key = resolve_key(key)  # (the environment is read each time: it may change)
    state = _keyed.get(key)
    if state is None:
        mac = hmac.new(resolve_key(key), digestmod=hashlib.sha256)
        inner = getattr(mac, "_hmac", None)  # hashlib's C HMAC inside hmac.HMAC: copy/update/hexdigest without a Python frame
        state = inner if inner is not None and all(hasattr(inner, m) for m in ("copy", "update", "hexdigest")) else mac
        if len(_keyed) >= _KEYED_MAX:
            _keyed.clear()
        _keyed[key] = state
    return state


class Fingerprinter:
    """Incremental keyed fingerprint of one body."""

    __slots__ = ("_mac", "size")

    def __init__(self, key: str | bytes | None = None) -> None:
        state = _keyed.get(key) if key.__class__ is bytes else None  # (the tap's key: resolved once, bytes)
        if state is None:
            state = _keyed_state(key)
        self._mac = state.copy()  # type: ignore[attr-defined]
        self.size = 0

    def update(self, chunk: bytes | bytearray | memoryview) -> None:
        if chunk:
            self._mac.update(chunk)
            self.size += len(chunk)

    def result(self) -> str | None:
        """32 hex digits, or None when no byte was fed."""
        if not self.size:
            return None
        return self._mac.hexdigest()[:HEX_DIGITS]


def fingerprint(body: bytes | bytearray | memoryview, key: str | bytes | None = None) -> str | None:
    fp = Fingerprinter(key)
    fp.update(body)
    return fp.result()
