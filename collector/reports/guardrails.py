"""Guardrail overhead from one run (methodology §4.8, §5.10; profiles draft, AI firewall section).

For each firewall of the topology: inbound (t5-t3) and block (t4-t3) inspection latency, outbound
(t10-t9) latency, latency by decision path (allow, allow after deep analysis, block by pattern,
block by analysis, modify), and for streaming inspection the per-token delay, maximum pause,
pause frequency and jitter the firewall adds, from the inter-token gaps the taps saw on both
sides of it (the row's ``<fw>_itl_added_*`` deltas). When the workload labels requests
(benign / adversarial / benign with trigger words) it adds detection, false-positive,
over-defense and false-refusal rates.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from deltatap.collector.reports.columns import CHUNK_GAP, components_of_kind, decisions, delta_ms, is_blocked, labels
from deltatap.collector.reports.model import Column, Section, Table
from deltatap.collector.reports.registry import ReportInputs, ReportOptions, register_section
from deltatap.collector.reports.stats import rate, summarize
from deltatap.collector.deltas import Deltas, registry
from deltatap.collector.rows import Row
from deltatap.core.topology import Topology
from deltatap.core.vocab import ComponentKind

DECISION_ORDER = ("allow", "allow_after_analysis", "modify", "block_pattern", "block_analysis")
DECISION_TITLES = {
    "allow": "allow",
    "allow_after_analysis": "allow (flagged, deep analysis)",
    "modify": "modify",
    "block_pattern": "block (pattern match)",
    "block_analysis": "block (semantic analysis)",
    "": "no decision recorded",
}

_DIST_COLS = [
    Column("count", "Count", "", 0),
    Column("p50_ms", "P50", "ms", 2),
    Column("p90_ms", "P90", "ms", 2),
    Column("p99_ms", "P99", "ms", 2),
    Column("mean_ms", "Mean", "ms", 2),
    Column("max_ms", "Max", "ms", 2),
]


def _dist(values: np.ndarray) -> list:
    s = summarize(values)
    return [s.count, s.p50, s.p90, s.p99, s.mean, s.max]


def _fw_deltas(reg: Deltas, fw: str) -> tuple:
    """The firewall's inbound, block, outbound and last-token outbound deltas, from the registry."""
    return tuple(reg.of(key, fw) for key in ("inbound", "inbound_block", "outbound", "outbound_last"))


def latency_table(rows: Sequence[Row], fw: str, topology: Topology | None = None) -> Table:
    blocked = is_blocked(rows)
    inbound, block, outbound, last = _fw_deltas(registry(topology), fw)
    t = Table(f"{fw}_latency", f"{fw}: inspection latency", [Column("metric", "Delta"), Column("formula", "Points"), *_DIST_COLS])
    t.add("inbound, passing", inbound.formula, *_dist(delta_ms(rows, inbound.name)[~blocked]))
    t.add("inbound, blocking", block.formula, *_dist(delta_ms(rows, block.name)[blocked]))
    t.add("outbound, first token", outbound.formula, *_dist(delta_ms(rows, outbound.name)))
    t.add("outbound, last token", last.formula, *_dist(delta_ms(rows, last.name)[_completed(rows)]))
    t.footnotes.append("Last token: completed streams only (a stream cut by a timeout has no last-token delay).")
    return t


def _completed(rows: Sequence[Row]) -> np.ndarray:
    return np.array([r.outcome == "ok" for r in rows], dtype=bool)


