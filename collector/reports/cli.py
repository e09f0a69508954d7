"""``deltatap guardrails``, ``deltatap cascade`` and ``deltatap summary``: reports over stored runs.

* ``deltatap guardrails --runs baseline=DIR input=DIR output=DIR full=DIR`` (or ``--config FILE``):
  per-run firewall overhead and, with two or more runs, the methodology §5.10 comparison.
* ``deltatap cascade --topology FILE [--rows DIR]``: declared per-layer timeouts with mismatches,
  and the cascades observed in a run.
* ``deltatap summary DIR``: every section (Appendix C.1, TTFT, ITL, guardrails, cascades) in every
  format, including the self-contained HTML page with plots.

Each prints to the terminal and, with ``--out DIR``, writes Markdown, CSV, JSON and HTML there.
"""

from __future__ import annotations

import argparse

from pydantic import Field, model_validator
from rich.console import Console

from deltatap.collector.reports.registry import ReportInputs, ReportOptions, build_report
from deltatap.collector.reports.renderers import parse_formats, write_report
from deltatap.collector.ingest import load_topology_offline
from deltatap.collector.reports.render_terminal import print_report
from deltatap.collector.reports.runs import load_run, parse_run_specs
from deltatap.core.config import ConfigError, StrictModel, load_yaml, validate
from deltatap.core.topology import Topology, default_topology


class GuardrailsConfig(StrictModel):
    """``deltatap guardrails --config FILE``: the same as the flags, in YAML."""

    runs: dict[str, str] = Field(min_length=1, description="label -> run directory or rows file")
    topology: str | None = None
    baseline: str | None = Field(default=None, description="label of the run without guardrails; given, it must be "
                                 "one of runs' labels (default: 'baseline', where there is one)")
    class_label: str = "class"
    pause_threshold_ms: float = Field(default=5.0, gt=0)
    out: str | None = None
    formats: str = "all"

    @model_validator(mode="after")
    def _baseline_among_runs(self) -> "GuardrailsConfig":
        if self.baseline is not None and self.baseline not in self.runs:
            raise ValueError(f"baseline {self.baseline!r} is not one of the runs' labels ({', '.join(self.runs)}); "
                             "name one of them, or leave it out for a run labelled 'baseline'")
        return self

    @property
    def baseline_run(self) -> str:
        return self.baseline if self.baseline is not None else "baseline"


