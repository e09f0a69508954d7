"""Imports every built-in section module so they register, in report order."""

from deltatap.collector.reports import minimum as _minimum  # noqa: F401  minimum (Appendix C.1)
from deltatap.collector.reports import decomposition as _decomposition  # noqa: F401  decomposition (profiles §6)
from deltatap.collector.reports import methodology as _methodology  # noqa: F401  ttft, itl
from deltatap.collector.reports import guardrails as _guardrails  # noqa: F401  guardrails (one per firewall)
from deltatap.collector.reports import guardrail_compare as _compare  # noqa: F401  guardrail_comparison
from deltatap.collector.reports import cascade as _cascade  # noqa: F401  timeouts, cascades
