"""Length distributions (methodology 4.3.1: fixed, uniform, log-normal, choice), in reference tokens."""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator

from deltatap.core.config import StrictModel

MAX_TOKENS = 2_000_000  # the longest prompt or answer a workload may plan, in reference tokens (a 2M-token context)
Tokens = Annotated[int, Field(gt=0, le=MAX_TOKENS)]


class Fixed(StrictModel):
    dist: Literal["fixed"] = "fixed"
    value: Tokens

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)


class Uniform(StrictModel):
    """Integers uniform on [min, max], both inclusive (Appendix A.1.4's randint)."""

    dist: Literal["uniform"] = "uniform"
    min: Tokens
    max: Tokens

    @model_validator(mode="after")
    def _order(self) -> Uniform:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) < min ({self.min})")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.min, self.max + 1, size=n, dtype=np.int64)


class LogNormal(StrictModel):
    """exp(N(mu, sigma)) rounded, then floored at min and capped at max (Appendix A.2)."""

    dist: Literal["lognormal"] = "lognormal"
    mu: float = Field(allow_inf_nan=False)
    sigma: float = Field(gt=0, allow_inf_nan=False)
    min: Tokens = 1
    max: Tokens

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = np.rint(rng.lognormal(self.mu, self.sigma, size=n))
        return np.clip(x, self.min, self.max).astype(np.int64)


class Choice(StrictModel):
    """One of the values, uniformly (Appendix A.5's target lengths)."""

    dist: Literal["choice"] = "choice"
    values: list[Tokens] = Field(min_length=1)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.asarray(self.values, dtype=np.int64)[rng.integers(0, len(self.values), size=n)]


Length = Annotated[Fixed | Uniform | LogNormal | Choice, Field(discriminator="dist")]
