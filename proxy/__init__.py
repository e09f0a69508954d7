"""The tap: a transparent HTTP/SSE reverse proxy that stamps the timeline into OpenTelemetry spans.

In-process interface (the reference stack, the collector's tests, ``deltatap demo`` and the
integration tests start taps this way)::

    from deltatap.telemetry.tracer import setup_telemetry
    from deltatap.proxy import TapOptions, start_tap, options_from_topology

    telemetry = setup_telemetry("deltatap-tap-edge", otlp="grpc://127.0.0.1:4317")
    tap = await start_tap(TapOptions(link="edge", upstream="http://127.0.0.1:8100"), telemetry)
    tap.url          # "http://127.0.0.1:<port>"  (listen_port=0 picks a free port)
    tap.port
    tap.admin_url    # "http://127.0.0.1:<port>" serving /metrics and /healthz (None if admin_port=None)
    ...
    await tap.close(grace_s=5)   # stop accepting, let streams finish up to grace_s, flush spans
    telemetry.shutdown()         # the caller owns the telemetry it passed in

:class:`TapOptions` fields: ``link``, ``upstream`` (URL, optional path prefix), ``listen_host``,
``listen_port``, ``admin_host``, ``admin_port`` (None: no admin server), ``downstream`` /
``upstream_name`` and their ``*_kind`` (defaults from the default topology's link of that name),
``host_header``, ``timeout_s`` (None: the tap never times out), ``verify_tls``,
``correlation_header``, ``clock_sync`` (collector base URL for ``GET /v1/clock``),
``fingerprint_key``, ``grace_s``, ``max_capture_bytes``, ``labels``.
:func:`options_from_topology` builds them from a :class:`deltatap.topology.Topology` link.

Several taps may share one process and one :class:`deltatap.telemetry.Telemetry`; each tap has
its own Prometheus registry (``running.tap.metrics.registry``).
"""

from deltatap.proxy.options import TapOptions, options_from_topology
from deltatap.proxy.server import RunningTap, Tap, start_tap

__all__ = ["RunningTap", "Tap", "TapOptions", "options_from_topology", "start_tap"]
