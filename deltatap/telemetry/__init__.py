"""OpenTelemetry for every process: tracer set-up and bounded export (``tracer``), deltatap's own OTLP encoder
(``otlp_encode``) and exporters (``otlp_export``).

Imports only :mod:`deltatap.core`.
"""
