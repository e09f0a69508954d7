"""The delta registry (collector/deltas.py): one definition per delta that rows, tables, reports, /metrics,
re-exported spans and docs/reference.md all read."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from deltatap.collector import deltas
from deltatap.collector.deltas import GROUPS, SYSTEM_TTFT, Template, delta_defs, registry
from deltatap.collector.metrics import CollectorMetrics
from deltatap.collector.pipeline import Pipeline
from deltatap.collector.reexport import decomposition_spans
from deltatap.collector.reports.registry import ReportInputs, build_report
from deltatap.collector.reports.renderers import RENDERERS
from deltatap.collector.rows import record_columns, to_record
from deltatap.collector.spans import decode_request
from deltatap.collector.table import decomposition, render_csv
from deltatap.core.topology import ComponentSpec, LinkModel, Topology, default_topology
from deltatap.core.vocab import DEFAULT_POINT_ALIASES, DRAFT_DELTAS, ComponentKind, Role

from otlpfactory import default_stack, request

ROOT = Path(__file__).resolve().parents[2]
COLLECTOR = ROOT / "collector"


def chain(*comps: tuple[str, ComponentKind]) -> Topology:
    names = [n for n, _ in comps]
    return Topology(name="t", components=[ComponentSpec(name=n, kind=k) for n, k in comps],
                    links=[LinkModel(name=f"{a}-{b}", downstream=a, upstream=b) for a, b in zip(names, names[1:])])


# ---- what the registry says ----------------------------------------------------------------


def test_aliases_are_the_drafts_formulas():
    reg = registry()
    for name, (end, start) in DRAFT_DELTAS.items():
        assert reg.by_name[name].alias == f"{end} - {start}", name
    # every alias is made of the two points' draft names, never written per delta
    names = {v: k for k, v in DEFAULT_POINT_ALIASES.items()}
    for d in reg:
        if d.alias and d.name != "gateway_outbound":  # t10 names both sides of the firewall -> gateway hop
            assert d.alias == f"{names[d.end]} - {names[d.start]}", d.name
    assert reg.by_name["gateway_outbound"].alias == "t11 - t10"
    assert reg.by_name["firewall_outbound_last"].alias is None
    assert reg.by_name["firewall_outbound_last"].formula == "firewall.out.last_out - firewall.out.last_in"
    assert not any(d.alias for d in reg if not d.end)  # derived deltas have no draft formula


def test_aliases_follow_the_topology_not_the_component_names():
    topo = chain(("user", ComponentKind.CLIENT), ("fw", ComponentKind.FIREWALL), ("vllm", ComponentKind.ENGINE))
    reg = registry(topo)
    assert reg.of("inbound", "fw").name == "fw_inbound" and reg.of("inbound", "fw").alias == "t5 - t3"
    assert reg.by_name[SYSTEM_TTFT].alias == "t12 - t0"
    assert reg.by_name["engine_ttft"].component == "vllm" and reg.by_name["engine_ttft"].alias == "t7 - t6"
    assert [d.name for d in reg.of_phase("tap")] == ["tap_user-fw_request", "tap_user-fw_first_token", "tap_fw-vllm_request", "tap_fw-vllm_first_token"]
    # two firewalls: the draft names neither (it has one), their formulas use generic points
    two = registry(chain(("client", ComponentKind.CLIENT), ("fw1", ComponentKind.FIREWALL), ("fw2", ComponentKind.FIREWALL), ("engine", ComponentKind.ENGINE)))
    assert two.of("inbound", "fw2").alias is None and two.of("inbound", "fw2").formula == "fw2.in.exit - fw2.in.arrive"
    assert two.by_name["engine_queue"].alias == "t6a - t6"


def test_fields_derived_from_one_line():
    reg = registry()
    fi = reg.by_name["firewall_inbound"]
    assert (fi.label, fi.component, fi.phase, fi.ttft_term, fi.prefer_within, fi.signed) == ("firewall inbound", "firewall", "first", True, True, False)
    assert (fi.metric, fi.unit, fi.metric_component, fi.span_name) == ("deltatap_collector_delta_seconds", "seconds", "firewall", "deltatap.delta firewall_inbound")
    res = reg.by_name["residual"]
    assert res.signed and res.metric == "deltatap_collector_delta_sum_seconds" and not res.prefer_within
    assert reg.by_name["tap_edge_request"].metric_component == "taps" and reg.by_name["tap_edge_request"].ttft_term
    assert [d.name for d in reg if d.refused_only] == ["gateway_inbound_block", "firewall_inbound_block"]
    assert registry(default_topology()) is registry(default_topology())  # cached on what the deltas depend on
    assert delta_defs() is registry()


# ---- the docs -----------------------------------------------------------------------------------


def test_reference_lists_exactly_the_registry_with_aliases():
    text = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    section = text[text.index("\n## Deltas\n"):]
    listed = [(m.group(1), m.group(2).strip()) for m in re.finditer(r"^\| `([^`]+)` \| [^|]* \| ([^|]*) \|", section, re.M)]
    assert listed == [(d.name, d.alias or "") for d in registry()]


# ---- nobody else spells a delta -------------------------------------------------------------------

# Literals that equal a delta name but mean something else.
ALLOWED = {
    ("collector/reports/colors.py", "residual"): "the headline's part key (reports.colors.RESIDUAL), also a colour name",
    ("collector/table.py", "residual"): "the decomposition line's note",
    ("collector/reports/decomposition.py", "residual"): "the decomposition line's note",
}
# Modules of the Decomposer change (issue 16, another part) that still spell tap/ITL/residual names; they are
# to read deltas.delta_name / SYSTEM_TTFT / RESIDUAL.
PENDING: set[str] = set()  # modules not moved onto the registry yet (none)
ALIAS = re.compile(r"\bt\d+a?\s*-\s*t\d+a?\b")


def _strings(tree: ast.AST):
    """(line, text) of every string literal that is not a docstring; f-strings with '{}' for their fields."""
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                docs.add(id(first.value))
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            inside.update(id(v) for v in node.values)
            yield node.lineno, text
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs and id(node) not in inside:
            yield node.lineno, node.value


def _spelled(text: str, names: set[str], patterns: set[str], fragments: set[str]) -> str | None:
    if text in names or text in patterns or text in fragments:
        return text
    m = ALIAS.search(text)
    return m.group(0) if m else None


def test_no_module_but_the_registry_spells_a_delta_name_or_alias():
    topos = [default_topology(), chain(("client", ComponentKind.CLIENT), ("router", ComponentKind.ROUTER), ("engine", ComponentKind.ENGINE))]
    names = {d.name for t in topos for d in registry(t)}
    patterns = {t.name.replace("{owner}", "{}") for t in deltas.TEMPLATES.values()}
    fragments = {f for p in patterns if "{}" in p for f in p.split("{}") if f}
    found = []
    for path in sorted(COLLECTOR.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "collector/deltas.py" or rel in PENDING:
            continue
        for line, text in _strings(ast.parse(path.read_text(encoding="utf-8"))):
            hit = _spelled(text, names, patterns, fragments)
            if hit is not None and (rel, hit) not in ALLOWED:
                found.append(f"{rel}:{line}: {text!r}")
    assert not found, "delta names / aliases spelled outside collector/deltas.py (read the registry):\n" + "\n".join(found)


def test_the_scan_finds_what_it_looks_for():
    names, patterns = {"firewall_inbound"}, {"{}_inbound"}
    tree = ast.parse('x = f"{m}_inbound"\ny = "firewall_inbound"\nz = "(t5-t3, P50)"\nw = "_inbound"\n')
    hits = [_spelled(t, names, patterns, {"_inbound"}) for _, t in _strings(tree)]
    assert sorted(h for h in hits if h) == ["_inbound", "firewall_inbound", "t5-t3", "{}_inbound"]


# ---- one file changes a delta everywhere ----------------------------------------------------------


@pytest.fixture
def renamed_inbound(monkeypatch):
    """The registry with one line changed: the intermediaries' inbound delta renamed and relabelled."""
    groups = tuple((over, tuple(dataclasses.replace(t, name="{owner}_ingress", label="{owner} ingress") if t.key == "inbound" else t for t in ts))
                   for over, ts in GROUPS)
    monkeypatch.setattr(deltas, "GROUPS", groups)
    monkeypatch.setattr(deltas, "TEMPLATES", {t.key: t for _, ts in groups for t in ts})
    deltas._registry.cache_clear()
    yield
    deltas._registry.cache_clear()


