"""Signed results: Ed25519 over RFC 8785 canonical JSON, as a JWS (RFC 7515) compact token.

The scheme is llm-speed's (``spec/llm-speed-methodology.txt`` section 5):

* the *payload* is the result JSON in the JSON Canonicalization Scheme (RFC 8785, :func:`jcs`), without the
  top-level ``signature`` and ``public_key`` fields (:data:`EXCLUDED`), so a signed document can carry them;
* the token is ``BASE64URL(header) . BASE64URL(payload) . BASE64URL(signature)``; the protected header is
  ``{"alg": "EdDSA", "jwk": {"crv": "Ed25519", "kty": "OKP", "x": <32-byte raw public key>}, "typ": "JWS"}``
  (RFC 8037), itself in canonical form, so anyone can verify without contacting anyone;
* the signature is Ed25519 over the ASCII signing input ``BASE64URL(header) . BASE64URL(payload)``.

A *signed document* is the result JSON plus ``public_key`` (base64url, raw 32 bytes) and ``signature`` (the
compact token); :func:`verify_document` recomputes the canonical form of the rest and checks it is exactly
the token's payload. The key is an Ed25519 private key in PKCS#8 PEM, created on first use at
:func:`default_key_path` (``~/.config/deltatap/keys/ed25519.key``, mode 0600). The ``cryptography``
package does the cryptography.
"""

from __future__ import annotations

import base64
import json
import math
from decimal import Decimal
import os
from pathlib import Path
from typing import Any

EXCLUDED = ("signature", "public_key")
ALG = "EdDSA"

__all__ = [
    "EXCLUDED", "SignatureError", "VerifiedToken", "b64url", "default_key_path", "jcs", "load_or_create_key",
    "payload_bytes", "public_key_b64", "sign", "sign_document", "verify", "verify_document",
]


class SignatureError(Exception):
    """A token or signed document that does not verify; the message says why in one line."""


# ---- RFC 8785 --------------------------------------------------------------------------------------


def _number(x: float | int) -> str:
    """ECMAScript Number.prototype.toString of an IEEE-754 double (RFC 8785 section 3.2.2.3)."""
    if isinstance(x, bool):  # pragma: no cover - handled by the caller
        raise TypeError
    f = float(x)
    if isinstance(x, int) and abs(x) > 2**53 and float(int(f)) != x:
        raise ValueError(f"integer {x} is not exactly representable as an IEEE-754 double (RFC 8785 numbers are doubles)")
    if not math.isfinite(f):
        raise ValueError(f"{f} is not a JSON number (RFC 8785 has no NaN or Infinity)")
    if f == 0:
        return "0"
    sign = "-" if f < 0 else ""
    t = Decimal(repr(abs(f))).as_tuple()  # Python's repr is the shortest round-tripping decimal, as ECMAScript's
    digits = "".join(map(str, t.digits)).lstrip("0")  # value = int(digits) * 10^exponent
    n = len(digits) + int(t.exponent)  # value = 0.digits * 10^n
    digits = digits.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        out = digits + "0" * (n - k)
    elif 0 < n <= 21:
        out = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        out = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        out = digits[0] + ("." + digits[1:] if k > 1 else "") + "e" + ("+" if e >= 0 else "-") + str(abs(e))
    return sign + out


_ESC = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _string(s: str) -> str:
    out = ['"']
    for ch in s:
        if ch in _ESC:
            out.append(_ESC[ch])
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _utf16_key(k: str) -> list[int]:
    b = k.encode("utf-16-be")
    return [int.from_bytes(b[i : i + 2], "big") for i in range(0, len(b), 2)]


def _jcs(v: Any, out: list[str]) -> None:
    if v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif isinstance(v, (int, float)):
        out.append(_number(v))
    elif isinstance(v, str):
        out.append(_string(v))
    elif isinstance(v, (list, tuple)):
        out.append("[")
        for i, x in enumerate(v):
            if i:
                out.append(",")
            _jcs(x, out)
        out.append("]")
    elif isinstance(v, dict):
        for k in v:
            if not isinstance(k, str):
                raise ValueError(f"object key {k!r} is not a string")
        out.append("{")
        for i, k in enumerate(sorted(v, key=_utf16_key)):
            if i:
                out.append(",")
            out.append(_string(k))
            out.append(":")
            _jcs(v[k], out)
        out.append("}")
    else:
        raise ValueError(f"{type(v).__name__} is not JSON")


def jcs(value: Any) -> bytes:
    """The RFC 8785 canonical form of a JSON value, UTF-8."""
    out: list[str] = []
    _jcs(value, out)
    return "".join(out).encode("utf-8")


def payload_bytes(doc: Any) -> bytes:
    """The exact bytes that get signed for a result document: its canonical form without :data:`EXCLUDED`."""
    if isinstance(doc, dict):
        doc = {k: v for k, v in doc.items() if k not in EXCLUDED}
    return jcs(doc)


