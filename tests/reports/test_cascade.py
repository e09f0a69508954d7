"""Observed cascades over hand-made rows: the draft's example scaled to 0.5 s / 1.2 s, exact."""

from __future__ import annotations

import pytest

from deltatap.collector.reports.cascade import cascade_section, find_cascades
from deltatap.core.topology import default_topology
from tests.reports.factories import MS, T0, cascade, row


def rows():
    # request 1: gateway gives up at 0.5 s, client gets the 504 at 0.501 s, engine ran 0.01 s -> 1.2 s
    r1 = row(1, outcome="http_error", http_status=504,
             points_ns={"client.send": T0, "client.end": T0 + 501 * MS, "engine.queue": T0 + 10 * MS},
             cascade=cascade({"gateway": T0 + 500 * MS}, T0 + 1200 * MS, 700 * MS, 60, {"fw-engine": 1}))
    # request 2: the client itself gives up at 0.3 s; the gateway retried once, engine ran 0.02 s -> 0.4 s
    r2 = row(2, outcome="client_cancel",
             points_ns={"client.send": T0, "engine.queue": T0 + 20 * MS},
             cascade=cascade({"client": T0 + 300 * MS}, T0 + 400 * MS, None, 10, {"fw-engine": 2}))
    # request 3: gave up, but the engine had already finished: not a cascade
    r3 = row(3, outcome="timeout", points_ns={"client.send": T0},
             cascade=cascade({"gateway": T0 + 500 * MS}, T0 + 100 * MS, -400 * MS, 0))
    r4 = row(4, points_ns={"client.send": T0})  # a normal request
    return [r1, r2, r3, r4]


def test_cases_are_exact():
    cases = find_cascades(rows(), default_topology())
    assert [c.request_id for c in cases] == ["req-1", "req-2"]
    c1, c2 = cases
    assert (c1.gave_up_by, c1.gave_up_s, c1.client_error_s) == ("gateway", 0.5, 0.501)
    assert c1.engine_busy_s == pytest.approx(1.19) and c1.after_gave_up_s == pytest.approx(0.7) and c1.engine_end_s == 1.2
    assert c1.tokens_for_nobody == 60 and c1.engine_attempts == 1
    assert c1.sentence() == (
        "client got an error at 0.50 s, engine wasted 1.19 s (gateway gave up at 0.50 s; the engine kept "
        "generating until 1.20 s, 0.70 s after that, 60 tokens generated for nobody)"
    )
    assert (c2.gave_up_by, c2.client_error_s, c2.engine_attempts) == ("client", 0.3, 2)
    assert c2.after_gave_up_s == pytest.approx(0.1)  # engine_end - gave_up when the row has no busy figure
    assert c2.engine_busy_s == pytest.approx(0.38)


def test_summary_totals_and_sentence():
    s = cascade_section(rows(), default_topology())
    v = {r["metric"]: r["value"] for r in s.table("cascade_summary").records()}
    assert v["requests"] == 4 and v["requests where some layer gave up (refusals excluded)"] == 3
    assert v["cascades (engine still working after the give-up)"] == 2
    assert v["engine time for results nobody received, total"] == pytest.approx(1.57)
    assert v["engine time after the first give-up, total"] == pytest.approx(0.8)
    assert v["tokens generated for nobody, total"] == 70
    assert v["requests the engine saw more than once (retries)"] == 1 and v["extra engine attempts from retries"] == 1
    assert s.notes[0] == (
        "2 of 4 requests cascaded (gave up first: client 1, gateway 1); the engine spent 1.57 s on results "
        "nobody received, 0.80 s of it after the first give-up, and generated 70 tokens for nobody."
    )
    assert s.notes[1].startswith("Median cascade: client got an error at 0.30 s, engine wasted 0.38 s")
    assert "Retries multiplied engine work: 1 requests reached the engine more than once (1 extra attempts)." in s.notes
    assert [r["request_id"] for r in s.table("cascade_timelines").records()] == ["req-1", "req-2"]  # costliest first
    assert s.data["engine_wasted_s"] == pytest.approx(1.57)


def test_no_cascade_says_so():
    s = cascade_section([rows()[3]], default_topology())
    assert s.notes == ["No timeout cascades observed in 1 requests (0 requests where some layer gave up)."]
    assert [t.name for t in s.tables] == ["cascade_summary"]
