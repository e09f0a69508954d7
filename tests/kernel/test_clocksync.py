from aiohttp import web

from deltatap.core.clock import now_unix_ns
from deltatap.core.clocksync import CLOCK_PATH, clock_answer, estimate_from_samples, estimate_offset


def test_offset_from_symmetric_samples():
    # observer is 5 ms ahead of the collector, 200 us each way
    D, d = 5_000_000, 200_000
    samples = []
    for k in range(5):
        t1 = 10**18 + k * 10**7 + D
        t2 = t1 - D + d
        t3 = t2 + 50_000
        t4 = t3 + D + d + k * 1000  # later samples a bit slower
        samples.append((t1, t2, t3, t4, 0))
    est = estimate_from_samples(samples)
    assert abs(est.offset_ns - D) <= 1000
    assert est.rtt_ns == 2 * d
    assert est.uncertainty_ns >= d
    assert est.to_collector_ns(1_000 + D) == 1_000 + (D - est.offset_ns)


async def test_offset_against_a_live_answerer(aiohttp_unused_port=None):
    async def handler(request):
        return web.Response(body=clock_answer(now_unix_ns()), content_type="application/json")

    app = web.Application()
    app.router.add_get(CLOCK_PATH, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        est = await estimate_offset(f"http://127.0.0.1:{port}", samples=8)
        # same process, same clock: offset is zero within the uncertainty
        assert abs(est.offset_ns) <= est.uncertainty_ns + 100_000
    finally:
        await runner.cleanup()


async def test_unreachable_collector_is_a_clear_error():
    import pytest

    with pytest.raises(ConnectionError, match="cannot reach the clock endpoint"):
        await estimate_offset("http://127.0.0.1:9", samples=2, timeout_s=1)
