"""Report sections register by name; a report is the registered sections that apply to its inputs.

A section is a small class with ``name``, ``title`` and ``build(inputs) -> Section | list | None``
(a list when it applies several times, e.g. once per firewall; None when it does not apply: no firewall in the topology, no labelled runs, no timeouts ...). It is a
pure function of :class:`ReportInputs`: rows, topology, optional load-generator records, labelled
runs, run metadata and options. Each has an ``order``; the report lists sections by it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from deltatap.collector.reports.model import Report, Section
from deltatap.collector.rows import Row
from deltatap.core.topology import Topology, default_topology


@dataclass
class ReportOptions:
    class_label: str = "class"  # the workload label holding the firewall class of a request
    benign: tuple[str, ...] = ("benign",)
    adversarial: tuple[str, ...] = ("adversarial",)
    benign_trigger: tuple[str, ...] = ("benign_trigger", "benign-trigger", "trigger")
    pause_threshold_ms: float = 5.0  # an added gap this long or longer counts as an inspection pause
    ttft_slo_ms: float = 500.0  # Appendix C.1 "throughput at P99 TTFT < 500 ms"
    baseline_run: str = "baseline"


@dataclass
class ReportInputs:
    rows: Sequence[Row] = ()
    topology: Topology = field(default_factory=default_topology)
    records: Sequence[dict[str, Any]] = ()  # load generator per-request records (docs/records.md)
    runs: dict[str, Sequence[Row]] = field(default_factory=dict)  # labelled runs for comparisons
    run_records: dict[str, Sequence[dict[str, Any]]] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    options: ReportOptions = field(default_factory=ReportOptions)


class SectionBuilder(Protocol):
    name: ClassVar[str]
    title: ClassVar[str]
    order: ClassVar[int]

    def build(self, inputs: ReportInputs) -> Section | list[Section] | None: ...


SECTIONS: dict[str, SectionBuilder] = {}


def register_section(cls: type) -> type:
    """Class decorator: instantiate and register a section builder under its ``name``."""
    name = cls.name
    if name in SECTIONS:
        raise ValueError(f"report section {name!r} registered twice")
    SECTIONS[name] = cls()
    return cls


def build_report(
    inputs: ReportInputs,
    title: str = "deltatap report",
    sections: Sequence[str] | None = None,
    figures: Callable[[ReportInputs], list] | None = None,
) -> Report:
    """Build the named sections (default: all registered) that apply to ``inputs``."""
    import deltatap.collector.reports.sections  # noqa: F401 - registers the built-in sections

    names = list(sections) if sections is not None else sorted(SECTIONS, key=lambda n: SECTIONS[n].order)
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        from deltatap.core.config import ConfigError

        raise ConfigError(f"unknown report section(s) {unknown}; known: {list(SECTIONS)}")
    report = Report(title=title, metadata=dict(inputs.metadata))
    for n in names:
        built = SECTIONS[n].build(inputs)
        if isinstance(built, Section):
            report.sections.append(built)
        elif built:
            report.sections.extend(built)
    if figures is not None:
        report.figures.extend(figures(inputs))
    return report
