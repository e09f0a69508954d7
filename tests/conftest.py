"""Fixtures shared by every test package: free loopback ports and in-memory span capture."""

from __future__ import annotations

import socket

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from deltatap.telemetry.tracer import Telemetry, setup_telemetry


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def span_exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def telemetry(span_exporter: InMemorySpanExporter):
    """A private tracer provider exporting into ``span_exporter`` (call ``telemetry.processor.force_flush()``)."""
    tel: Telemetry = setup_telemetry("deltatap-test", exporter=span_exporter)
    yield tel
    tel.shutdown()
