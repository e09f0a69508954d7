"""Imports every built-in section module so they register, and the reading order every renderer follows.

The reading order is the same in the terminal, Markdown and HTML: the headline first (where the
time goes), then the details in their registered order, and last, collapsed where the format can,
the reference material (the Appendix C.1 block and the run metadata).
"""

from collections.abc import Sequence

from deltatap.collector.reports import minimum as _minimum  # noqa: F401  minimum (Appendix C.1)
from deltatap.collector.reports import decomposition as _decomposition  # noqa: F401  headline, decomposition (profiles §6), percentiles
from deltatap.collector.reports import methodology as _methodology  # noqa: F401  ttft, itl
from deltatap.collector.reports import guardrails as _guardrails  # noqa: F401  guardrails (one per firewall)
from deltatap.collector.reports import guardrail_compare as _compare  # noqa: F401  guardrail_comparison
from deltatap.collector.reports import cascade as _cascade  # noqa: F401  timeouts, cascades
from deltatap.collector.reports.model import Section

TAIL_SECTIONS = ("minimum",)  # reference material: after the details, collapsed in HTML and Markdown


def reading_order(sections: Sequence[Section]) -> tuple[list[Section], list[Section]]:
    """(body, tail): the sections in the order a person reads them, the reference ones apart."""
    body = [s for s in sections if s.name not in TAIL_SECTIONS]
    tail = [s for s in sections if s.name in TAIL_SECTIONS]
    return body, tail
