"""NTP-style clock offset estimation between an observer (tap, load generator) and the collector.

The collector answers ``GET /v1/clock`` (on its OTLP/HTTP port) with the Unix-ns times at which it
received the request and sent the answer. The observer stamps its own send (T1) and receive (T4):

    offset = ((T2 - T1) + (T3 - T4)) / 2      observer clock minus collector clock, negated
    delay  = (T4 - T1) - (T3 - T2)             round trip spent on the wire

Samples with the lowest delay are kept (NTP's clock filter); the estimate's uncertainty is half that
round trip plus both clocks' anchor uncertainty. A span from this observer carries
``deltatap.clock.offset_ns`` (collector time = observer time - offset) and
``deltatap.clock.uncertainty_ns``; the collector shifts its points and widens error bounds by it.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from deltatap.core.clock import ANCHOR, mono_ns, now_unix_ns, to_unix_ns

CLOCK_PATH = "/v1/clock"


@dataclass(frozen=True)
class ClockEstimate:
    offset_ns: int  # observer clock minus collector clock
    uncertainty_ns: int
    rtt_ns: int
    samples: int

    def to_collector_ns(self, observer_unix_ns: int) -> int:
        return observer_unix_ns - self.offset_ns


def clock_answer(received_unix_ns: int) -> bytes:
    """The collector's answer body; ``received_unix_ns`` must be stamped when the request arrived."""
    return json.dumps({"receive_unix_ns": received_unix_ns, "transmit_unix_ns": now_unix_ns(), "anchor_uncertainty_ns": ANCHOR.uncertainty_ns}).encode()


def estimate_from_samples(samples: list[tuple[int, int, int, int, int]], keep: int = 3) -> ClockEstimate:
    """``samples``: (T1, T2, T3, T4, peer_anchor_uncertainty) tuples. Keeps the ``keep`` lowest-delay ones."""
    if not samples:
        raise ValueError("no clock samples")
    scored = []
    for t1, t2, t3, t4, peer_unc in samples:
        delay = (t4 - t1) - (t3 - t2)
        offset = ((t1 - t2) + (t4 - t3)) // 2  # observer minus collector
        scored.append((delay, offset, peer_unc))
    scored.sort(key=lambda s: s[0])
    best = scored[: max(1, keep)]
    offsets = sorted(s[1] for s in best)
    offset = offsets[len(offsets) // 2]
    min_delay = max(0, best[0][0])
    spread = max(offsets) - min(offsets)
    unc = min_delay // 2 + spread // 2 + ANCHOR.uncertainty_ns + best[0][2]
    return ClockEstimate(offset_ns=offset, uncertainty_ns=unc, rtt_ns=min_delay, samples=len(samples))


async def estimate_offset(base_url: str, samples: int = 16, timeout_s: float = 5.0) -> ClockEstimate:
    """Exchange ``samples`` requests with the collector at ``base_url`` and estimate the offset.

    Raises ``ConnectionError`` with a clear message if the collector cannot be reached.
    """
    import aiohttp

    url = base_url.rstrip("/") + CLOCK_PATH
    got: list[tuple[int, int, int, int, int]] = []
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for _ in range(samples):
                t1 = mono_ns()
                async with session.get(url) as resp:
                    body = await resp.read()
                    t4 = mono_ns()
                    if resp.status != 200:
                        raise ConnectionError(f"clock sync: {url} answered HTTP {resp.status}; is it a deltatap collector?")
                data = json.loads(body)
                got.append((to_unix_ns(t1), int(data["receive_unix_ns"]), int(data["transmit_unix_ns"]), to_unix_ns(t4), int(data.get("anchor_uncertainty_ns", 0))))
                await asyncio.sleep(0.01)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise ConnectionError(f"clock sync: cannot reach the clock endpoint {url} (a deltatap collector's or coordinator's): {exc or type(exc).__name__}") from None
    except (ValueError, KeyError) as exc:
        raise ConnectionError(f"clock sync: {url} did not answer with a clock sample ({exc})") from None
    return estimate_from_samples(got)
