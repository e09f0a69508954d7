"""Guardrail overhead across labelled runs (methodology §5.10): baseline, input filter, output
filter, full filter — or any labels the user gives (``--runs baseline=DIR input=DIR ...``).

Tables 13 and 14 of the draft: TTFT P50/P99 and E2E P50/P99 per configuration, throughput and its
reduction against the baseline; plus the §5.10.4 overheads (input filter overhead = TTFT(input) -
TTFT(baseline), total guardrail overhead = E2E(full) - E2E(baseline)) and, when the workload
labels requests, detection / false-positive / over-defense rates per configuration.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from deltatap.collector.deltas import SYSTEM_TTFT
from deltatap.collector.reports.columns import delta_ms, e2e_ms, is_blocked, labels, output_throughput
from deltatap.collector.reports.model import Column, Section, Table
from deltatap.collector.reports.registry import ReportInputs, ReportOptions, register_section
from deltatap.collector.reports.stats import pct, rate
from deltatap.collector.rows import Row
from deltatap.core.topology import Topology

RUN_TITLES = {"baseline": "Baseline", "input": "Input Filter", "output": "Output Filter", "full": "Full Filter"}


def run_title(label: str) -> str:
    return RUN_TITLES.get(label, label)


def latency_table(runs: dict[str, Sequence[Row]], topology: Topology) -> Table:
    t = Table(
        "guardrail_latency",
        "Guardrail overhead per configuration (methodology §5.10.5, table 13)",
        [
            Column("configuration", "Configuration"),
            Column("requests", "Requests", "", 0),
            Column("ttft_p50_ms", "TTFT P50", "ms", 1),
            Column("ttft_p99_ms", "TTFT P99", "ms", 1),
            Column("e2e_p50_ms", "E2E P50", "ms", 1),
            Column("e2e_p99_ms", "E2E P99", "ms", 1),
        ],
    )
    for label, rows in runs.items():
        ttft, e2e = delta_ms(rows, SYSTEM_TTFT), e2e_ms(rows, topology)
        t.add(run_title(label), len(rows), pct(ttft, 50), pct(ttft, 99), pct(e2e, 50), pct(e2e, 99))
    return t


def throughput_table(runs: dict[str, Sequence[Row]], topology: Topology, baseline: str) -> Table:
    t = Table(
        "guardrail_throughput",
        "Throughput impact (methodology §5.10.5, table 14)",
        [Column("configuration", "Configuration"), Column("throughput_tok_s", "Throughput", "tok/s", 1), Column("reduction", "Reduction", "%", 1)],
    )
    base = output_throughput(runs[baseline], topology) if baseline in runs else float("nan")
    for label, rows in runs.items():
        thr = output_throughput(rows, topology)
        red = None if label == baseline or not np.isfinite(base) or base <= 0 else (thr - base) / base
        t.add(run_title(label), thr, red)
    t.footnotes.append("Throughput achieved in each run (output tokens of successful requests per second of the run); it is the maximum only when the runs drove the system to capacity.")
    return t


def overhead_table(runs: dict[str, Sequence[Row]], topology: Topology, baseline: str) -> Table | None:
    if baseline not in runs:
        return None
    b = runs[baseline]
    b_ttft, b_e2e = pct(delta_ms(b, SYSTEM_TTFT), 50), pct(e2e_ms(b, topology), 50)
    t = Table(
        "guardrail_overhead",
        "Overhead against the baseline, at P50 (methodology §5.10.4)",
        [Column("configuration", "Configuration"), Column("ttft_overhead_ms", "TTFT overhead", "ms", 2), Column("e2e_overhead_ms", "E2E overhead", "ms", 2)],
    )
    for label, rows in runs.items():
        if label != baseline:
            t.add(run_title(label), pct(delta_ms(rows, SYSTEM_TTFT), 50) - b_ttft, pct(e2e_ms(rows, topology), 50) - b_e2e)
    return t


def accuracy_table(runs: dict[str, Sequence[Row]], opts: ReportOptions) -> Table | None:
    t = Table(
        "guardrail_accuracy",
        "Detection and false positives per configuration",
        [Column("configuration", "Configuration"), Column("detection", "Detection rate", "%", 1), Column("false_positive", "False positive rate", "%", 1), Column("over_defense", "Over-defense rate", "%", 1)],
    )
    for label, rows in runs.items():
        cls = labels(rows, opts.class_label)
        if not any(cls):
            continue
        blocked = is_blocked(rows)
        adv, trig = np.isin(cls, opts.adversarial), np.isin(cls, opts.benign_trigger)
        benign = np.isin(cls, opts.benign) | trig
        t.add(
            run_title(label),
            rate(int((blocked & adv).sum()), int(adv.sum())),
            rate(int((blocked & benign).sum()), int(benign.sum())),
            rate(int((blocked & trig).sum()), int(trig.sum())),
        )
    return t if t.rows else None


def comparison_section(runs: dict[str, Sequence[Row]], topology: Topology, opts: ReportOptions) -> Section:
    sec = Section("guardrail_comparison", "Guardrail overhead across configurations (methodology §5.10)")
    sec.tables.append(latency_table(runs, topology))
    sec.tables.append(throughput_table(runs, topology, opts.baseline_run))
    over = overhead_table(runs, topology, opts.baseline_run)
    if over is not None:
        sec.tables.append(over)
        for rec in over.records():
            sec.notes.append(
                f"{rec['configuration']}: {rec['ttft_overhead_ms']:+.2f} ms TTFT and {rec['e2e_overhead_ms']:+.2f} ms end-to-end at P50 against the baseline."
            )
    else:
        sec.notes.append(f"No run labelled {opts.baseline_run!r}: overheads against a baseline are not computed.")
    acc = accuracy_table(runs, opts)
    if acc is not None:
        sec.tables.append(acc)
    return sec


@register_section
class GuardrailComparison:
    name = "guardrail_comparison"
    order = 60
    title = "Guardrail overhead across configurations"

    def build(self, inputs: ReportInputs) -> Section | None:
        if len(inputs.runs) < 2:
            return None
        return comparison_section(inputs.runs, inputs.topology, inputs.options)
