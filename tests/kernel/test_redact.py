"""deltatap.core.redact: query values hashed with the fingerprint key, keys and structure kept, an allow-list."""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deltatap.core.fingerprint import DEFAULT_KEY, ENV_KEY
from deltatap.core.redact import HASH_DIGITS, REDACTED_PREFIX, hash_value, parse_keep, redact_query


def expected_hash(value: str, key: bytes) -> str:
    return "~" + hmac.new(key, value.encode(), hashlib.sha256).hexdigest()[:12]


def test_values_hashed_keys_and_order_kept(monkeypatch):
    monkeypatch.delenv(ENV_KEY, raising=False)
    got = redact_query("key=SECRET-123&stream=true&flag&empty=&key=SECRET-123&x=a=b")
    k = DEFAULT_KEY.encode()
    assert got == (f"key={expected_hash('SECRET-123', k)}&stream={expected_hash('true', k)}&flag&empty="
                   f"&key={expected_hash('SECRET-123', k)}&x={expected_hash('a=b', k)}")
    assert "SECRET" not in got
    assert REDACTED_PREFIX == "~" and HASH_DIGITS == 12


def test_allow_list_keeps_values_as_sent_and_matches_decoded_keys():
    q = "api%5Fkey=s3cr3t&stream=true&max+tokens=9&Stream=yes"
    got = redact_query(q, keep=frozenset({"stream", "max tokens", "api_key_x"}), key="k")
    assert got == f"api%5Fkey={hash_value('s3cr3t', 'k')}&stream=true&max+tokens=9&Stream={hash_value('yes', 'k')}"


def test_key_is_the_fingerprint_key(monkeypatch):
    monkeypatch.delenv(ENV_KEY, raising=False)
    default = redact_query("t=v")
    monkeypatch.setenv(ENV_KEY, "deployment-secret")
    assert redact_query("t=v") == f"t={expected_hash('v', b'deployment-secret')}" != default
    assert redact_query("t=v", key="flag") == f"t={expected_hash('v', b'flag')}"


def test_empty_and_bare_queries():
    assert redact_query("") == ""
    assert redact_query("flag") == "flag"
    assert redact_query("&&") == "&&"
    assert redact_query("=v").startswith("=~")  # a value with no key is still a value


@given(st.dictionaries(st.text(st.characters(blacklist_characters="&=", blacklist_categories=("Cs",)), min_size=1, max_size=8),
                       st.text(min_size=4, max_size=40), min_size=1, max_size=6))
def test_no_value_survives_and_keys_do(pairs):
    q = "&".join(f"{quote(k)}={quote(v)}" for k, v in pairs.items())
    got = redact_query(q, key="k")
    parts = got.split("&")
    assert [p.partition("=")[0] for p in parts] == [quote(k) for k in pairs]
    for p, v in zip(parts, pairs.values()):
        assert p.partition("=")[2] == hash_value(quote(v), "k")


def test_parse_keep():
    assert parse_keep(["stream", "a, b", "stream"]) == frozenset({"stream", "a", "b"})
    assert parse_keep(None) == frozenset()
    for bad in ("a=b", "", "x&y", "a,,b"):
        with pytest.raises(ValueError, match=r"^--query-keep: .* is not a query key"):
            parse_keep([bad])
