"""The methodology draft's report formats: TTFT (§5.1.5.2), TTFT by input length (§5.1.5.3),
ITL (§5.4.5) and the minimum viable report (Appendix C.1).

TTFT is the client-observed ``system_ttft`` (t12 - t0) of each row. Inter-token latency is two figures,
named apart (``columns.ITL_PER_REQUEST`` and ``columns.CHUNK_GAP``): the ITL (per request), one value per
request from the load generator's records, and the inter-chunk gaps, every gap between content events
at the client (``chunk_unix_ns``). Without records the section falls back to the per-request
inter-chunk gap statistics the edge tap saw (mean and maximum per request: §5.4.4.2).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from deltatap.collector.deltas import SYSTEM_TTFT, SYSTEM_TTLT, registry
from deltatap.collector.reports.columns import CHUNK_GAP, CHUNK_GAP_DEF, ITL_PER_REQUEST, ITL_PER_REQUEST_DEF, delta_ms, ints
from deltatap.collector.reports.model import Column, Section, Table
from deltatap.collector.reports.registry import ReportInputs, register_section
from deltatap.collector.reports.stats import PERCENTILE_TITLES, summarize
from deltatap.collector.rows import Row
from deltatap.core.sse import itl_per_request_ns

INPUT_BUCKETS: tuple[tuple[int, int | None], ...] = ((0, 256), (256, 512), (512, 1024), (1024, 2048), (2048, 4096), (4096, None))


def _metric_table(name: str, title: str) -> Table:
    return Table(name, title, [Column("metric", "Metric"), Column("value", "Value", "", 1), Column("unit", "Unit")])


def ttft_table(ttft_ms: np.ndarray) -> Table:
    s = summarize(ttft_ms)
    t = _metric_table("ttft", "TTFT results (methodology §5.1.5.2)")
    t.add("Requests", s.count, "")
    for key in ("p50", "p90", "p95", "p99", "p999"):
        t.add(f"TTFT {PERCENTILE_TITLES[key]}", s.get(key), "ms")
    t.add("TTFT Mean", s.mean, "ms")
    t.add("TTFT Min", s.min, "ms")
    t.add("TTFT Max", s.max, "ms")
    return t


def sample_count_notes(n: int, what: str) -> list[str]:
    """§5.1.4.3: P99 needs 1000 samples for 10% relative error at 95% confidence, P99.9 needs 10000."""
    notes = [f"{what} sample count: {n}."]
    if n < 1000:
        notes.append(f"Fewer than 1000 samples: {what} P99 is not accurate to 10% (methodology §5.1.4.3).")
    elif n < 10000:
        notes.append(f"Fewer than 10000 samples: {what} P99.9 is not accurate to 10% (methodology §5.1.4.3).")
    return notes


def bucket_label(lo: int, hi: int | None) -> str:
    return f"{lo}+" if hi is None else f"{lo}-{hi}"


def ttft_by_input_table(ttft_ms: np.ndarray, tokens_in: np.ndarray) -> Table:
    t = Table(
        "ttft_by_input",
        "TTFT by input length (methodology §5.1.5.3)",
        [Column("input_tokens", "Input tokens"), Column("count", "Requests", "", 0), Column("p50_ms", "P50", "ms", 1), Column("p95_ms", "P95", "ms", 1), Column("p99_ms", "P99", "ms", 1)],
    )
    for lo, hi in INPUT_BUCKETS:
        m = (tokens_in >= lo) & ((tokens_in < hi) if hi is not None else np.isfinite(tokens_in))
        s = summarize(ttft_ms[m])
        if s.count:
            t.add(bucket_label(lo, hi), s.count, s.p50, s.p95, s.p99)
    return t


def chunk_gaps_from_records(records: Sequence[dict[str, Any]]) -> list[np.ndarray]:
    """Per request, the inter-chunk gaps (ms) between consecutive content events; TTFT is excluded (§5.4.3)."""
    out: list[np.ndarray] = []
    for rec in records:
        if rec.get("phase", "measure") != "measure":
            continue
        times = rec.get("chunk_unix_ns") or []
        if len(times) >= 2:
            out.append(np.diff(np.asarray(times, dtype=np.int64)).astype(float) / 1e6)
    return out


def itl_per_request_from_records(records: Sequence[dict[str, Any]]) -> np.ndarray:
    """ITL (per request), ms: (last token - first token) / (output tokens - 1) of every ok request with 2+
    tokens (:func:`deltatap.core.sse.itl_per_request_ns`, as the load generator's ``inter_token_latency``)."""
    out = []
    for rec in records:
        if rec.get("phase", "measure") != "measure" or rec.get("status", "ok") != "ok":
            continue
        v = itl_per_request_ns(rec.get("first_token_unix_ns"), rec.get("last_token_unix_ns"), rec.get("output_tokens"))
        if v is not None:
            out.append(v / 1e6)
    return np.asarray(out, dtype=float)


def itl_table(per_request_itl: np.ndarray) -> Table:
    s = summarize(per_request_itl)
    t = _metric_table("itl", f"{ITL_PER_REQUEST}: {ITL_PER_REQUEST_DEF}")
    t.add(f"{ITL_PER_REQUEST} requests", s.count, "")
    _percentile_rows(t, ITL_PER_REQUEST, s)
    return t


def _percentile_rows(t: Table, label: str, s) -> None:
    for key in ("p50", "p90", "p95", "p99", "p999"):
        t.add(f"{label} {PERCENTILE_TITLES[key]}", s.get(key), "ms")
    t.add(f"{label} Mean", s.mean, "ms")


def chunk_gap_table(per_request: list[np.ndarray]) -> Table:
    allv = np.concatenate(per_request) if per_request else np.array([], dtype=float)
    s = summarize(allv)
    t = _metric_table("chunk_gaps", f"{CHUNK_GAP} results (methodology §5.4.5): {CHUNK_GAP_DEF}")
    t.add(f"{CHUNK_GAP} samples", s.count, "")
    _percentile_rows(t, CHUNK_GAP, s)
    t.add(f"{CHUNK_GAP} Std Dev", s.std, "ms")
    t.add("P99/P50 Ratio", s.p99 / s.p50 if s.count and s.p50 > 0 else float("nan"), "")
    jit = summarize([float(np.std(a)) for a in per_request])
    pause = summarize([float(np.max(a)) for a in per_request])
    for key in ("p50", "p95", "p99"):
        t.add(f"Jitter (per-request std dev of the {CHUNK_GAP}s) {PERCENTILE_TITLES[key]}", jit.get(key), "ms")
    for key in ("p50", "p95", "p99"):
        t.add(f"Max pause (per-request max {CHUNK_GAP}) {PERCENTILE_TITLES[key]}", pause.get(key), "ms")
    return t


def chunk_gaps_from_tap_table(rows: Sequence[Row], link: str) -> Table | None:
    mean = np.array([r.gaps[link].down.mean_ns / 1e6 if link in r.gaps and r.gaps[link].down and r.gaps[link].down.mean_ns is not None else np.nan for r in rows])
    mx = np.array([r.gaps[link].down.max_ns / 1e6 if link in r.gaps and r.gaps[link].down and r.gaps[link].down.max_ns is not None else np.nan for r in rows])
    if not np.isfinite(mean).any():
        return None
    sm, sx = summarize(mean), summarize(mx)
    t = _metric_table("chunk_gaps_per_request", f"{CHUNK_GAP}s per request, as delivered by the {link} tap (§5.4.4.2)")
    t.add("Requests with 2+ chunks", sm.count, "")
    for key in ("p50", "p95", "p99"):
        t.add(f"Mean {CHUNK_GAP} per request {PERCENTILE_TITLES[key]}", sm.get(key), "ms")
    for key in ("p50", "p95", "p99"):
        t.add(f"Max {CHUNK_GAP} (pause) per request {PERCENTILE_TITLES[key]}", sx.get(key), "ms")
    return t


def tpot_ms(rows: Sequence[Row]) -> np.ndarray:
    ttft, ttlt, out = delta_ms(rows, SYSTEM_TTFT), delta_ms(rows, SYSTEM_TTLT), ints(rows, "tokens_out")
    with np.errstate(invalid="ignore", divide="ignore"):
        v = (ttlt - ttft) / (out - 1)
    v[~(out >= 2)] = np.nan
    return v


@register_section
class TtftSection:
    name = "ttft"
    order = 30
    title = "Time to first token"

    def build(self, inputs: ReportInputs) -> Section | None:
        ttft = delta_ms(inputs.rows, SYSTEM_TTFT)
        if not np.isfinite(ttft).any():
            return None
        sec = Section(self.name, f"Time to first token (client, {registry(inputs.topology).by_name[SYSTEM_TTFT].formula})", tables=[ttft_table(ttft)])
        tin = ints(inputs.rows, "tokens_in")
        if np.isfinite(tin).any():
            sec.tables.append(ttft_by_input_table(ttft, tin))
        sec.notes += sample_count_notes(int(np.isfinite(ttft).sum()), "TTFT")
        return sec


@register_section
class ItlSection:
    name = "itl"
    order = 40
    title = "Inter-token latency"

    def build(self, inputs: ReportInputs) -> Section | None:
        gaps = chunk_gaps_from_records(inputs.records)
        itl = itl_per_request_from_records(inputs.records)
        if gaps or itl.size:
            sec = Section(self.name, "Inter-token latency (client)", tables=[itl_table(itl), chunk_gap_table(gaps)])
            sec.notes.append(f"Two figures, named apart: {ITL_PER_REQUEST} = {ITL_PER_REQUEST_DEF}; {CHUNK_GAP} = {CHUNK_GAP_DEF}.")
            sec.notes += sample_count_notes(int(sum(a.size for a in gaps)), CHUNK_GAP)
            return sec
        if not inputs.topology.links:
            return None
        t = chunk_gaps_from_tap_table(inputs.rows, inputs.topology.links[0].name)
        if t is None:
            return None
        return Section(self.name, "Inter-token latency (edge tap)", tables=[t],
                       notes=[f"No load-generator records: per-request {CHUNK_GAP} statistics from the edge tap instead of every "
                              f"{CHUNK_GAP} ({CHUNK_GAP_DEF}); {ITL_PER_REQUEST} needs the records' token counts."])