def _add_output_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", metavar="FILE", help="topology YAML (default: the run's topology.yaml, else client -> gateway -> firewall -> engine)")
    p.add_argument("--out", metavar="DIR", help="also write the report there (Markdown, CSV, JSON, HTML)")
    p.add_argument("--formats", default="all", help="comma-separated: markdown,csv,json,html or all (default: all)")
    p.add_argument("--quiet", action="store_true", help="do not print the tables")


def _topology(flag: str | None, runs: list) -> Topology:
    if flag:
        return load_topology_offline(flag)  # a report binds nothing: tap.listen is optional
    return next((r.topology for r in runs if r.topology is not None), None) or default_topology()


def _emit(report, args, stem: str) -> int:
    formats = parse_formats(args.formats)
    if not args.quiet:
        print_report(report, Console())
    if args.out:
        written = write_report(report, args.out, formats, stem=stem)
        Console().print(f"wrote {', '.join(str(p) for p in written.values())}", highlight=False)
    return 0


# ------------------------------------------------------------------------------- guardrails


def guardrails_report(runs: dict[str, object], topology: Topology, options: ReportOptions):
    """Per-run guardrail sections (named ``guardrails.<label>`` when there are several runs) plus the comparison."""
    from deltatap.collector.reports.model import Report

    report = Report("deltatap guardrail overhead")
    for label, run in runs.items():
        single = build_report(ReportInputs(rows=run.rows, topology=topology, options=options), sections=["guardrails"])
        for s in single.sections:
            if len(runs) > 1:
                s.name, s.title = f"{s.name}.{label}", f"{s.title} — run {label}"
            report.sections.append(s)
    if len(runs) > 1:
        report.sections += build_report(ReportInputs(runs={k: v.rows for k, v in runs.items()}, topology=topology, options=options), sections=["guardrail_comparison"]).sections
    report.metadata = {"runs": {k: str(v.path) for k, v in runs.items()}, **{f"{k}.run": v.metadata for k, v in runs.items() if v.metadata}}
    return report


def cmd_guardrails(args: argparse.Namespace) -> int:
    if bool(args.config) == bool(args.runs):
        raise ConfigError("give either --runs LABEL=DIR ... or --config FILE")
    if args.config:
        cfg = load_yaml(args.config, GuardrailsConfig)
        specs = list(cfg.runs.items())
        args.topology = args.topology or cfg.topology
        args.out = args.out or cfg.out
        args.formats = cfg.formats if args.formats == "all" else args.formats
        opts = ReportOptions(class_label=cfg.class_label, pause_threshold_ms=cfg.pause_threshold_ms, baseline_run=cfg.baseline_run)
    else:
        specs = parse_run_specs(args.runs)
        parse_formats(args.formats)
        # the flags obey the same constraints as the YAML (one definition: GuardrailsConfig)
        cfg = validate(GuardrailsConfig, {"runs": dict(specs), "baseline": args.baseline, "class_label": args.class_label,
                                          "pause_threshold_ms": args.pause_threshold_ms}, "the flags")
        opts = ReportOptions(class_label=cfg.class_label, pause_threshold_ms=cfg.pause_threshold_ms, baseline_run=cfg.baseline_run)
    runs = {label: load_run(path, label) for label, path in specs}
    topology = _topology(args.topology, list(runs.values()))
    return _emit(guardrails_report(runs, topology, opts), args, "guardrails-")


# ---------------------------------------------------------------------------------- cascade


def cmd_cascade(args: argparse.Namespace) -> int:
    parse_formats(args.formats)
    run = load_run(args.rows, "run") if args.rows else None
    topology = _topology(args.topology, [run] if run else [])
    inputs = ReportInputs(rows=run.rows if run else (), topology=topology)
    report = build_report(inputs, "deltatap timeout cascades", sections=["timeouts", "cascades"])
    return _emit(report, args, "cascade-")


# ---------------------------------------------------------------------------------- summary


def summary_report(run, topology: Topology, options: ReportOptions | None = None, title: str = "deltatap report"):
    from deltatap.collector.reports.plots import report_figures

    inputs = ReportInputs(rows=run.rows, topology=topology, records=run.records, metadata=run.metadata, options=options or ReportOptions())
    return build_report(inputs, title, figures=report_figures)


def cmd_summary(args: argparse.Namespace) -> int:
    parse_formats(args.formats)
    run = load_run(args.run, "run", records=args.records)
    topology = _topology(args.topology, [run])
    return _emit(summary_report(run, topology), args, "")


def register(subparsers: argparse._SubParsersAction) -> None:
    g = subparsers.add_parser("guardrails", help="guardrail overhead: one run, or labelled runs compared (methodology §5.10)",
                              description="Firewall overhead per run and, with several labelled runs, the §5.10 tables.")
    g.add_argument("--runs", nargs="+", metavar="LABEL=DIR", help="run directories (or rows files) by label: baseline=DIR input=DIR output=DIR full=DIR")
    g.add_argument("--config", metavar="FILE", help="YAML with runs: {label: dir}, topology, baseline, class_label, pause_threshold_ms, out, formats")
    g.add_argument("--baseline", default=None, help="label of the run without guardrails, one of --runs' labels (default: baseline, where there is one)")
    g.add_argument("--class-label", default="class", help="workload label with benign / adversarial / trigger (default: class)")
    g.add_argument("--pause-threshold-ms", type=float, default=5.0, help="an added gap at least this long counts as an inspection pause (default: 5)")
    _add_output_flags(g)
    g.set_defaults(func=cmd_guardrails)

    c = subparsers.add_parser("cascade", help="timeout cascades: declared timeouts, mismatches, observed cascades",
                              description="Declared per-layer timeouts from the topology with mismatches flagged, and the cascades observed in a run.")
    c.add_argument("--rows", metavar="DIR", help="a run directory or rows file (omit to check the topology only)")
    _add_output_flags(c)
    c.set_defaults(func=cmd_cascade)

    s = subparsers.add_parser("summary", help="the full report of one run: Appendix C.1, TTFT, ITL, guardrails, cascades, HTML with plots",
                              description="Every report section of one run, printed and written as Markdown, CSV, JSON and a self-contained HTML page.")
    s.add_argument("run", metavar="DIR", help="a run directory (rows file, optional records.jsonl, run.json, topology.yaml) or a rows file")
    s.add_argument("--records", metavar="FILE", help="the load generator's records.jsonl (default: the one in DIR)")
    _add_output_flags(s)
    s.set_defaults(func=cmd_summary)