def _run(topo: Topology):
    pipe = Pipeline(topo)
    for i in range(3):
        spans, _ = default_stack(rid=f"req-{i}", fp=f"fp-{i}")
        pipe.ingest(decode_request(request(spans)), 0.0)
    rows = pipe.flush()
    assert len(rows) == 3
    return pipe, rows


def test_changing_one_line_of_the_registry_changes_every_reader(renamed_inbound):
    assert isinstance(deltas.TEMPLATES["inbound"], Template)
    topo = default_topology()
    pipe, rows = _run(topo)
    row = rows[0]
    # rows (computed by the decomposition from the registry's points) and their flat records
    assert row.deltas["firewall_ingress"].ns == row.points["firewall.in.exit"].unix_ns - row.points["firewall.in.arrive"].unix_ns
    assert "firewall_inbound" not in row.deltas and "d.firewall_ingress.ns" in record_columns(topo)
    assert to_record(row, topo)["d.gateway_ingress.ns"] == row.deltas["gateway_ingress"].ns
    # the residual still subtracts it (a TTFT term)
    terms = sum(v.ns for k, v in row.deltas.items() if registry(topo).by_name[k].ttft_term)
    assert row.deltas["residual"].ns == row.deltas[SYSTEM_TTFT].ns - terms
    # the decomposition table, every report section, the docs table
    lines = decomposition(pipe.aggregator, topo)
    assert [ln.delta for ln in lines][:2] == ["gateway_ingress", "firewall_ingress"] and "firewall_ingress" in render_csv(lines, pipe.aggregator)
    md = RENDERERS["markdown"](build_report(ReportInputs(rows=rows, topology=topo)))
    text = "\n".join(md.values())
    assert "firewall_ingress" in text and "firewall_inbound" not in text
    assert "firewall adds 5.00 ms inbound (t5 - t3, P50)" in text  # the guardrail section reads the renamed delta
    assert "| `firewall_ingress` | firewall ingress | t5 - t3 |" in deltas.reference_markdown()
    # /metrics and the re-exported spans
    prom = CollectorMetrics(pipe.snapshot, pipe.hist).render().decode()
    assert 'deltatap_collector_delta_seconds_count{component="firewall",delta="firewall_ingress"} 3.0' in prom
    spans = decomposition_spans(rows, topo).resource_spans[0].scope_spans[0].spans
    assert "deltatap.delta firewall_ingress" in {s.name for s in spans} and "deltatap.delta firewall_inbound" not in {s.name for s in spans}


