"""Fixtures of the real-stack tests (each module is marked ``realstack``; ``.ci/realstack`` installs the parts
and runs them; test_launcher_unit.py is not marked and runs in the fast suite).

A test whose parts are not installed is SKIPPED with the reason (and any install problem
``.ci/realstack`` met) in the skip message, never passed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from realstack_support import Running, Tools, start_stack, stop_stack


@pytest.fixture(scope="session")
def tools() -> Tools:
    return Tools.discover()


@pytest.fixture(scope="module")
def envoy_litellm() -> Iterator[Running]:
    r = start_stack("configs/realstack-envoy-litellm.yaml", "envoy-litellm")
    yield r
    stop_stack(r)
