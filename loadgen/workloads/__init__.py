"""The workloads, registered by name (methodology Appendix A, chatbot sessions, firewall mix, replay)."""

from deltatap.loadgen.workloads import chatbot, code, conversation, firewall, replay, synthetic  # noqa: F401  (register)
from deltatap.loadgen.workloads.base import (
    WORKLOADS,
    PlannedRequest,
    WorkloadSpec,
    load_workload,
    read_requests,
    spec_from_mapping,
    write_requests,
)

__all__ = ["WORKLOADS", "PlannedRequest", "WorkloadSpec", "load_workload", "read_requests", "spec_from_mapping", "write_requests"]
