"""benchmarks/tap_overhead.py's self-report per turn (``--pairs``: ``pair_report``, ``boot_ci``) and
benchmarks/selfreport_gap.py's per-pair parts (``paired_gap``), on generated inputs whose answers are known."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import selfreport_gap as srg  # noqa: E402
import tap_overhead as tov  # noqa: E402


def _spans_file(path: Path, overheads: dict[str, tuple[int, int]]) -> Path:
    """A JSON-lines OTLP file (the tap's ``--otlp file:`` format) with one span per request id: (request + first
    token split 1:2, hop)."""
    spans = []
    for rid, (over, hop) in overheads.items():
        attrs = {"deltatap.request_id": rid, "deltatap.overhead.request_ns": over // 3,
                 "deltatap.overhead.first_token_ns": over - over // 3, "deltatap.overhead.hop_ns": hop}
        spans.append({"attributes": [{"key": k, "value": ({"stringValue": v} if isinstance(v, str) else {"intValue": str(v)})}
                                     for k, v in attrs.items()]})
    path.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}) + "\n")
    return path


def test_boot_ci_covers_a_known_shift_and_pairs_narrow_it():
    rng = random.Random(3)
    base = [rng.gauss(500_000, 150_000) for _ in range(400)]  # path times with a wide common part (ns)
    tap = [b + 30_000 + rng.gauss(0, 5_000) for b in base]  # +30 us each, small own noise
    diff = [t - b for t, b in zip(tap, base)]
    ci = tov.boot_ci(lambda a: tov.np.median(a, -1), diff, paired=True)
    assert ci[0] < 30_000 < ci[1] and ci[1] - ci[0] < 3_000
    # the same data as two independent samples: the common part is not cancelled, the interval is far wider
    ci2 = tov.boot_ci(lambda a, b: tov.np.median(a, -1) - tov.np.median(b, -1), tap, base)
    assert ci2[0] < 30_000 < ci2[1] and ci2[1] - ci2[0] > 10 * (ci[1] - ci[0])
    assert tov.boot_ci(lambda a: tov.np.median(a, -1), [1.0], paired=True) is None


def test_pair_report_is_the_median_of_per_turn_differences(tmp_path):
    turns, warm = 60, 4
    direct = [400_000 + 1_000 * (i % 7) for i in range(turns)]
    # per turn: tap path = direct + self-report + 25 us unreported (+ a turn left out: no span, one failed request)
    selfs = [150_000 + 500 * (i % 5) for i in range(turns)]
    tap = [d + s + 25_000 for d, s in zip(direct, selfs)]
    tap[10] = None
    spans = _spans_file(tmp_path / "spans.jsonl", {f"tap-pair-{i}": (selfs[i], 20_000) for i in range(turns) if i != 11})
    raw = {"paths": ["direct", "tap"], "turns": turns, "path_ns": {"direct": direct, "tap": tap}}
    out = tov.pair_report(raw, spans, warm)
    assert out["turns_used"] == turns - warm - 2 and out["turns_left_out"] == 2
    assert out["median_pair_difference_us"] == 25.0 and out["median_pair_difference_with_hop_us"] == 5.0
    assert out["median_pair_difference_ci95_us"] == [25.0, 25.0]
    assert out["target_within_50us"] is True and out["hop_p50_us"] == 20.0
    # 80 us unreported in every turn, hop 20: both intervals beyond +50 us: not met
    spans = _spans_file(tmp_path / "spans2.jsonl", {f"tap-pair-{i}": (selfs[i] - 55_000, 20_000) for i in range(turns)})
    assert tov.pair_report(raw, spans, warm)["target_within_50us"] is False
    assert tov.pair_report(raw, spans, warm, "tap-other") == {}


def test_pair_report_splits_turns_by_the_request_before_the_taps(tmp_path):
    # turns D T | T D | D T ...: in even turns the tap's request follows the direct one, in odd turns the tap's own
    turns = 41
    direct = [400_000] * turns
    selfs = [150_000] * turns
    tap = [d + s + (70_000 if i % 2 == 0 else 20_000) for i, (d, s) in enumerate(zip(direct, selfs))]
    spans = _spans_file(tmp_path / "spans.jsonl", {f"tap-pair-{i}": (selfs[i], 10_000) for i in range(turns)})
    raw = {"paths": ["direct", "tap"], "turns": turns, "path_ns": {"direct": direct, "tap": tap}}
    split = tov.pair_report(raw, spans, 1)["median_pair_difference_by_previous_request_us"]
    assert split["after_other_path"]["median"] == 70.0 and split["after_other_path"]["n"] == 20
    assert split["after_same_path"]["median"] == 20.0 and split["after_same_path"]["n"] == 20
    # three paths D T E | E T D | D E T | T E D: each of the two last follows its own request in one turn of four
    assert [tov.turn_order(["direct", "tap", "envoy"], i) for i in range(5)] == [
        ["direct", "tap", "envoy"], ["envoy", "tap", "direct"], ["direct", "envoy", "tap"], ["tap", "envoy", "direct"],
        ["direct", "tap", "envoy"]]
    raw3 = {"paths": ["direct", "tap", "envoy"], "turns": turns, "path_ns": {"direct": direct, "tap": tap, "envoy": direct}}
    split3 = tov.pair_report(raw3, spans, 1)["median_pair_difference_by_previous_request_us"]
    assert split3["after_same_path"]["n"] == 10 and split3["after_other_path"]["n"] == 30  # (turns 1..40: turn 3 mod 4 follows itself)
    spans3 = _spans_file(tmp_path / "spans3.jsonl", {f"envoy-pair-{i}": (selfs[i], 10_000) for i in range(turns)})
    raw3e = {"paths": ["direct", "tap", "envoy"], "turns": turns, "path_ns": {"direct": direct, "tap": direct, "envoy": tap}}
    split3e = tov.pair_report(raw3e, spans3, 1, "envoy")["median_pair_difference_by_previous_request_us"]
    assert split3e["after_same_path"]["n"] == 10 and split3e["after_other_path"]["n"] == 30  # (turn 1 mod 4)


def test_paired_gap_parts_add_up_to_the_gap():
    rng = random.Random(5)
    per_req = {}
    for i in range(50):
        d = {"client_send": rng.randint(150_000, 300_000), "engine": rng.randint(200_000, 400_000), "client_read": rng.randint(0, 2_000),
             "engine_wake": rng.randint(5_000, 40_000)}
        d["path"] = d["client_send"] + d["engine"] + d["client_read"]
        t = {"client_send": rng.randint(150_000, 300_000), "engine": rng.randint(200_000, 400_000), "client_read": rng.randint(0, 2_000),
             "engine_wake": rng.randint(5_000, 40_000), "tap_request_unreported": rng.randint(3_000, 9_000),
             "tap_first_token_unreported": rng.randint(3_000, 9_000), "hop": 20_000}
        t["path"] = t["client_send"] + t["engine"] + t["client_read"] + 300_000  # the tap's two segments: 300 us in all
        t["left"] = t["path"] - 300_000 + t["tap_request_unreported"] + t["tap_first_token_unreported"]
        per_req[f"direct@free-{i}-0"], per_req[f"tap@free-{i}-0"] = d, t
    per_req["tap@free-99-0"] = dict(t)  # no direct request in its turn: not a pair
    out = srg.paired_gap(per_req, "tap@free", "direct@free")
    assert out["pairs"] == 50
    parts = sum(out[k]["mean_us"] for k in ("client_send", "tap_request_unreported", "engine", "tap_first_token_unreported", "client_read"))
    assert abs(parts - out["gap"]["mean_us"]) < 0.5  # (each mean rounded to 0.1 us)
    assert abs(out["gap_with_hop"]["mean_us"] - (out["gap"]["mean_us"] - 20.0)) < 0.15
    assert abs(out["engine_wake"]["mean_us"] + out["engine_rest"]["mean_us"] - out["engine"]["mean_us"]) < 0.15
    assert srg.paired_gap({}, "tap@free", "direct@free") is None
    del per_req["tap@free-99-0"]
    split = srg.paired_gap(per_req, "tap@free", "direct@free", ["direct", "tap"])
    assert split["after_other_path"]["pairs"] == split["after_same_path"]["pairs"] == 25  # even turns: after the direct one
    assert split["after_other_path"]["gap"]["median_us"] == round(float(srg.np.median(
        [per_req[f"tap@free-{i}-0"]["left"] - per_req[f"direct@free-{i}-0"]["path"] for i in range(0, 50, 2)])) / 1e3, 1)
