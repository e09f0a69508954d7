"""The HTML reports of real runs opened in headless Chromium (the real browser, driven over the DevTools
protocol): every image decodes and renders, the console stays free of errors, and on a 1280 x 800 screen
the demo report answers "which component costs most, by how much" without scrolling — the headline
sentence, the stacked bar of the decomposition and its legend all lie inside the first screen.

Runs: the demo, a run of timeout cascades and a run heavy in blocks (tests/collector/report_runs.py).
Each page's first screen and whole page are kept as PNG artifacts in ``$DELTATAP_ARTIFACTS`` (default
``~/.cache/deltatap/artifacts``) for a person to look at.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from pathlib import Path

import aiohttp
import pytest

from obs_support import Proc, cache_dir, free_port
from tests.collector.report_runs import make_runs

pytestmark = pytest.mark.observability

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
SCREEN = {"width": 1280, "height": 800}

CHECK = """(() => {
  const imgs = [...document.images];
  const box = id => { const e = document.getElementById(id); if (!e) return null; const r = e.getBoundingClientRect(); return {top: r.top, bottom: r.bottom, width: r.width}; };
  const lead = [...document.querySelectorAll('#headline p.lead')].map(p => ({text: p.textContent, bottom: p.getBoundingClientRect().bottom}));
  return {
    images: imgs.length,
    broken: imgs.filter(i => !(i.complete && i.naturalWidth > 0 && i.naturalHeight > 0)).map(i => i.alt),
    narrow: imgs.filter(i => i.getBoundingClientRect().width < 0.9 * document.body.clientWidth - 40).map(i => i.alt),
    firstSection: (document.querySelector('section') || {}).id,
    lead, bar: box('fig-decomposition_bars'), innerHeight: innerHeight,
    metadataOpen: (document.getElementById('metadata') || {}).open,
  };
})()"""


def artifacts() -> Path:
    p = Path(os.environ.get("DELTATAP_ARTIFACTS") or cache_dir() / "artifacts")
    p.mkdir(parents=True, exist_ok=True)
    return p


class Page:
    """One Chromium tab over the DevTools protocol: commands by id, events kept."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws, self.next_id, self.events = ws, 0, []

    async def call(self, method: str, timeout_s: float = 30.0, **params):
        self.next_id += 1
        my = self.next_id
        await self.ws.send_json({"id": my, "method": method, "params": params})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = await asyncio.wait_for(self.ws.receive_json(), max(0.1, deadline - time.monotonic()))
            if msg.get("id") == my:
                assert "error" not in msg, (method, msg["error"])
                return msg.get("result", {})
            self.events.append(msg)
        pytest.fail(f"{method}: no answer in {timeout_s} s")

    async def wait_event(self, method: str, timeout_s: float = 30.0) -> dict:
        for e in self.events:
            if e.get("method") == method:
                return e
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = await asyncio.wait_for(self.ws.receive_json(), max(0.1, deadline - time.monotonic()))
            self.events.append(msg)
            if msg.get("method") == method:
                return msg
        pytest.fail(f"no {method} in {timeout_s} s")

    def console_errors(self) -> list[str]:
        out = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                out.append(json.dumps(p.get("exceptionDetails", {}))[:300])
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(json.dumps(p.get("args", []))[:300])
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(p["entry"].get("text", "")[:300])
        return out


async def _open(port: int, proc: Proc) -> str:
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            if not proc.alive():
                pytest.fail(f"chromium exited with {proc.p.returncode}:\n{proc.tail()}")
            try:
                async with s.get(f"http://127.0.0.1:{port}/json/list", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    pages = [t for t in await r.json() if t.get("type") == "page"]
                    if pages:
                        return pages[0]["webSocketDebuggerUrl"]
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(0.2)
    pytest.fail(f"chromium's DevTools endpoint did not answer:\n{proc.tail()}")


async def _inspect(chromium: Path, html: Path, tmp: Path, name: str) -> tuple[dict, list[str]]:
    port = free_port()
    proc = Proc("chromium", [str(chromium), *FLAGS, f"--user-data-dir={tmp / ('profile-' + name)}", f"--remote-debugging-port={port}",
                             f"--window-size={SCREEN['width']},{SCREEN['height']}", "about:blank"], tmp / f"chromium-{name}.log")
    try:
        ws_url = await _open(port, proc)
        async with aiohttp.ClientSession() as s, s.ws_connect(ws_url, max_msg_size=0) as ws:
            page = Page(ws)
            for domain in ("Page", "Runtime", "Log"):
                await page.call(f"{domain}.enable")
            await page.call("Emulation.setDeviceMetricsOverride", deviceScaleFactor=1, mobile=False, **SCREEN)
            await page.call("Page.navigate", url=html.resolve().as_uri())
            await page.wait_event("Page.loadEventFired")
            res = (await page.call("Runtime.evaluate", expression=CHECK, returnByValue=True))["result"]["value"]
            shot = await page.call("Page.captureScreenshot", format="png")
            (artifacts() / f"report-{name}-first-screen.png").write_bytes(base64.b64decode(shot["data"]))
            full = await page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
            (artifacts() / f"report-{name}-full.png").write_bytes(base64.b64decode(full["data"]))
            await asyncio.sleep(0.3)  # late console messages
            await page.call("Runtime.evaluate", expression="0")
            return res, page.console_errors()
    finally:
        proc.stop(10)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return make_runs(tmp_path_factory.mktemp("runs"))


@pytest.mark.parametrize("name", ["demo", "cascades", "blocks"])
def test_report_renders_in_chromium_and_answers_on_the_first_screen(runs, name, tmp_path, chromium_bin):
    html = runs[name].out_dir / "report.html"
    res, errors = asyncio.run(_inspect(chromium_bin, html, tmp_path, name))
    assert errors == [], errors
    assert res["images"] == len(runs[name].report.figures) and res["broken"] == [], res
    assert res["narrow"] == [], f"plots narrower than the page: {res['narrow']}"
    assert res["firstSection"] == "headline" and res["metadataOpen"] is False
    # the first screen: which part costs most, by how much, and the bar that shows it, without scrolling
    costs = next(p for p in res["lead"] if p["text"].startswith("Costs most:"))
    assert costs["bottom"] <= res["innerHeight"], res
    assert res["bar"] is not None and res["bar"]["bottom"] <= res["innerHeight"], res
    assert (artifacts() / f"report-{name}-first-screen.png").stat().st_size > 10_000
