"""The packaged configs (installed as ``deltatap.configs``): topologies, the demo, workloads, examples.

Found by name or by path through :func:`deltatap.core.config.find_config`.
"""
