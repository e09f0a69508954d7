"""The methodology draft's minimum viable report (Appendix C.1), as a table and as the draft's text block."""

from __future__ import annotations

from typing import Any

import numpy as np

from deltatap.collector.deltas import SYSTEM_TTFT
from deltatap.collector.reports.columns import delta_ms, output_throughput, run_window_s
from deltatap.collector.reports.methodology import tpot_ms
from deltatap.collector.reports.model import Column, Section, Table
from deltatap.collector.reports.registry import ReportInputs, register_section
from deltatap.collector.reports.stats import summarize


def _workload_name(wl: Any) -> str:
    if isinstance(wl, dict):
        if not (wl.get("workload") or wl.get("name")) and wl and all(isinstance(v, dict) and v.get("workload") for v in wl.values()):
            return "; ".join(f"{phase}: {v['workload']}" for phase, v in wl.items())  # the demo: one workload per load phase
        return str(wl.get("workload") or wl.get("name") or "custom")
    return str(wl or "unknown")


def _boundary(topology: Any) -> str:
    """The SUT boundary the topology draws: everything behind the client, as a compound system."""
    names = [c.name for c in getattr(topology, "components", [])]
    return f"compound ({' -> '.join(names)})" if names else "unknown"


def _provenance_notes(meta: dict[str, Any]) -> list[str]:
    prov = meta.get("provenance") or {}
    hw = meta.get("hardware") or prov.get("hardware") or {}
    out = []
    for key, title in (("workload_sha256", "workload bytes SHA-256"), ("topology_sha256", "topology SHA-256")):
        v = meta.get(key) or prov.get(key)
        if v:
            out.append(f"{title}: {v}")
    if hw.get("fingerprint_hash"):
        out.append(f"hardware class: {hw.get('os', '?')}, {hw.get('cpu', '?')} (fingerprint {hw['fingerprint_hash'][:16]})")
    return out


def _fmt(v: float, unit: str, digits: int = 1) -> str:
    return "n/a" if not np.isfinite(v) else f"{v:.{digits}f} {unit}"


@register_section
class MinimumViableReport:
    name = "minimum"
    order = 10
    title = "LLM Benchmark Report (Minimum)"

    def build(self, inputs: ReportInputs) -> Section | None:
        rows, meta, opts = inputs.rows, inputs.metadata, inputs.options
        if not rows:
            return None
        ttft, tpot = summarize(delta_ms(rows, SYSTEM_TTFT)), summarize(tpot_ms(rows))
        thr = output_throughput(rows, inputs.topology)
        duration = run_window_s(rows, inputs.topology)
        hw = meta.get("hardware") or {}
        slo = f"{thr:.1f} tok/s" if ttft.count and ttft.p99 < opts.ttft_slo_ms and np.isfinite(thr) else f"not met (P99 TTFT {_fmt(ttft.p99, 'ms')})"
        fields = [
            ("System Identification", None),
            ("Model", str(meta.get("model", "unknown"))),
            ("Hardware", str(hw.get("accelerator_summary", "unknown"))),
            ("Software", str(meta.get("software", "unknown"))),
            ("SUT Boundary", str(meta.get("sut_boundary") or _boundary(inputs.topology))),
            ("Test Configuration", None),
            ("Workload", _workload_name(meta.get("workload"))),
            ("Load Model", str(meta.get("load_model", "unknown"))),
            ("Request Count", str(len(rows))),
            ("Test Duration", _fmt(duration, "s", 2)),
            ("Seed", str(meta["seed"]) if meta.get("seed") is not None else "none (the run drew nothing at random)" if meta.get("provenance") else "unknown"),
            ("Suite Version", str(meta.get("suite_version") or (meta.get("provenance") or {}).get("suite_version") or "unknown")),
            ("Key Results", None),
            ("TTFT P50", _fmt(ttft.p50, "ms")),
            ("TTFT P99", _fmt(ttft.p99, "ms")),
            ("TPOT P50", _fmt(tpot.p50, "ms", 2)),
            ("TPOT P99", _fmt(tpot.p99, "ms", 2)),
            ("Max Throughput", _fmt(thr, "tok/s") + " (achieved in this run)"),
            (f"Throughput at P99 TTFT < {opts.ttft_slo_ms:g}ms", slo),
            ("Notes", None),
        ]
        notes = list(meta.get("deviations") or []) + _provenance_notes(meta) + [str(meta.get("guardrails", "guardrail configuration: see the guardrail section"))]
        lines = ["=== LLM Benchmark Report (Minimum) ==="]
        t = Table(self.name, "Minimum viable report (Appendix C.1)", [Column("field", "Field"), Column("value", "Value")])
        for k, v in fields:
            if v is None:
                lines.append(f"\n{k}:")
            else:
                lines.append(f"  {k}: {v}")
                t.add(k, v)
        lines += [f"  {n}" for n in notes] + ["", "=== End Report ==="]
        for n in notes:
            t.add("Note", n)
        return Section(self.name, self.title, tables=[t], text="\n".join(lines) + "\n", data={"ttft_p50_ms": ttft.p50, "ttft_p99_ms": ttft.p99, "tpot_p50_ms": tpot.p50, "tpot_p99_ms": tpot.p99, "throughput_tok_s": thr})
