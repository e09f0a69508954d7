"""deltatap.core.fingerprint: keyed, incremental, key resolution."""

from __future__ import annotations

import hashlib
import hmac

from hypothesis import given
from hypothesis import strategies as st

from deltatap.core.fingerprint import DEFAULT_KEY, ENV_KEY, Fingerprinter, fingerprint, resolve_key


@given(st.binary(min_size=1, max_size=2000), st.lists(st.integers(0, 2000), max_size=8))
def test_incremental_equals_whole_and_matches_hmac_sha256(body, cuts):
    fp = Fingerprinter("k")
    bounds = [0, *sorted(c for c in cuts if c < len(body)), len(body)]
    for a, b in zip(bounds, bounds[1:]):
        fp.update(body[a:b])
    expected = hmac.new(b"k", body, hashlib.sha256).hexdigest()[:32]
    assert fp.result() == fingerprint(body, "k") == expected
    assert fp.size == len(body)


def test_key_matters_and_resolution_order(monkeypatch):
    body = b'{"model":"m","messages":[]}'
    monkeypatch.delenv(ENV_KEY, raising=False)
    assert resolve_key() == DEFAULT_KEY.encode()
    default = fingerprint(body)
    monkeypatch.setenv(ENV_KEY, "secret")
    assert resolve_key() == b"secret"
    assert fingerprint(body) == fingerprint(body, "secret") != default
    assert fingerprint(body, "flag") != fingerprint(body)


def test_empty_body_has_no_fingerprint():
    assert fingerprint(b"") is None
    fp = Fingerprinter()
    fp.update(b"")
    assert fp.result() is None
