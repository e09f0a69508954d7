"""The reports of real runs of the reference stack read at a glance (issue 22): the demo, a run of
timeout cascades and a run heavy in blocked requests, each made as ``deltatap demo`` makes it.

For each run's HTML page, Markdown and terminal output: the headline comes first (where the time goes,
then its stacked bar, then the median waterfall); every component keeps its one colour in every plot
(read back from the PNGs' pixels) and on the dashboard; no quantity that cannot be negative is
negative; and every request left out of a table or curve is accounted for beside it."""

from __future__ import annotations

import io
import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread
from rich.console import Console

from deltatap.collector.applies import is_refused
from deltatap.collector.reports.colors import KIND_COLORS, PART_COLORS, component_colors
from deltatap.collector.reports.render_terminal import print_report
from deltatap.collector.rows import delta_defs
from deltatap.core.topology import default_topology
from tests.collector.report_runs import make_runs
from tests.reports.htmlcheck import parse_page

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "deltatap.json"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return make_runs(tmp_path_factory.mktemp("runs"))


def _rgb(hex_color: str) -> np.ndarray:
    return np.array([int(hex_color[i : i + 2], 16) for i in (1, 3, 5)], dtype=float) / 255


def _pixels_of(png: bytes, hex_color: str) -> int:
    img = imread(io.BytesIO(png), format="png")[..., :3]
    return int((np.abs(img - _rgb(hex_color)).max(axis=-1) < 1.5 / 255).sum())


def _figures(result) -> dict[str, bytes]:
    return {f.name: f.data for f in result.report.figures}


def test_the_three_runs_have_what_they_are_for(runs):
    demo, casc, blocks = (Counter(r.outcome for r in runs[n].rows) for n in ("demo", "cascades", "blocks"))
    assert demo["refused"] >= 1 and demo["timeout"] >= 1, demo
    assert casc["timeout"] == 4, casc  # the gateway's timeout is named timeout, as the stack names it
    assert blocks["refused"] >= 5, blocks


@pytest.mark.parametrize("name", ["demo", "cascades", "blocks"])
def test_headline_first_in_every_format(runs, name):
    r = runs[name]
    html = (r.out_dir / "report.html").read_text(encoding="utf-8")
    page = parse_page(html)
    assert page.external_refs == [] and all(img.startswith(b"\x89PNG") for img in page.images)
    sections = re.findall(r'<section id="([^"]+)"', html)
    assert sections[0] == "headline", sections
    body = html[html.index("<body>"):]
    order = [body.index(x) for x in ('id="headline"', 'id="fig-decomposition_bars"', 'id="table-headline"', 'id="fig-waterfall"', 'id="decomposition"')]
    assert order == sorted(order), order  # sentence, stacked bar, table, median waterfall, then the details
    first = re.search(r'<p class="lead">([^<]+)</p>', body).group(1)
    assert first.startswith("System TTFT P50") and " P99 " in first
    assert re.search(r'<p class="lead">Costs most: \w+, [\d.]+ ms of [\d.]+ ms at P50 \(\d+%\)', body)
    # reference material last and folded; no raw JSON dump, the C.1 block once
    assert body.index('<details id="details-minimum">') > body.index('id="cascades"')
    assert body.rstrip().endswith("</details>\n</body></html>") or body.rindex("</details>") > body.rindex("</section>")
    assert body.count("=== LLM Benchmark Report (Minimum) ===") == 1 and "<pre>{" not in body
    md = (r.out_dir / "report.md").read_text(encoding="utf-8")
    assert re.findall(r"^## (.+)$", md, re.M)[0] == "Where the time goes"
    assert md.index("<details><summary>Run metadata</summary>") > md.index("## Timeout cascades (observed)")
    buf = io.StringIO()
    print_report(r.report, Console(file=buf, width=80, color_system=None))
    out = buf.getvalue()
    assert out.lstrip("─ ").startswith("Where the time goes")
    assert max(len(line) for line in out.splitlines()) <= 80  # piped at 80 columns: every table fits
    assert out.index("Where the time goes") < out.index("Delta decomposition") < out.index("=== LLM Benchmark Report (Minimum) ===")


