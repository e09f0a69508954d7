"""Fixtures of the observability tests (marked ``observability``; ``bash .ci/observability`` installs the parts
and runs them): the paths of the OpenTelemetry Collector, Jaeger, Prometheus and Chromium binaries, found by
:mod:`obs_support` (environment variable, PATH, then ``.ci/observability``'s cache) or the test is skipped
with the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from obs_support import CHROMIUM, JAEGER, OTELCOL, PROMETHEUS


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
