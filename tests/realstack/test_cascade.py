"""A real timeout cascade: Envoy's route timeout is shorter than the engine's generation.

* llama.cpp behind Envoy (route timeout 1.5 s, configs/realstack-cascade-llama.yaml): Envoy gives up
  (504, or a cut stream once headers went out; access log flag UT), closes its upstream connection,
  the gw-engine tap passes the close on, and llama.cpp stops generating - checked on llama-server's
  own /slots, and in the collector's cascade facts.
* the reference engine with ``cancel_on_disconnect: false`` behind Envoy (route timeout 1.0 s,
  configs/realstack-cascade-refengine.yaml): the engine keeps generating after Envoy gave up; the
  collector reports the wasted engine seconds.
"""

from __future__ import annotations

import http.client
import json
import time
import uuid
from urllib.parse import urlsplit

import pytest
from realstack_support import start_stack, stop_stack, stream_until_cut

pytestmark = [pytest.mark.realstack, pytest.mark.timeout(300)]


def slots_busy(base: str) -> bool:
    u = urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
    try:
        conn.request("GET", "/slots")
        slots = json.loads(conn.getresponse().read())
    finally:
        conn.close()
    return any(s.get("is_processing") for s in slots)


def envoy_access_flags(run_dir, rid: str) -> list[str]:
    lines = [ln.split() for ln in (run_dir / "envoy.log").read_text().splitlines() if ln.startswith("ACCESS") and rid in ln]
    return [ln[4] for ln in lines if len(ln) > 4]


def test_llamacpp_stops_when_envoy_times_out():
    r = start_stack("configs/realstack-cascade-llama.yaml", "cascade-llama")
    try:
        engine = r.stack.url("llama-server")
        rid = f"cascade-{uuid.uuid4()}"
        # 800 tokens at llama.cpp's 55-85 tok/s here is >= 9 s of generation; Envoy's route timeout is 1.5 s
        body = {"model": "gemma", "stream": True, "max_tokens": 800, "ignore_eos": True,
                "messages": [{"role": "user", "content": "Write a very long story about the sea."}]}
        got = stream_until_cut(r.stack.entry_url, body, rid)
        assert got["status"] == 504 or got["cut"], f"Envoy's 1.5 s route timeout did not end the request: {got}"
        assert got["elapsed_s"] < 8, f"the client waited {got['elapsed_s']:.1f} s; Envoy's route timeout is 1.5 s"
        # llama.cpp notices the closed connection and frees its slot long before 800 tokens are done
        deadline = time.monotonic() + 5
        while slots_busy(engine) and time.monotonic() < deadline:
            time.sleep(0.05)
        stopped_after_s = time.monotonic() - got["end_mono"]
        assert not slots_busy(engine), "llama.cpp still generating 5 s after Envoy gave up"
        time.sleep(1.5)  # Envoy's access log is written when the stream is torn down
        flags = envoy_access_flags(r.stack.run_dir, rid)
        assert any("UT" in f for f in flags), f"Envoy's access log shows no upstream timeout (UT) for {rid}: {flags}"

        rows = [row for row in r.collector.rows() if row.request_id == rid]
        assert len(rows) == 1, f"expected one row for {rid}, got {len(rows)}"
        c = rows[0].cascade
        assert c.first_gave_up is not None, f"no component recorded as giving up: {c}"
        assert c.engine_busy_after_gave_up_ns is not None and c.engine_busy_after_gave_up_ns < 2e9, (
            f"llama.cpp kept going {c.engine_busy_after_gave_up_ns} ns after the first give-up: {c}")
        print(json.dumps({"client": got, "slots_idle_after_client_end_s": stopped_after_s, "envoy_flags": flags,
                          "first_gave_up": c.first_gave_up, "engine_busy_after_gave_up_s": c.engine_busy_after_gave_up_ns / 1e9,
                          "tokens_after_gave_up": c.tokens_after_gave_up}, indent=2, default=str))
    finally:
        stop_stack(r)


def test_reference_engine_wastes_seconds_after_envoy_gives_up():
    r = start_stack("configs/realstack-cascade-refengine.yaml", "cascade-refengine")
    try:
        rid = f"cascade-{uuid.uuid4()}"
        body = {"model": "gemma", "stream": True, "max_tokens": 150,
                "messages": [{"role": "user", "content": "Write a long story about the sea."}]}
        got = stream_until_cut(r.stack.entry_url, body, rid)
        assert got["status"] == 504 or got["cut"], f"Envoy's 1.0 s route timeout did not end the request: {got}"
        time.sleep(2.5)  # the engine finishes its 150 tokens (~1.8 s) regardless
        flags = envoy_access_flags(r.stack.run_dir, rid)
        assert any("UT" in f for f in flags), f"Envoy's access log shows no upstream timeout (UT) for {rid}: {flags}"
        rows = [row for row in r.collector.rows() if row.request_id == rid]
        assert len(rows) == 1, f"expected one row for {rid}, got {len(rows)}"
        c = rows[0].cascade
        assert c.first_gave_up is not None, f"no component recorded as giving up: {c}"
        wasted_s = (c.engine_busy_after_gave_up_ns or 0) / 1e9
        # 150 tokens x 12 ms = 1.8 s of decode against a 1.0 s route timeout: ~0.8 s wasted
        assert wasted_s >= 0.3, f"the reference engine (cancel_on_disconnect: false) should keep working; cascade {c}"
        print(json.dumps({"client": got, "envoy_flags": flags, "first_gave_up": c.first_gave_up,
                          "engine_busy_after_gave_up_s": wasted_s, "tokens_after_gave_up": c.tokens_after_gave_up}, indent=2, default=str))
    finally:
        stop_stack(r)
