"""The network layer: socket-level stamps (``wire``), kernel receive stamps (``kstamp``), the event loop (``aio``).

Imports only :mod:`deltatap.core`.
"""
