"""The shared kernel: clocks, the vocabulary of points and attributes, topologies, strict config, SSE.

The ground floor. It imports nothing of deltatap outside ``deltatap.core`` (a test checks this), so every
floor above (network layer, telemetry, tap, load generator, collector, reference stack, application shell)
can read one definition of each concept from here.
"""
