"""benchmarks/tail1_s26_tail1.py's wire split: each request's path time cut where tcpdump saw its head and its first
token, on generated captures (tcpdump -A text) with known instants."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[2] / "benchmarks"
spec = importlib.util.spec_from_file_location("tail1_s26_tail1", HERE / "tail1_s26_tail1.py")
tail1 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tail1)

ENGINE, TAP = 8000, 9000
OFF = 1_700_000_000_000_000_000  # wall - mono


def seg(t_mono: int, sport: int, dport: int, payload: str) -> str:
    wall = t_mono + OFF
    return (f"{wall // 10**9}.{wall % 10**9:09d} IP 127.0.0.1.{sport} > 127.0.0.1.{dport}: Flags [P.], seq 1:100, ack 1, "
            f"win 512, length 99\nE..x..@.@.........{payload}\n")


def head(rid: str) -> str:
    return f"POST /v1/chat/completions HTTP/1.1\nHost: x\nx-request-id: {rid}\nContent-Type: application/json\n"


TOK0 = '65\ndata: {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": " tok0"}}]}\n'
TOK1 = '65\ndata: {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": " tok1"}}]}\n'


def exchange(i: int, slow_us: dict[str, int], via_tap: bool) -> tuple[str, dict, tuple]:
    """One request's capture, its client row and its engine timer; every segment 100 us but those in ``slow_us``."""
    us = 1000
    d = {n: slow_us.get(n, 100) * us for n in ("client_send", "proxy_in", "engine_read", "engine_write", "proxy_out", "client_read")}
    t0 = 10**9 + i * 30_000_000
    engine_own = 20_000_000
    cport, tport = 40000 + i, 50000 + i
    t_client_head = t0 + d["client_send"]
    t_engine_head = t_client_head + (d["proxy_in"] if via_tap else 0)
    t_in = t_engine_head + d["engine_read"]
    t_first = t_in + engine_own
    t_tok_engine = t_first + d["engine_write"]
    t_tok_client = t_tok_engine + (d["proxy_out"] if via_tap else 0)
    tft = t_tok_client + d["client_read"]
    rid = f"{'tap' if via_tap else 'direct'}-0-{i}"
    if via_tap:
        text = (seg(t_client_head, cport, TAP, head(rid)) + seg(t_engine_head, tport, ENGINE, head(rid))
                + seg(t_tok_engine, ENGINE, tport, TOK0) + seg(t_tok_client, TAP, cport, TOK0)
                + seg(t_tok_engine + 2_000_000, ENGINE, tport, TOK1))
    else:
        text = seg(t_client_head, cport, ENGINE, head(rid)) + seg(t_tok_engine, ENGINE, cport, TOK0)
    row = {"rid": rid, "t0": t0, "tft": tft, "engine_ns": engine_own, "ttft_ns": tft - t0, "path_ns": tft - t0 - engine_own}
    return text, row, ("engine-timer:_set_result_unless_cancelled", t_first - 5_000, t_first)


@pytest.mark.parametrize("via_tap", [False, True])
def test_wire_split_finds_the_slow_segment(via_tap: bool) -> None:
    texts, rows, timers = [], [], []
    slow = {7: {"engine_read": 3000}, 55: ({"proxy_out": 2000} if via_tap else {"client_send": 2000})}
    for i in range(200):
        text, row, timer = exchange(i, slow.get(i, {}), via_tap)
        texts.append(text)
        rows.append(row)
        timers.append(timer)
    path = "tap" if via_tap else "direct"
    out = tail1.wire_segments("".join(texts), {path: rows}, ENGINE, OFF, timers)[path]
    assert out["n"] == 200 and out["slow_n"] == 2
    med = out["median_us"]
    assert med["client_send"] == 100 and med["engine_read"] == 100 and med["engine_write"] == 100 and med["client_read"] == 100
    assert med["proxy_in"] == med["proxy_out"] == (100 if via_tap else 0)
    first, second = out["slowest_us"]
    assert first["engine_read"] == 3000 and first["path"] == (600 if via_tap else 400) + 2900
    other = "proxy_out" if via_tap else "client_send"
    assert second[other] == 2000
    excess = out["slowest_1pct_mean_excess_us"]
    assert excess["engine_read"] == 1450 and excess[other] == 950
    assert out["share_of_excess"]["engine_read"] == pytest.approx(1450 / 2400, abs=1e-3)


def test_wire_split_without_the_engine_timers_keeps_the_engine_whole() -> None:
    texts, rows = [], []
    for i in range(120):
        text, row, _timer = exchange(i, {"engine_write": 900} if i == 3 else {}, False)
        texts.append(text)
        rows.append(row)
    out = tail1.wire_segments("".join(texts), {"direct": rows}, ENGINE, OFF, [])
    assert "no --hook-engine" in out["note"]
    d = out["direct"]
    assert d["median_us"]["engine_read"] == 200 and d["median_us"]["engine_write"] == 0  # read + write together
    assert d["slowest_us"][0]["engine_read"] == 1000