def decision_table(rows: Sequence[Row], fw: str, topology: Topology | None = None) -> Table:
    dec = decisions(rows)
    d_in, d_block, d_out, _ = _fw_deltas(registry(topology), fw)
    inbound = delta_ms(rows, d_in.name)
    block = delta_ms(rows, d_block.name)
    outbound = delta_ms(rows, d_out.name)
    t = Table(
        f"{fw}_by_decision",
        f"{fw}: latency by decision path",
        [
            Column("decision", "Decision"),
            Column("requests", "Requests", "", 0),
            Column("share", "Share", "%", 1),
            Column("inspection_p50_ms", "Inspection P50", "ms", 2),
            Column("inspection_p99_ms", "Inspection P99", "ms", 2),
            Column("inspection_mean_ms", "Inspection mean", "ms", 2),
            Column("decision_p50_ms", "Decision P50", "ms", 2),
            Column("outbound_p50_ms", "Outbound P50", "ms", 2),
        ],
    )
    t.footnotes.append(f"Inspection: {d_in.formula} for requests let through, {d_block.formula} (time to block) for blocked ones. "
                       f"Decision: {d_block.formula} for every request (time to reach the decision, without forwarding).")
    present = [d for d in DECISION_ORDER if (dec == d).any()]
    present += sorted({d for d in dec if d not in DECISION_ORDER})
    for d in present:
        m = dec == d
        insp = block[m] if str(d).startswith("block") else inbound[m]
        s, o, dd = summarize(insp), summarize(outbound[m]), summarize(block[m])
        t.add(DECISION_TITLES.get(d, d), int(m.sum()), rate(int(m.sum()), len(rows)), s.p50, s.p99, s.mean, dd.p50, o.p50)
    return t


def streaming_table(rows: Sequence[Row], fw: str, opts: ReportOptions, topology: Topology | None = None) -> Table | None:
    """Streaming inspection (profiles draft: per-token delay, maximum pause, pause frequency, jitter).

    Per request: the hold per token is estimated as the mean of the first token's and the last
    token's outbound delay (exact whenever the hold changes linearly along the stream, as with
    per-window checks); the inter-chunk gap added is the mean gap released minus the mean gap received (it is
    negative when the firewall holds the start and then releases faster); the pause added is the
    longest gap released minus the longest received."""
    reg = registry(topology)
    first, last = delta_ms(rows, reg.named("outbound", fw)), delta_ms(rows, reg.named("outbound_last", fw))
    hold = (first + last) / 2
    itl_mean = delta_ms(rows, reg.named("itl_added_mean", fw))
    itl_p99 = delta_ms(rows, reg.named("itl_added_p99", fw))
    pause = delta_ms(rows, reg.named("max_pause_added", fw))
    m = (np.isfinite(itl_mean) | np.isfinite(pause)) & _completed(rows)
    if not m.any():
        return None
    hold_s, mean_s, p99_s, pause_s = summarize(hold[m]), summarize(itl_mean[m]), summarize(itl_p99[m]), summarize(pause[m])
    n = int(m.sum())
    paused = int((pause[m] >= opts.pause_threshold_ms).sum())
    t = Table(f"{fw}_streaming", f"{fw}: streaming inspection (both sides of the firewall)", [Column("metric", "Metric"), Column("value", "Value", "", 2), Column("unit", "Unit")])
    t.add("completed streams measured", n, "")
    t.add("per-token inspection delay, P50 over requests", hold_s.p50, "ms")
    t.add("per-token inspection delay, P99 over requests", hold_s.p99, "ms")
    t.add("jitter contribution (std dev of per-token delay across requests)", hold_s.std, "ms")
    t.add(f"{CHUNK_GAP} added (mean gap released - received), P50", mean_s.p50, "ms")
    t.add("tail gap added (P99 gap released - received), P50", p99_s.p50, "ms")
    t.add("maximum pause added, P50 over requests", pause_s.p50, "ms")
    t.add("maximum pause added, worst request", pause_s.max, "ms")
    t.add(f"pause frequency (requests with a pause >= {opts.pause_threshold_ms:g} ms added)", rate(paused, n), "fraction")
    t.footnotes.append(
        "Per-token delay: mean of the first and last token's outbound delay per request. The taps keep count, mean, "
        f"P99 and max of the gaps on each side (not every gap), so the {CHUNK_GAP} and pauses added are differences of those."
    )
    return t


