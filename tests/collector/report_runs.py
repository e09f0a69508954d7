"""Runs of the reference stack for the report tests, made the way a user makes them (``deltatap demo``'s
``run_demo`` with the packaged demo config, its load phases cut down): the demo itself (a labelled
firewall mix with blocks, then a timeout cascade), a run of cascades only, and a run heavy in blocks.
Each writes its run directory (rows, records, run.json, every report format) and returns it."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import yaml
from rich.console import Console

from deltatap.app.demo import DEFAULT_CONFIG, run_demo
from deltatap.core.config import find_config


def _config(tmp: Path, name: str, load: dict) -> Path:
    cfg = yaml.safe_load(find_config(DEFAULT_CONFIG).read_text(encoding="utf-8"))
    cfg["load"] = load
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


def _phases(packaged: dict) -> dict[str, dict]:
    return {
        # a small copy of the demo's own phases: a labelled firewall mix (some blocked), then the cascade
        "demo": {"mix": {**packaged["mix"], "requests": 24}, "cascade": packaged["cascade"]},
        "cascades": {"cascade": {**packaged["cascade"], "requests": 4, "concurrency": 4}},
        "blocks": {"mix": {**packaged["mix"], "requests": 20, "rate": 20.0, "seed": 3,
                           "workload": {**packaged["mix"]["workload"], "params": {**packaged["mix"]["workload"]["params"],
                                                                                  "mix": {"benign": 0.3, "adversarial": 0.5, "trigger": 0.2}}}}},
    }


def make_runs(tmp: Path, names: tuple[str, ...] = ("demo", "cascades", "blocks")) -> dict[str, object]:
    """name -> DemoResult (``out_dir``, ``rows``, ``report`` ...), each run in ``tmp/<name>``. The runs go at the same
    time, each its own stack on its own ports: a run mostly waits (rates, timeouts, the collector's grace), and what
    these tests read (which requests were blocked or cut, the reports' layout and colours) does not depend on load."""
    packaged = yaml.safe_load(find_config(DEFAULT_CONFIG).read_text(encoding="utf-8"))["load"]
    cfgs = {name: _config(tmp, name, _phases(packaged)[name]) for name in names}

    async def all_runs() -> list:
        return await asyncio.gather(*(run_demo(tmp / name, cfgs[name], console=Console(file=io.StringIO(), width=100)) for name in names))

    return dict(zip(names, asyncio.run(asyncio.wait_for(all_runs(), 180)), strict=True))
