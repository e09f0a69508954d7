"""Configured delays: a fixed part plus a seeded random part, drawn from a named distribution.

``DelaySpec(fixed_ms=3, jitter_ms=0.5)`` reads "3 ms ± 0.5": with the default ``uniform``
distribution each draw is ``3 + U(-0.5, 0.5)`` ms. Draws never go below zero. Every component owns
one :class:`DelaySampler` seeded from its config, so a run is reproducible.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from pydantic import Field, model_validator

from deltatap.net.aio import sleep_until
from deltatap.core.clock import mono_ns
from deltatap.core.config import StrictModel

# name -> (rng, jitter_ms) -> random part in ms. Registry, not an if-chain.
DISTRIBUTIONS: dict[str, Callable[[random.Random, float], float]] = {
    "uniform": lambda rng, j: rng.uniform(-j, j),
    "normal": lambda rng, j: rng.gauss(0.0, j),
    "exponential": lambda rng, j: rng.expovariate(1.0 / j) if j > 0 else 0.0,
}


class DelaySpec(StrictModel):
    """A delay of ``fixed_ms`` plus a random part: ``uniform`` ±jitter, ``normal`` with sigma=jitter,
    or ``exponential`` with mean=jitter. A bare number in YAML means ``fixed_ms``."""

    fixed_ms: float = Field(default=0.0, ge=0)
    jitter_ms: float = Field(default=0.0, ge=0)
    distribution: str = "uniform"

    @model_validator(mode="before")
    @classmethod
    def _number_is_fixed(cls, data):
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return {"fixed_ms": data}
        return data

    @model_validator(mode="after")
    def _known_distribution(self) -> DelaySpec:
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution {self.distribution!r} unknown; use one of {sorted(DISTRIBUTIONS)}")
        return self

    @property
    def is_zero(self) -> bool:
        return self.fixed_ms == 0 and self.jitter_ms == 0


ZERO = DelaySpec()


class DelaySampler:
    """Seeded draws for every delay of one component."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def draw_ms(self, spec: DelaySpec) -> float:
        if spec.is_zero:
            return 0.0
        extra = DISTRIBUTIONS[spec.distribution](self.rng, spec.jitter_ms) if spec.jitter_ms else 0.0
        return max(0.0, spec.fixed_ms + extra)

    async def sleep(self, spec: DelaySpec) -> float:
        """Sleep one draw of ``spec`` (no await at all when it is zero); returns the drawn ms."""
        ms = self.draw_ms(spec)
        await self.sleep_ms(ms)
        return ms

    @staticmethod
    async def sleep_ms(ms: float) -> None:
        """Wait ``ms`` to within a loop iteration (a timer alone is off by up to a millisecond,
        which would make a configured cost untrue)."""
        if ms > 0:
            await sleep_until(mono_ns() + int(ms * 1_000_000))
