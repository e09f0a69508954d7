"""Fixtures of the real-stack tests (marker ``realstack``; ``.ci/realstack`` installs the parts and runs them).

A test whose parts are not installed is SKIPPED with the reason (and any install problem
``.ci/realstack`` met) in the skip message, never passed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from realstack_support import ROOT, CollectorThread, RealStack, Tools, load_topology, missing_tools, with_free_ports

pytestmark = pytest.mark.realstack

RUNS = ROOT / "runs" / "realstack-tests"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.realstack)


@dataclass
class Running:
    stack: RealStack
    collector: CollectorThread | None
    run_dir: Path


def require(config: str) -> None:
    """Skip loudly when a part of ``config`` is not installed."""
    missing = missing_tools(load_topology(ROOT / config))
    if missing:
        problems = os.environ.get("DELTATAP_REALSTACK_INSTALL_PROBLEMS", "")
        pytest.skip(f"REALSTACK PARTS NOT INSTALLED (run .ci/realstack): {'; '.join(missing)}"
                    + (f" | install problems: {problems}" if problems else ""))


def start_stack(config: str, name: str, *, taps: bool = True, collector: bool = True) -> Running:
    require(config)
    topo = with_free_ports(load_topology(ROOT / config))
    run_dir = RUNS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    col = CollectorThread(topo, run_dir / "collector") if collector else None
    stack = RealStack(topo, ROOT / config, run_dir, taps=taps, otlp_grpc=col.grpc_hostport if col else None)
    try:
        stack.start()
    except BaseException:
        if col:
            col.close()
        raise
    return Running(stack, col, run_dir)


def stop_stack(r: Running) -> None:
    r.stack.stop()
    if r.collector:
        r.collector.close()


@pytest.fixture(scope="session")
def tools() -> Tools:
    return Tools.discover()


@pytest.fixture(scope="module")
def envoy_litellm() -> Iterator[Running]:
    r = start_stack("configs/realstack-envoy-litellm.yaml", "envoy-litellm")
    yield r
    stop_stack(r)