def test_one_colour_per_component_in_every_plot_and_on_the_dashboard(runs):
    topo = default_topology()
    colors = component_colors(topo)
    assert len(set(colors.values())) == len(colors)  # no two parts share a colour
    figs = _figures(runs["demo"])
    for fig in ("decomposition_bars", "waterfall", "ttft_cdf", "contribution_over_time"):
        for comp in ("gateway", "firewall", "engine"):
            assert _pixels_of(figs[fig], colors[comp]) > 20, (fig, comp)
    # and no plot paints a component in another one's colour: the old palette's firewall green / orange are gone
    for fig, data in figs.items():
        for stale in ("#55a868", "#dd8452", "#4c72b0"):
            assert _pixels_of(data, stale) < 5, (fig, stale)
    cascade = _figures(runs["cascades"])["cascade_timeline"]
    assert _pixels_of(cascade, colors["engine"]) > 100 and _pixels_of(cascade, colors["gateway"]) > 10  # the gateway gave up
    dash = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    fixed = {o["matcher"]["options"]: p["value"]["fixedColor"] for panel in dash["panels"] for o in panel.get("fieldConfig", {}).get("overrides", [])
             for p in o["properties"] if p["id"] == "color" and p["value"].get("fixedColor", "").startswith("#")}
    assert {k: fixed[k] for k in ("gateway", "firewall", "engine")} == {k: KIND_COLORS[k] for k in ("gateway", "firewall", "engine")}
    assert fixed["residual"] == PART_COLORS["residual"] and fixed["taps (overhead)"] == PART_COLORS["taps"]
    html = (runs["demo"].out_dir / "report.html").read_text(encoding="utf-8")
    for comp in ("gateway", "firewall", "engine"):
        assert f'style="background:{colors[comp]}" data-part="{comp}"' in html


@pytest.mark.parametrize("name", ["demo", "cascades", "blocks"])
def test_no_impossible_negative_and_every_exclusion_accounted_for(runs, name):
    r = runs[name]
    doc = json.loads((r.out_dir / "report.json").read_text(encoding="utf-8"))
    signed = {d.name for d in delta_defs(default_topology()) if d.phase in ("itl", "residual")}
    for row in doc["sections"]["percentiles"]["tables"]["deltas"]["rows"]:
        if row["delta"] not in signed:
            assert row["min_ms"] >= 0, row  # a duration: a cut stream's last token no longer makes it -150 ms
    head = doc["sections"]["headline"]
    for bar in head["data"]["bars"]:
        assert all(v >= 0 for k, v in bar["parts_ms"].items() if k != "residual"), bar
        assert sum(bar["parts_ms"].values()) == pytest.approx(bar["band_ms"], rel=1e-6)  # the bar adds up
    ex = head["data"]["excluded"]
    refused = sum(1 for row in r.rows if is_refused(row))
    assert ex["refused"] == refused
    assert head["data"]["kept"] + ex["refused"] + ex["cut"] + ex["other"] == len(r.rows)
    dec = doc["sections"]["decomposition"]["tables"]["decomposition"]
    if refused:
        assert any(f"{refused} refused or blocked" in n for n in dec["footnotes"]), dec["footnotes"]
        assert any(f"excluded {refused} refused or blocked" in n for n in head["notes"])
    deltas = {row["delta"]: row for row in doc["sections"]["percentiles"]["tables"]["deltas"]["rows"]}
    if "firewall_inbound_block" in deltas:
        assert deltas["firewall_inbound_block"]["count"] == refused  # block latency over blocked requests only
    completed = sum(1 for row in r.rows if row.outcome == "ok")
    if "firewall_outbound_last" in deltas:
        assert deltas["firewall_outbound_last"]["count"] <= completed
    # the TTFT CDF leaves the refused out and says so beside the plot
    cdf = next(f for f in r.report.figures if f.name == "ttft_cdf")
    if ex["refused"] + ex["other"] == 0:
        assert "none excluded" in cdf.caption
    if refused:
        assert f"excluded {refused} refused or blocked" in cdf.caption
    if ex["other"]:
        assert f"{ex['other']} without a first token" in cdf.caption


def test_a_run_where_nothing_can_be_decomposed_says_so_first():
    from deltatap.collector.reports.plots import report_figures
    from deltatap.collector.reports.registry import ReportInputs, build_report
    from tests.reports.factories import row

    rows = [row(i, outcome="refused", firewall_decision="block_pattern", deltas_ms={"firewall_inbound_block": 5.0}) for i in range(3)]
    report = build_report(ReportInputs(rows=rows), figures=report_figures)
    assert report.sections[0].name == "headline"
    assert report.sections[0].notes == ["No request of 3 can be decomposed (none with a first token and every delta of its path). "
                                        "Requests: excluded 3 refused or blocked."]
    assert not report.has("decomposition") and [f.name for f in report.figures] == []


def test_a_delta_takes_its_components_colour():
    from deltatap.collector.reports.colors import KIND_COLORS, PART_COLORS, color_of_delta

    topo = default_topology()
    assert color_of_delta("firewall_outbound", topo) == color_of_delta("firewall_inbound", topo) == KIND_COLORS["firewall"]
    assert color_of_delta("engine_ttft", topo) == KIND_COLORS["engine"] and color_of_delta("gateway_inbound", topo) == KIND_COLORS["gateway"]
    assert color_of_delta("tap_edge_request", topo) == PART_COLORS["taps"] and color_of_delta("residual", topo) == PART_COLORS["residual"]
