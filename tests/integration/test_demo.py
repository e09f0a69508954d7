"""End to end on the reference stack: `deltatap demo` (the README's first command) runs to completion,
the guardrail report recovers the firewall's configured costs, and the cascade report's wasted
engine seconds agree with the engine's own spans."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rich.console import Console

from deltatap.app.demo import DEFAULT_CONFIG, run_demo
from deltatap.core.config import find_config
from deltatap.core.vocab import Attr
from tests.reports.htmlcheck import parse_page

pytestmark = pytest.mark.slow


def test_deltatap_demo_runs_to_completion(tmp_path):
    """The README's first command, as a user runs it (a subprocess with the console script)."""
    exe = Path(sys.executable).with_name("deltatap")
    out = tmp_path / "demo"
    t0 = time.monotonic()
    proc = subprocess.run([str(exe), "demo", "--out", str(out)], capture_output=True, text=True, timeout=110, cwd=tmp_path,
                          env={**os.environ, "COLUMNS": "160"})
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    for heading in ("Delta decomposition", "Guardrail overhead: firewall", "Timeout configuration", "Timeout cascades (observed)", "Where everything is"):
        assert heading in text, heading
    assert "client got an error at" in text and "engine wasted" in text
    for name in ("report.html", "report.md", "report.json", "rows.parquet", "records.jsonl", "run.json", "topology.yaml"):
        assert (out / name).is_file(), name
    page = parse_page((out / "report.html").read_text(encoding="utf-8"))
    # the headline's stacked bar and the median waterfall, the TTFT CDF, the gap histogram, the contribution over time, the cascade timeline
    assert len(page.images) == 6 and all(img.startswith(b"\x89PNG\r\n\x1a\n") for img in page.images)
    assert {"fig-decomposition_bars", "fig-waterfall", "fig-cascade_timeline", "headline"} <= page.ids
    assert page.external_refs == []
    doc = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert doc["sections"]["cascades"]["data"]["cascades"] >= 1
    assert doc["metadata"]["hardware"]["fingerprint_hash"] and doc["metadata"]["config_hash"]
    # what the taps measured next to what the components say, per delta, with the difference
    assert "What the taps measured vs what the components say" in text
    views = {r["delta"]: r for r in doc["sections"]["taps_vs_components"]["tables"]["taps_vs_components"]["rows"]}
    for name in ("gateway_inbound", "firewall_inbound", "engine_ttft", "firewall_outbound", "gateway_outbound", "system_ttft"):
        v = views[name]
        assert v["n"] >= 30 and v["taps_p50_ms"] > 0 and v["components_p50_ms"] > 0, v
        assert abs(v["diff_p50_ms"]) <= 1.5 and abs(v["taps_p50_ms"] - v["components_p50_ms"] - v["diff_p50_ms"]) <= v["components_p50_ms"], v
    print(f"deltatap demo took {elapsed:.1f} s")  # the timing claim itself is in docs/benchmarks.md


@pytest.fixture
def quiet_config(tmp_path) -> Path:
    """The demo stack with a gentle load (one request at a time) so that the firewall's own costs are
    what the deltas measure, plus the cascade phase."""
    cfg = yaml.safe_load(find_config(DEFAULT_CONFIG).read_text(encoding="utf-8"))
    cfg["load"]["mix"] = {"requests": 60, "concurrency": 1, "seed": 11,
                          "workload": {"workload": "firewall", "params": {"mix": {"benign": 0.4, "adversarial": 0.3, "trigger": 0.3},
                                                                         "output": {"dist": "uniform", "min": 8, "max": 16}}}}
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