def test_moving_a_point_of_one_line_changes_the_values_and_the_alias(monkeypatch):
    """The inbound delta measured from the client's send instead: values, alias and tables follow."""
    groups = tuple((over, tuple(dataclasses.replace(t, start=(deltas.CLIENT, Role.SEND)) if t.key == "inbound" else t for t in ts)) for over, ts in GROUPS)
    monkeypatch.setattr(deltas, "GROUPS", groups)
    deltas._registry.cache_clear()
    try:
        topo = default_topology()
        reg = registry(topo)
        assert reg.by_name["firewall_inbound"].alias == "t5 - t0" and reg.by_name["firewall_inbound"].start == "client.send"
        pipe, rows = _run(topo)
        r = rows[0]
        assert r.deltas["firewall_inbound"].ns == r.points["firewall.in.exit"].unix_ns - r.points["client.send"].unix_ns
        text = "\n".join(RENDERERS["markdown"](build_report(ReportInputs(rows=rows, topology=topo))).values())
        assert "| inbound, passing | t5 - t0 |" in text.replace("  ", " ")
    finally:
        deltas._registry.cache_clear()


def test_without_the_change_the_same_run_reads_inbound():
    pipe, rows = _run(default_topology())
    assert rows[0].deltas["firewall_inbound"].ns == 5_000_000
    prom = CollectorMetrics(pipe.snapshot, pipe.hist).render().decode()
    assert 'deltatap_collector_delta_seconds_count{component="firewall",delta="firewall_inbound"} 3.0' in prom

