"""The load generator: arrivals, workloads, SSE client, client spans (t0, t12)."""
