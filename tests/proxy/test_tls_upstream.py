"""A tap in front of an HTTPS upstream: the certificate is verified (502 naming TLS when it is not trusted),
``--insecure`` skips that, and a stream through TLS is stamped with bounded process stamps (no kernel stamps
for TLS records)."""

from __future__ import annotations

import ssl

import aiohttp
import pytest
from tap_helpers import event_times, start_upstream, wait_spans

from deltatap.core.vocab import Attr, TapEvent, parse_stamp_bounds

pytestmark = pytest.mark.timeout(60)
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest.fixture
async def tls_upstream(self_signed):
    cert, key = self_signed
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    up = await start_upstream(ctx, host="localhost")
    yield up
    await up.runner.cleanup()


async def test_untrusted_certificate_gives_502_naming_tls(tls_upstream, make_tap, span_exporter, telemetry):
    tap = await make_tap(tls_upstream.url, link="edge")
    async with aiohttp.ClientSession() as s, s.post(tap.url + "/v1/chat/completions?first_ms=1&n=2", json=CHAT) as r:
        assert r.status == 502
        err = (await r.json())["error"]
    assert err["type"] == "upstream_tls" and "certificate verify failed" in err["cause"]
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    assert span.attributes[Attr.ERROR_TYPE] == "upstream_tls"
    assert tls_upstream.log.methods == []


@pytest.mark.parametrize("trust", ["ca_file", "insecure"])
async def test_stream_through_tls_is_relayed_and_stamped_with_bounds(tls_upstream, make_tap, span_exporter, telemetry, self_signed,
                                                                     monkeypatch, trust):
    if trust == "ca_file":
        monkeypatch.setenv("SSL_CERT_FILE", str(self_signed[0]))  # the system trust store, as a user would point it
        tap = await make_tap(tls_upstream.url, link="edge")
    else:
        tap = await make_tap(tls_upstream.url, link="edge", verify_tls=False)
    async with aiohttp.ClientSession() as s, s.post(tap.url + "/v1/chat/completions?first_ms=5&gap_ms=5&n=4", json=CHAT) as r:
        assert r.status == 200
        body = await r.read()
    assert body.endswith(b"data: [DONE]\n\n") and body.count(b'"content"') >= 4
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    assert span.attributes[Attr.OUTCOME] == "ok"
    times = event_times(span)
    assert times[TapEvent.REQUEST_FORWARDED] <= times[TapEvent.FIRST_TOKEN_RECEIVED] <= times[TapEvent.FIRST_TOKEN_FORWARDED]
    bounds = parse_stamp_bounds(span.attributes.get(Attr.STAMP_BOUNDS, ""))
    # upstream reads over TLS are process stamps: each reaches back to the previous read, stated as an interval
    assert TapEvent.FIRST_TOKEN_RECEIVED in bounds and bounds[TapEvent.FIRST_TOKEN_RECEIVED][0] > 0
