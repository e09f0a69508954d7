"""Fixtures of the observability tests (marked ``observability``; ``bash .ci/observability`` installs the parts
and runs them): where the OpenTelemetry Collector, Jaeger, Prometheus and Chromium binaries are.

Each is looked up in its environment variable (``.ci/observability`` exports them), then on PATH, then in
the cache ``.ci/observability`` builds into (``$DELTATAP_CACHE/observability/bin``, default
``~/.cache/deltatap``). A part that is not found SKIPS the test that needs it, with the reason and any
install problem ``.ci/observability`` met; it never passes silently.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest


def cache_dir() -> Path:
    return Path(os.environ.get("DELTATAP_CACHE") or Path.home() / ".cache" / "deltatap")


@dataclass(frozen=True)
class Part:
    env: str  # the environment variable that names the binary
    names: tuple[str, ...]  # executable names looked up on PATH and in the cache
    what: str  # for the skip message

    def find(self) -> Path | None:
        v = os.environ.get(self.env)
        if v:
            p = Path(v)
            return p if p.is_file() and os.access(p, os.X_OK) else None
        for n in self.names:
            w = shutil.which(n)
            if w:
                return Path(w)
        for n in self.names:
            p = cache_dir() / "observability" / "bin" / n
            if p.is_file() and os.access(p, os.X_OK):
                return p
        return None

    def require(self) -> Path:
        p = self.find()
        if p is None:
            given = os.environ.get(self.env)
            why = f"{self.env}={given} is not an executable file" if given else f"not in ${self.env}, on PATH ({', '.join(self.names)}) nor in {cache_dir() / 'observability' / 'bin'}"
            problems = os.environ.get("DELTATAP_OBSERVABILITY_INSTALL_PROBLEMS")
            pytest.skip(f"{self.what}: {why}; run `bash .ci/observability`" + (f" (install problems: {problems})" if problems else ""))
        return p


OTELCOL = Part("DELTATAP_OTELCOL", ("otelcol-deltatap",), "OpenTelemetry Collector (deploy/otelcol/builder-config.yaml)")
JAEGER = Part("DELTATAP_JAEGER", ("jaeger",), "Jaeger v2")
PROMETHEUS = Part("DELTATAP_PROMETHEUS", ("prometheus",), "Prometheus")
CHROMIUM = Part("DELTATAP_CHROMIUM", ("chromium", "chromium-headless-shell", "chromium-browser"), "Chromium")


@pytest.fixture(scope="session")
def otelcol_bin() -> Path:
    return OTELCOL.require()


@pytest.fixture(scope="session")
def jaeger_bin() -> Path:
    return JAEGER.require()


@pytest.fixture(scope="session")
def prometheus_bin() -> Path:
    return PROMETHEUS.require()


@pytest.fixture(scope="session")
def chromium_bin() -> Path:
    return CHROMIUM.require()
