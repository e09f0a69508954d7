"""Redaction audit: representative exchanges through a real ``deltatap tap`` process and the load generator, every
span written to files (``--otlp file:``), and no marker string anywhere in them: prompt text, completion text,
Authorization / api-key / Cookie values, query-string values, an error body, and raw upstream bytes that end up
in error attributes (a malformed status line, an oversized head with a ``Set-Cookie``, a malformed chunk line)."""

from __future__ import annotations

import asyncio
import json
import sys

import aiohttp
import pytest
from rel_support import record_figures
from rel_procs import REPO, start_tap_proc

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]

M = {  # one distinct marker per secret; none may appear in any span
    "prompt": "PRMTzq81x",
    "completion": "CMPLzq82x",
    "completion_loadgen": "CMPLzq83x",
    "authorization": "AUTHzq84x",
    "api_key": "APIKzq85x",
    "cookie": "COOKzq86x",
    "query_value": "QRYVzq87x",
    "query_value_2": "QRYVzq88x",
    "error_body": "ERRBzq89x",
    "status_line": "STLNzq90x",
    "set_cookie": "SETCzq91x",
    "chunk_line": "CHNKzq92x",
    "loadgen_authorization": "AUTHzq93x",
    "loadgen_cookie": "COOKzq94x",
    "loadgen_query": "QRYVzq95x",
}

BAD_REPLIES = {  # path -> what a broken upstream answers (then it closes)
    "/status-line": b"HTTP/1.1 2x0 token=" + M["status_line"].encode() + b"\r\nContent-Length: 0\r\n\r\n",
    "/big-head": b"HTTP/1.1 200 OK\r\nSet-Cookie: token=" + M["set_cookie"].encode() + b"\r\nx-pad: " + b"a" * (1 << 20) + b"\r\nContent-Length: 0\r\n\r\n",
    "/bad-chunk": b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\nzz " + M["chunk_line"].encode() + b"\r\n",
}


async def _bad_upstream():
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            path = head.split(b" ", 2)[1].decode().split("?")[0]
            writer.write(BAD_REPLIES.get(path, b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"))
            await writer.drain()
            await asyncio.sleep(0.1)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


async def test_no_secret_in_any_span(engine, tmp_path):
    engine.word = M["completion_loadgen"]
    bad = await _bad_upstream()
    bad_url = f"http://127.0.0.1:{bad.sockets[0].getsockname()[1]}"
    files = {"tap": tmp_path / "tap-spans.jsonl", "tap_bad_upstream": tmp_path / "tap-bad-spans.jsonl", "loadgen": tmp_path / "loadgen-spans.jsonl"}
    tap = await start_tap_proc(engine.url, f"file:{files['tap']}", tmp_path / "tap.log", "--grace-s", "1")
    tap_bad = await start_tap_proc(bad_url, f"file:{files['tap_bad_upstream']}", tmp_path / "tap-bad.log", "--grace-s", "1")
    secret_headers = {"Authorization": f"Bearer {M['authorization']}", "api-key": M["api_key"], "Cookie": f"session={M['cookie']}",
                      "Content-Type": "application/json"}
    try:
        async with aiohttp.ClientSession() as s:
            # a streamed chat with a secret prompt, credentials, a cookie and query values
            body = {"model": "m", "stream": True, "say": M["completion"],
                    "messages": [{"role": "user", "content": f"my secret is {M['prompt']}"}]}
            url = f"{tap.url}/v1/chat/completions?n=3&gap_ms=1&key={M['query_value']}&user={M['query_value_2']}"
            async with s.post(url, data=json.dumps(body), headers=secret_headers) as r:
                text = await r.text()
            assert r.status == 200 and M["completion"] in text and text.endswith("data: [DONE]\n\n"), text[-300:]
            # an error answer whose body carries a secret
            async with s.post(f"{tap.url}/v1/chat/completions?n=1", data=json.dumps({"model": "m", "fail": M["error_body"]}), headers=secret_headers) as r:
                text = await r.text()
            assert r.status == 400 and M["error_body"] in text, text
            # raw upstream bytes the tap cannot frame
            for path in BAD_REPLIES:
                try:
                    async with s.get(tap_bad.url + path, headers=secret_headers) as r:
                        await r.read()
                except aiohttp.ClientError:
                    pass  # what the client makes of a broken answer is not the point here
        # the load generator's client spans, with its own credentials and a query value
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "deltatap.app.cli", "load", "--target", f"{tap.url}/v1/chat/completions?key={M['loadgen_query']}",
            "--model", "m", "--requests", "5", "--warmup", "0", "--no-progress", "--no-gpu", "--out", str(tmp_path / "load"),
            "--header", f"Authorization:Bearer {M['loadgen_authorization']}", "--header", f"Cookie:c={M['loadgen_cookie']}",
            "--otlp", f"file:{files['loadgen']}", cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, out.decode()[-3000:]
    finally:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: tap.stop(timeout_s=30))
        await loop.run_in_executor(None, lambda: tap_bad.stop(timeout_s=30))
        bad.close()
        await bad.wait_closed()

    spans = {name: [sp for line in f.read_text().splitlines() for rs in json.loads(line)["resourceSpans"]
                    for ss in rs["scopeSpans"] for sp in ss["spans"]] for name, f in files.items()}
    record_figures("redaction_audit", {"spans": {k: len(v) for k, v in spans.items()}, "markers": sorted(M)})
    assert len(spans["tap"]) >= 2 + 5, f"tap spans: {len(spans['tap'])}"  # 2 exchanges + the load generator's 5
    assert len(spans["tap_bad_upstream"]) == len(BAD_REPLIES), f"{len(spans['tap_bad_upstream'])} spans for {len(BAD_REPLIES)} broken answers"
    assert len(spans["loadgen"]) >= 5, f"load generator spans: {len(spans['loadgen'])}"
    found = []
    for name, f in files.items():
        text = f.read_text()
        for what, marker in M.items():
            if marker in text:
                where = sorted({f"{a['key']}" for sp in spans[name] for a in sp.get("attributes", []) if marker in json.dumps(a)}
                               | {f"event {e['name']}" for sp in spans[name] for e in sp.get("events", []) if marker in json.dumps(e)})
                found.append(f"{what} ({marker}) in {name} spans: {', '.join(where) or 'elsewhere in the file'}")
    assert not found, "secrets in spans:\n" + "\n".join(found)