def _own_p50_by_decision(spans) -> dict[str, float]:
    """The firewall's own statement, per decision: t5 - t3 when it let the request through, t4 - t3 when it blocked."""
    import numpy as np

    from deltatap.collector.reports.guardrails import DECISION_TITLES

    out: dict[str, list[float]] = {}
    for sp in spans:
        dec = sp.attributes.get(Attr.FIREWALL_DECISION)
        ev = {e.name: e.timestamp for e in sp.events}
        end = ev.get("in.decision") if str(dec).startswith("block") else ev.get("in.exit")
        if dec and end and "in.arrive" in ev:
            out.setdefault(DECISION_TITLES[dec], []).append((end - ev["in.arrive"]) / 1e6)
    return {k: float(np.percentile(v, 50)) for k, v in out.items()}


async def test_guardrail_overhead_and_cascade_match_the_stack(tmp_path, quiet_config):
    engine_spans, firewall_spans = InMemorySpanExporter(), InMemorySpanExporter()

    def observe(name, telemetry):
        if name in ("engine", "firewall"):
            telemetry.provider.add_span_processor(SimpleSpanProcessor(engine_spans if name == "engine" else firewall_spans))

    res = await run_demo(tmp_path / "out", quiet_config, console=Console(file=open(os.devnull, "w")), formats=["json"], observe=observe)
    cfg = yaml.safe_load(quiet_config.read_text(encoding="utf-8"))
    cost = cfg["firewall"]["inbound"]["cost"]
    fixed, deep = cost["fixed"]["fixed_ms"], cost["deep_analysis"]["fixed_ms"]
    assert cost["per_token_ms"] == 0  # so each decision's configured cost does not depend on the prompt
    configured = {"allow": fixed, "allow (flagged, deep analysis)": fixed + deep, "block (pattern match)": fixed, "block (semantic analysis)": fixed + deep}

    by_decision = {r["decision"]: r["inspection_p50_ms"] for r in res.report.section("guardrails").table("firewall_by_decision").records()}
    own = _own_p50_by_decision([s for s in firewall_spans.get_finished_spans() if s.name.endswith("firewall")])
    assert set(configured) <= set(by_decision) and set(configured) <= set(own), (by_decision, own)
    for decision, ms in configured.items():
        # what the report states agrees with the firewall's own spans (read here directly, not via the collector)
        assert abs(by_decision[decision] - own[decision]) <= 0.5, (decision, by_decision[decision], own[decision])
        # and never less than its configured cost (how much more depends on the firewall's own parse and
        # forward work and on how loaded this shared machine is: ~1.4 ms when quiet)
        assert by_decision[decision] >= ms - 0.2, (decision, by_decision[decision], ms)
    # the configured costs show in the time to decision (t4 - t3) at P50, on both the allow and the block path:
    # each request's decision waits its whole configured cost (the firewall's wait is exact), so the P50 is never
    # less than it; and the deep path is not a whole second stage more than the fast one (a decision point taken
    # from the wrong event). The difference of the two P50s is not bounded from below: they are P50s of different
    # requests, and load inflates them differently (seen at load 8-9: 10.98 ms for a configured 12).
    decision = {r["decision"]: r["decision_p50_ms"] for r in res.report.section("guardrails").table("firewall_by_decision").records()}
    print({k: round(v, 3) for k, v in by_decision.items()}, {k: round(v, 3) for k, v in decision.items()})
    for slow, fast in (("allow (flagged, deep analysis)", "allow"), ("block (semantic analysis)", "block (pattern match)")):
        assert decision[slow] >= fixed + deep - 0.2 and decision[fast] >= fixed - 0.2, (slow, fast, decision)
        assert decision[slow] - decision[fast] <= deep + fixed + 5.0, (slow, decision)

    # cascades: the engine's own span says how long it worked on each request (gen_ai.latency.e2e: queue -> end)
    cases = {r["request_id"]: r for r in res.report.section("cascades").table("cascade_timelines").records()}
    assert len(cases) == cfg["load"]["cascade"]["requests"]
    engine_own = {s.attributes.get(Attr.REQUEST_ID): s for s in engine_spans.get_finished_spans()}
    for rid, case in cases.items():
        span = engine_own[rid]
        e2e = span.attributes[Attr.VLLM_E2E]
        assert abs(case["engine_busy_s"] - e2e) <= 0.010, (rid, case["engine_busy_s"], e2e)
        # tokens for nobody: some, and at most what the engine generated beyond what reached the client (the
        # collector counts from the first layer that stopped reading, or the engine's own after-disconnect count)
        received = next(r["content_events"] for r in res.records if r["request_id"] == rid)
        assert 0 < case["tokens_for_nobody"] <= span.attributes[Attr.GENAI_OUTPUT_TOKENS] - received
        assert case["gave_up_by"] == "gateway" and case["client_error_s"] < case["engine_end_s"]
    total = sum(engine_own[rid].attributes[Attr.VLLM_E2E] for rid in cases)
    assert res.report.section("cascades").data["engine_wasted_s"] == pytest.approx(total, abs=0.030)
    gw_timeout = cfg["topology"]["components"][1]["timeout_s"]
    for case in cases.values():
        assert abs(case["gave_up_s"] - gw_timeout) < 0.05  # the gateway gave up when its timeout fired


