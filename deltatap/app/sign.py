"""``deltatap sign`` and ``deltatap verify``: signed results (deltatap.core.signing, llm-speed's scheme).

    deltatap sign RESULT.json                  # writes RESULT.signed.json (+ public_key, signature) and RESULT.jws
    deltatap sign RESULT.json --print-payload  # the exact bytes that would be signed (RFC 8785), nothing written
    deltatap verify RESULT.signed.json         # or a .jws token; exit 0 valid, 1 not valid, 2 bad input
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from deltatap.core.config import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    s = subparsers.add_parser(
        "sign",
        help="sign a result JSON (Ed25519 over RFC 8785 canonical JSON, JWS compact token)",
        description="Sign a result JSON file (a report's, compare's, selftest's or load summary's JSON): Ed25519 over its "
        "RFC 8785 canonical form without the top-level signature and public_key fields, as a JWS compact token whose "
        "protected header carries the raw public key. Writes FILE.signed.json (the result plus public_key and signature) "
        "and FILE.jws (the token). The key is created on first use (~/.config/deltatap/keys/ed25519.key, mode 0600).",
    )
    s.add_argument("file", help="the result JSON to sign")
    s.add_argument("--key", help="Ed25519 private key, PKCS#8 PEM (default ~/.config/deltatap/keys/ed25519.key, created if absent)")
    s.add_argument("--out", help="where to write the signed document (default FILE.signed.json; the token goes beside it as .jws)")
    s.add_argument("--print-payload", action="store_true", help="print the exact bytes that get signed and stop (a dry run: no key, nothing written)")
    s.set_defaults(func=run_sign)

    v = subparsers.add_parser(
        "verify",
        help="verify a signed result (FILE.signed.json or a .jws token); exit 0 valid, 1 not valid",
        description="Verify a signed result document (recomputes its canonical form and checks it is the signed payload) "
        "or a JWS compact token, against the public key its header carries (or --public-key).",
    )
    v.add_argument("file", help="a signed document (JSON with a signature field) or a .jws token file")
    v.add_argument("--public-key", help="also require this signer (base64url raw 32-byte key, as `deltatap sign` prints)")
    v.add_argument("--against", help="with a token: also check the token signs exactly this result JSON")
    v.add_argument("--print-payload", action="store_true", help="print the signed payload bytes after verifying")
    v.set_defaults(func=run_verify)


def _need_file(path: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{path}: {'a directory, not a file' if p.is_dir() else 'file not found'}")
    return p


def _read_json(path: str) -> Any:
    p = _need_file(path)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not JSON ({exc})") from None


def _payload(doc: Any, path: str) -> bytes:
    from deltatap.core.signing import payload_bytes

    try:
        return payload_bytes(doc)
    except ValueError as exc:
        raise ConfigError(f"{path}: cannot be canonicalised (RFC 8785): {exc}") from None


def run_sign(args: argparse.Namespace) -> int:
    from deltatap.core.signing import SignatureError, load_or_create_key, public_key_b64, sign

    doc = _read_json(args.file)
    if not isinstance(doc, dict):
        raise ConfigError(f"{args.file}: a result is a JSON object; this file holds a {type(doc).__name__}")
    payload = _payload(doc, args.file)
    if args.print_payload:
        sys.stdout.buffer.write(payload + b"\n")
        return 0
    try:
        key = load_or_create_key(args.key)
    except SignatureError as exc:
        raise ConfigError(f"--key: {exc}") from None
    token = sign(payload, key)
    src = Path(args.file)
    out = Path(args.out) if args.out else src.with_name(src.name.removesuffix(".json") + ".signed.json")
    signed = {**{k: v for k, v in doc.items() if k not in ("signature", "public_key")}, "public_key": public_key_b64(key), "signature": token}
    out.write_text(json.dumps(signed, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    jws = out.with_name(out.name.removesuffix(".json").removesuffix(".signed") + ".jws")
    jws.write_text(token + "\n", encoding="ascii")
    print(f"signed {len(payload)} canonical bytes with key {public_key_b64(key)}")
    print(f"wrote {out} and {jws}")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from deltatap.core.signing import SignatureError, verify, verify_document

    p = _need_file(args.file)
    try:
        text = p.read_text(encoding="utf-8").strip()
    except UnicodeDecodeError:
        print(f"NOT VALID: {args.file}: not UTF-8 text", file=sys.stderr)
        return 1
    try:
        if text.startswith("{"):
            try:
                doc = json.loads(text)
            except ValueError as exc:
                raise SignatureError(f"not JSON ({exc})") from None
            tok = verify_document(doc, args.public_key)
        else:
            tok = verify(text, args.public_key)
            if args.against and _payload(_read_json(args.against), args.against) != tok.payload:
                raise SignatureError(f"{args.against} differs from what was signed (its canonical form is not the token's payload)")
    except SignatureError as exc:
        print(f"NOT VALID: {args.file}: {exc}", file=sys.stderr)
        return 1
    if args.print_payload:
        sys.stdout.buffer.write(tok.payload + b"\n")
    else:
        print(f"valid: {args.file}: {len(tok.payload)} canonical bytes signed by {tok.public_key}")
    return 0