# ---- keys, tokens -----------------------------------------------------------------------------------


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64url(s: str, what: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
    except (ValueError, TypeError):
        raise SignatureError(f"{what} is not base64url") from None


def default_key_path() -> Path:
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "deltatap" / "keys" / "ed25519.key"


def load_or_create_key(path: str | Path | None = None, create: bool = True):
    """The Ed25519 private key at ``path`` (default :func:`default_key_path`); created (0600) when absent."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    p = Path(path) if path else default_key_path()
    if p.is_file():
        try:
            key = serialization.load_pem_private_key(p.read_bytes(), password=None)
        except (ValueError, TypeError) as exc:
            raise SignatureError(f"{p}: not an unencrypted PEM private key ({exc})") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise SignatureError(f"{p}: not an Ed25519 key")
        return key
    if p.exists():
        raise SignatureError(f"{p}: not a key file (a directory or a special file); name a PEM private key file")
    if not create:
        raise SignatureError(f"{p}: no such key file")
    key = Ed25519PrivateKey.generate()
    p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    return key


def public_key_b64(key) -> str:
    from cryptography.hazmat.primitives import serialization

    pub = key.public_key() if hasattr(key, "public_key") else key
    return b64url(pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


def _header(pub_b64: str) -> dict[str, Any]:
    return {"alg": ALG, "jwk": {"crv": "Ed25519", "kty": "OKP", "x": pub_b64}, "typ": "JWS"}


def sign(payload: bytes, key) -> str:
    """JWS compact token over ``payload`` (already canonical bytes) with the raw public key in the header."""
    head = b64url(jcs(_header(public_key_b64(key))))
    body = b64url(payload)
    sig = key.sign(f"{head}.{body}".encode("ascii"))
    return f"{head}.{body}.{b64url(sig)}"


class VerifiedToken:
    def __init__(self, header: dict[str, Any], payload: bytes, public_key: str) -> None:
        self.header, self.payload, self.public_key = header, payload, public_key

    def json(self) -> Any:
        return json.loads(self.payload)


def verify(token: str, public_key: str | None = None) -> VerifiedToken:
    """Check a compact token against the key in its header (and, if given, that it is ``public_key``).
    Raises :class:`SignatureError` with the reason; returns the header, payload bytes and key."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    parts = token.strip().split(".")
    if len(parts) != 3:
        raise SignatureError(f"not a JWS compact token (expected 3 dot-separated parts, found {len(parts)})")
    head_raw = _unb64url(parts[0], "the protected header")
    try:
        header = json.loads(head_raw)
    except ValueError:
        raise SignatureError("the protected header is not JSON") from None
    if not isinstance(header, dict) or header.get("alg") != ALG:
        raise SignatureError(f"unsupported algorithm {header.get('alg') if isinstance(header, dict) else None!r} (expected {ALG})")
    jwk = header.get("jwk") or {}
    x = jwk.get("x") if isinstance(jwk, dict) else None
    if not x or jwk.get("crv") != "Ed25519":
        raise SignatureError("the protected header carries no Ed25519 public key (jwk.x)")
    raw_pub = _unb64url(x, "the public key")
    if len(raw_pub) != 32:
        raise SignatureError(f"the public key is {len(raw_pub)} bytes, not 32")
    if public_key is not None and public_key.strip() != x:
        raise SignatureError(f"signed by key {x}, not by the expected key {public_key.strip()}")
    sig = _unb64url(parts[2], "the signature")
    payload = _unb64url(parts[1], "the payload")
    try:
        Ed25519PublicKey.from_public_bytes(raw_pub).verify(sig, f"{parts[0]}.{parts[1]}".encode("ascii"))
    except InvalidSignature:
        raise SignatureError("the signature does not match the header and payload (the token was changed, or signed by another key)") from None
    return VerifiedToken(header, payload, x)


def sign_document(doc: dict[str, Any], key) -> dict[str, Any]:
    """``doc`` plus ``public_key`` and ``signature`` (the token over :func:`payload_bytes` of it)."""
    token = sign(payload_bytes(doc), key)
    return {**{k: v for k, v in doc.items() if k not in EXCLUDED}, "public_key": public_key_b64(key), "signature": token}


def verify_document(doc: dict[str, Any], public_key: str | None = None) -> VerifiedToken:
    """A signed document verifies when its token verifies, the token's key is its ``public_key`` and the
    canonical form of the rest of it is exactly the signed payload."""
    if not isinstance(doc, dict) or not isinstance(doc.get("signature"), str):
        raise SignatureError("no \"signature\" field: not a signed document (sign it with `deltatap sign FILE`)")
    tok = verify(doc["signature"], public_key)
    if doc.get("public_key") not in (None, tok.public_key):
        raise SignatureError("the document's public_key is not the key in its token")
    if payload_bytes(doc) != tok.payload:
        raise SignatureError("the document differs from what was signed (its canonical form is not the token's payload)")
    return tok