async def test_guardrail_comparison_across_real_runs(tmp_path):
    """§5.10 on the reference stack: a baseline run with the firewall's inspection switched off and a full
    run with it on (same seed, benign traffic only). Two runs on a shared 2-core machine differ by a few ms of
    noise, so the checks are bounds: the TTFT overhead the comparison states is at least the firewall's
    configured inbound + outbound check cost, and not far above what the full run charges to the firewall."""
    from deltatap.collector.reports.guardrail_compare import comparison_section
    from deltatap.collector.reports.registry import ReportOptions

    cfg = yaml.safe_load(find_config(DEFAULT_CONFIG).read_text(encoding="utf-8"))
    cfg["load"] = {"mix": {"requests": 24, "concurrency": 1, "seed": 5,
                           "workload": {"workload": "firewall", "params": {"mix": {"benign": 1.0, "adversarial": 0.0, "trigger": 0.0},
                                                                          "output": {"dist": "fixed", "value": 12}}}}}
    paths = {}
    for label, enabled in (("baseline", False), ("full", True)):
        c = json.loads(json.dumps(cfg))
        c["firewall"]["inbound"]["enabled"] = c["firewall"]["outbound"]["enabled"] = enabled
        paths[label] = tmp_path / f"{label}.yaml"
        paths[label].write_text(yaml.safe_dump(c), encoding="utf-8")
    # the two runs at the same time, each its own stack: whatever else the machine does weighs on both alike
    # (as tests/compare does), and a run is mostly waiting
    done = await asyncio.gather(*(run_demo(tmp_path / label, path, console=Console(file=io.StringIO()), formats=["json"]) for label, path in paths.items()))
    runs = dict(zip(paths, done, strict=True))
    sec = comparison_section({k: v.rows for k, v in runs.items()}, run_topology(cfg), ReportOptions())
    over = sec.table("guardrail_overhead").row_by("configuration", "Full Filter")["ttft_overhead_ms"]
    fw = runs["full"].report.section("guardrails").data
    charged = fw["inbound_pass_ms"]["p50"] + fw["outbound_first_ms"]["p50"]
    print(f"TTFT overhead at P50: {over:.2f} ms; charged to the firewall in the full run: {charged:.2f} ms")
    fw_cfg = cfg["firewall"]
    floor = fw_cfg["inbound"]["cost"]["fixed"]["fixed_ms"] + fw_cfg["outbound"]["cost"]["fixed"]["fixed_ms"]
    assert floor <= over <= charged + 15.0, (over, charged, floor)
    lat = sec.table("guardrail_latency")
    for label, title in (("baseline", "Baseline"), ("full", "Full Filter")):
        own = {r["metric"]: r["value"] for r in runs[label].report.section("ttft").table("ttft").records()}
        assert lat.row_by("configuration", title)["ttft_p50_ms"] == pytest.approx(own["TTFT P50"])
    assert lat.row_by("configuration", "Baseline")["requests"] == 24


def run_topology(cfg):
    from deltatap.core.topology import Topology

    return Topology.model_validate(cfg["topology"])
