"""Fixtures of the real-stack tests (marker ``realstack``; ``.ci/realstack`` installs the parts and runs them).

A test whose parts are not installed is SKIPPED with the reason (and any install problem
``.ci/realstack`` met) in the skip message, never passed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from realstack_support import Running, Tools, start_stack, stop_stack

pytestmark = pytest.mark.realstack


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.realstack)


@pytest.fixture(scope="session")
def tools() -> Tools:
    return Tools.discover()


@pytest.fixture(scope="module")
def envoy_litellm() -> Iterator[Running]:
    r = start_stack("configs/realstack-envoy-litellm.yaml", "envoy-litellm")
    yield r
    stop_stack(r)
