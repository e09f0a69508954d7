"""Session 24 (tail): deltatap/core/_content.c reads and writes the observer's attributes through deltatap.net._pktring's
slot access once that module is loaded, else through the generic attribute calls; which one a process uses depends on
what it imported first, so both are held here to the Python observer (``_content.slot_access`` picks one), on the
generated streams of tests/kernel/test_content_native.py."""

from __future__ import annotations

import random

import pytest

from deltatap.core import sse

from test_content_native import FORMATS, native, run_both, sse_stream


@native
@pytest.mark.parametrize("slots", [True, False], ids=["slot-access", "generic"])
def test_the_observer_s_state_after_each_read_is_the_python_s_either_way(slots):
    pytest.importorskip("deltatap.net._pktring")  # (not built: the generic calls only)
    acc = sse._observe_acc
    try:
        assert acc.slot_access(slots) is slots  # (on: _pktring is loaded, its slot access taken)
        rng = random.Random(2024 + slots)
        for _ in range(400):
            data = sse_stream(rng)
            points = [rng.randint(0, 1 << 14) for _ in range(rng.randint(0, 10))]
            fmt = rng.choice(FORMATS)
            steps = [rng.choice([0, 1, 1000, 250_000]) for _ in range(rng.randint(1, 4))]
            fwd = [rng.random() < 0.5 for _ in range(rng.randint(0, 4))]
            run_both(data, points, fmt[0], fmt[1], steps, fwd, rng.random() < 0.4)
    finally:
        acc.slot_access(True)
