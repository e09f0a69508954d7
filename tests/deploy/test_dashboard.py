"""Every metric the Grafana dashboard queries exists: a real collector, reference stack, taps and load
generator run in-process, traffic flows, and their /metrics are scraped. Every metric name in every
panel's PromQL must be a sample name there, every label matcher must match a real series, and every
`by (...)` label must exist on the metrics it groups."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from deltatap.core.vocab import Outcome
from tests.conftest import free_port

from .pipeline import ROOT, running_pipeline, scrape_all

DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "deltatap.json"
VARIABLES = {"$guardrail": "firewall", "$__rate_interval": "1m", "$__range": "1h"}
_METRIC = re.compile(r"\b(deltatap_[a-z0-9_]+)\b(\{[^}]*\})?")
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_BY = re.compile(r"\bby\s*\(([^)]*)\)")
# label values that the traffic above does not produce but the vocabulary defines (a timeout needs a
# request to run into a 10 s gateway timeout); a matcher on one of these is right by construction
VOCABULARY_VALUES = {"outcome": {o.value for o in Outcome}}


def dashboard_queries() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    out = []
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            out.append((panel["title"], t["expr"]))
    for var in dash["templating"]["list"]:
        out.append((f"variable {var['name']}", var["definition"]))
    return out


def _samples(texts: dict[str, str]) -> list[tuple[str, dict[str, str]]]:
    out = []
    for text in texts.values():
        for fam in text_string_to_metric_families(text):
            out.extend((s.name, s.labels) for s in fam.samples)
    return out


def _substitute(expr: str) -> str:
    for k, v in VARIABLES.items():
        expr = expr.replace(k, v)
    return expr


def test_dashboard_is_valid_and_covers_what_the_issue_asks():
    dash = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for needed in ("ttft contribution", "residual", "guardrail", "timeout", "spans dropped"):
        assert needed in titles, needed
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    ds = {t["datasource"]["uid"] for p in dash["panels"] for t in p.get("targets", [])}
    assert ds == {"deltatap-prometheus"}
    for _title, expr in dashboard_queries():
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr


def check_queries(queries: list[tuple[str, str]], samples: list[tuple[str, dict[str, str]]]) -> list[str]:
    """Every problem with ``queries`` against the scraped ``samples``."""
    names = {n for n, _ in samples}
    problems = []
    for title, expr in queries:
        expr = _substitute(expr)
        used = _METRIC.findall(expr)
        if not used:
            problems.append(f"{title}: no deltatap metric in {expr!r}")
        for name, selector in used:
            if name not in names:
                problems.append(f"{title}: {name} is not exported (have {sorted(n for n in names if n.startswith(name.rsplit('_', 1)[0]))})")
                continue
            series = [labels for n, labels in samples if n == name]
            for label, op, value in _MATCHER.findall(selector or ""):
                value = value.replace('\\"', '"')
                if op == "=":
                    ok = any(s.get(label) == value for s in series)
                    ok = ok or (value in VOCABULARY_VALUES.get(label, ()) and any(label in s for s in series))
                elif op == "=~":
                    ok = any(re.fullmatch(value, s.get(label, "")) for s in series)
                else:  # negative matchers select by absence; the label must exist
                    ok = any(label in s for s in series)
                if not ok:
                    have = sorted({s.get(label, "<none>") for s in series})
                    problems.append(f"{title}: {name}{{{label}{op}\"{value}\"}} matches no series (values: {have})")
        metric_names = [n for n, _ in used]
        for group in _BY.findall(expr):
            for label in (x.strip() for x in group.split(",") if x.strip()):
                if not any(label in labels for n, labels in samples if n in metric_names):
                    problems.append(f"{title}: `by ({label})` but no series of {metric_names} has that label")
    return problems


def test_the_check_catches_a_wrong_name_label_or_grouping():
    samples = [("deltatap_tap_requests_total", {"link": "edge", "outcome": "ok"})]
    assert check_queries([("ok", 'sum by (link) (rate(deltatap_tap_requests_total{outcome="ok"}[5m]))')], samples) == []
    assert len(check_queries([("name", "rate(deltatap_tap_request_total[5m])")], samples)) == 1
    assert len(check_queries([("value", 'deltatap_tap_requests_total{outcome="okay"}')], samples)) == 1
    assert len(check_queries([("label", 'sum by (cause) (deltatap_tap_requests_total)')], samples)) == 1


async def test_every_dashboard_metric_exists_in_the_scraped_metrics(tmp_path: Path):
    async with running_pipeline(tmp_path, unused_port=free_port()) as p:
        assert len(p.collector.rows()) >= len(p.records) > 0, "the collector emitted no rows for the traffic"
        texts = await scrape_all(p)
    problems = check_queries(dashboard_queries(), _samples(texts))
    assert not problems, "\n".join(problems)
