"""Gateway admission: API-key authentication and token-bucket rate limits."""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from deltatap.core.clock import mono_ns

from deltatap.stack.config import Auth, RateLimit


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The API key of a request: ``Authorization: Bearer K`` or ``x-api-key: K``."""
    auth = headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return headers.get("x-api-key")


class Authenticator:
    def __init__(self, cfg: Auth) -> None:
        self.enabled = cfg.enabled
        self._keys = [k.encode() for k in cfg.api_keys]

    def check(self, key: str | None) -> bool:
        if not self.enabled:
            return True
        if not key:
            return False
        k = key.encode()
        return any(hmac.compare_digest(k, good) for good in self._keys)


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` banked; one request takes one token."""

    __slots__ = ("rate", "burst", "tokens", "stamp")

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, float(burst)
        self.tokens = float(burst)
        self.stamp = mono_ns()

    def take(self, now: int) -> float:
        """0 if admitted, else seconds until a token is available (for Retry-After)."""
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) / 1e9 * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


class RateLimiter:
    MAX_BUCKETS = 100_000

    def __init__(self, cfg: RateLimit) -> None:
        self.cfg = cfg
        self._buckets: dict[str, TokenBucket] = {}

    def check(self, key: str | None) -> float:
        """0 if the request may pass, else seconds to wait."""
        if not self.cfg.enabled:
            return 0.0
        name = (key or "") if self.cfg.per == "key" else ""
        bucket = self._buckets.get(name)
        if bucket is None:
            if len(self._buckets) >= self.MAX_BUCKETS:
                self._buckets.clear()  # bounded memory; buckets refill to burst anyway
            bucket = self._buckets[name] = TokenBucket(self.cfg.requests_per_s, self.cfg.burst)
        return bucket.take(mono_ns())