def accuracy_table(rows: Sequence[Row], opts: ReportOptions) -> Table | None:
    cls = labels(rows, opts.class_label)
    if not any(c for c in cls):
        return None
    blocked = is_blocked(rows)
    refused = np.array([r.outcome in ("refused", "http_error") or b for r, b in zip(rows, blocked, strict=True)], dtype=bool)
    adv = np.isin(cls, opts.adversarial)
    trig = np.isin(cls, opts.benign_trigger)
    benign = np.isin(cls, opts.benign) | trig
    t = Table(
        "firewall_accuracy",
        "Firewall accuracy from the workload's labels",
        [Column("metric", "Metric"), Column("definition", "Definition"), Column("requests", "Requests", "", 0), Column("hits", "Blocked / refused", "", 0), Column("rate", "Rate", "%", 1)],
    )
    t.add("detection rate", "adversarial requests blocked", int(adv.sum()), int((blocked & adv).sum()), rate(int((blocked & adv).sum()), int(adv.sum())))
    t.add("false positive rate", "benign requests blocked", int(benign.sum()), int((blocked & benign).sum()), rate(int((blocked & benign).sum()), int(benign.sum())))
    t.add("over-defense rate", "benign with trigger words blocked", int(trig.sum()), int((blocked & trig).sum()), rate(int((blocked & trig).sum()), int(trig.sum())))
    t.add("false refusal rate", "benign refused at the system boundary (any source)", int(benign.sum()), int((refused & benign).sum()), rate(int((refused & benign).sum()), int(benign.sum())))
    return t


def firewall_section(rows: Sequence[Row], fw: str, opts: ReportOptions, topology: Topology | None = None) -> Section:
    section = Section(f"guardrails_{fw}" if fw != "firewall" else "guardrails", f"Guardrail overhead: {fw}")
    d_in, d_block, d_out, _ = _fw_deltas(registry(topology), fw)
    inbound = delta_ms(rows, d_in.name)
    outbound = delta_ms(rows, d_out.name)
    blocked = is_blocked(rows)
    block_lat = delta_ms(rows, d_block.name)[blocked]
    s_in, s_out, s_blk = summarize(inbound[~blocked]), summarize(outbound), summarize(block_lat)
    section.tables.append(latency_table(rows, fw, topology))
    section.tables.append(decision_table(rows, fw, topology))
    stream = streaming_table(rows, fw, opts, topology)
    if stream is not None:
        section.tables.append(stream)
    acc = accuracy_table(rows, opts)
    if acc is not None:
        section.tables.append(acc)
    # methodology §4.8.1 disclosure, from what was observed
    section.notes.append(
        f"Input filtering: {'observed' if s_in.count else 'not observed'} ({s_in.count} requests inspected inbound); "
        f"output filtering: {'observed' if s_out.count else 'not observed'} ({s_out.count} first tokens inspected); "
        f"requests refused during the test: {int(blocked.sum())} of {len(rows)}."
    )
    if s_in.count:
        total = s_in.p50 + (s_out.p50 if s_out.count else 0.0)
        section.notes.append(
            f"{fw} adds {s_in.p50:.2f} ms inbound ({d_in.formula}, P50) and {s_out.p50 if s_out.count else float('nan'):.2f} ms to the "
            f"first token outbound ({d_out.formula}, P50): {total:.2f} ms of client TTFT at P50."
        )
    if s_blk.count:
        section.notes.append(f"Blocking latency ({d_block.formula}): P50 {s_blk.p50:.2f} ms, P99 {s_blk.p99:.2f} ms over {s_blk.count} blocked requests.")
    section.data = {
        "inbound_pass_ms": s_in.as_dict(),
        "inbound_block_ms": s_blk.as_dict(),
        "outbound_first_ms": s_out.as_dict(),
        "blocked": int(blocked.sum()),
        "requests": len(rows),
    }
    return section


@register_section
class GuardrailOverhead:
    name = "guardrails"
    order = 50
    title = "Guardrail overhead"

    def build(self, inputs: ReportInputs) -> list[Section] | None:
        fws = components_of_kind(inputs.topology, ComponentKind.FIREWALL)
        if not fws or not inputs.rows:
            return None
        return [firewall_section(inputs.rows, fw, inputs.options, inputs.topology) for fw in fws]
