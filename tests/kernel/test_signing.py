"""Signed results (deltatap.core.signing, deltatap sign / verify): RFC 8785 bytes, Ed25519 JWS, tampering fails."""

from __future__ import annotations

import base64
import json
import struct

import pytest

from deltatap.app.cli import main
from deltatap.core.signing import SignatureError, jcs, load_or_create_key, payload_bytes, sign, sign_document, verify, verify_document


def _double(bits: int) -> float:
    return struct.unpack(">d", bits.to_bytes(8, "big"))[0]


@pytest.mark.parametrize(("bits", "text"), [
    (0x0000000000000000, "0"), (0x8000000000000000, "0"), (0x0000000000000001, "5e-324"), (0x8000000000000001, "-5e-324"),
    (0x7FEFFFFFFFFFFFFF, "1.7976931348623157e+308"), (0x4340000000000000, "9007199254740992"),
    (0x4430000000000000, "295147905179352830000"), (0x44B52D02C7E14AF6, "1e+23"), (0x444B1AE4D6E2EF50, "1e+21"),
    (0x3EB0C6F7A0B5ED8D, "0.000001"), (0x41B3DE4355555553, "333333333.3333332"), (0x4037000000000000, "23"),
])
def test_numbers_serialise_as_rfc8785_appendix_b(bits, text):
    assert jcs(_double(bits)) == text.encode()


def test_rfc8785_section_3_2_3_example():
    doc = {"numbers": [333333333.33333329, 1e30, 4.50, 2e-3, 0.000000000000000000000000001],
           "string": "\u20ac$\u000f\u000aA'\u0042\u0022\u005c\\\"/", "literals": [None, True, False]}
    want = '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    assert jcs(doc).decode() == want


def test_keys_sort_by_utf16_code_units_and_nan_is_refused():
    assert jcs({"\U0001f600": 1, "\ufb33": 2, "a": 3}) == '{"a":3,"\U0001f600":1,"\ufb33":2}'.encode()
    with pytest.raises(ValueError):
        jcs({"x": float("nan")})


def test_token_verifies_and_any_one_byte_change_fails(tmp_path):
    key = load_or_create_key(tmp_path / "k.pem")
    assert (tmp_path / "k.pem").stat().st_mode & 0o777 == 0o600
    payload = payload_bytes({"ttft_ms": 142.3, "suite_version": "suite-v1", "signature": "ignored"})
    token = sign(payload, key)
    head = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
    assert head["alg"] == "EdDSA" and len(base64.urlsafe_b64decode(head["jwk"]["x"] + "=")) == 32
    assert verify(token).payload == payload == b'{"suite_version":"suite-v1","ttft_ms":142.3}'
    body = bytearray(payload)
    body[12] ^= 0x01  # one byte of the payload
    b64 = base64.urlsafe_b64encode(bytes(body)).rstrip(b"=").decode()
    h, _, s = token.split(".")
    with pytest.raises(SignatureError, match="does not match"):
        verify(f"{h}.{b64}.{s}")
    other = load_or_create_key(tmp_path / "other.pem")
    with pytest.raises(SignatureError, match="not by the expected key"):
        verify(token, public_key=verify(sign(payload, other)).public_key)


def test_signed_document_fails_after_a_one_byte_edit(tmp_path):
    key = load_or_create_key(tmp_path / "k.pem")
    doc = sign_document({"deltas": {"firewall_inbound": {"p50_ms": 3.02}}, "seed": 7}, key)
    assert verify_document(doc).json() == {"deltas": {"firewall_inbound": {"p50_ms": 3.02}}, "seed": 7}
    text = json.dumps(doc)
    edited = json.loads(text.replace("3.02", "3.03"))
    with pytest.raises(SignatureError, match="differs from what was signed"):
        verify_document(edited)


def test_cli_sign_verify_print_payload_and_tamper(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    res = tmp_path / "result.json"
    res.write_text(json.dumps({"b": 1.50, "a": ["é", None]}))
    assert main(["sign", str(res), "--print-payload"]) == 0
    assert capsys.readouterr().out == '{"a":["é",null],"b":1.5}\n'
    assert not (tmp_path / "cfg").exists()  # a dry run: no key made
    assert main(["sign", str(res)]) == 0
    assert (tmp_path / "cfg" / "deltatap" / "keys" / "ed25519.key").is_file()
    signed, jws = tmp_path / "result.signed.json", tmp_path / "result.jws"
    capsys.readouterr()
    assert main(["verify", str(signed)]) == 0 and main(["verify", str(jws), "--against", str(res)]) == 0
    raw = bytearray(signed.read_bytes())
    raw[raw.index(b"1.5") + 2] = ord("6")  # one byte: 1.5 -> 1.6
    signed.write_bytes(bytes(raw))
    assert main(["verify", str(signed)]) == 1
    assert "NOT VALID" in capsys.readouterr().err
    res.write_text(json.dumps({"b": 1.5, "a": ["e", None]}))
    assert main(["verify", str(jws), "--against", str(res)]) == 1
    assert main(["verify", str(tmp_path / "missing.jws")]) == 2
    assert "file not found" in capsys.readouterr().err
