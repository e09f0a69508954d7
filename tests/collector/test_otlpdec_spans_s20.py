"""The C decoder makes each CompactSpan without running ``CompactSpan.__init__`` in Python (collector/_otlpdec.c,
``span_new``) only after ``configure()`` checked, by calling the class once, that ``__init__`` does exactly that: the
four arguments into the first four slots, None into the three caches, nothing else. These spans must hold in every
slot what the reference's hold, and a class whose ``__init__`` does anything else is called for every span."""

from __future__ import annotations

import gc
import sys
from contextlib import contextmanager

import pytest

from deltatap.collector import compact

from otlpfactory import default_stack, request

pytestmark = pytest.mark.skipif(compact._acc is None, reason="the C decoder is not built or DELTATAP_NATIVE turns it off: the reference runs")

SLOTS = compact.CompactSpan.__slots__


def _data() -> bytes:
    pb = []
    for i in range(3):
        pb += default_stack(1_700_000_000_000_000_000 + i * 10**7, rid=f"req-{i}", fp=f"fp-{i}")[0]
    return request(pb).SerializeToString()


@contextmanager
def _configured(cls):
    c = compact
    args = (c._C_KPLANS, c._C_RES, c._C_PLANS, c._VALUES, c._c_key_plan, c._c_resource, c._c_span_plan, c._value,
            c._SHAPE_INT, c._SHAPE_DOUBLE, c._SHAPE_BOOL, c._OTHER, "", "q", "d", "?", c.OtlpDecodeError, c._CACHE_MAX, 4096, c._CACHE_MAX)
    c._acc.configure(cls, *args)
    c._acc.reset()
    try:
        yield
    finally:
        c._acc.configure(c.CompactSpan, *args)
        c._acc.reset()


def test_spans_made_in_c_hold_what_the_reference_spans_hold_in_every_slot():
    compact.decode_compact(b"")  # (configured at import)
    assert compact._acc.direct()
    data = _data()
    got, want = compact._acc.decode(data), compact.decode_compact_reference(data)
    assert got is not None and len(got) == len(want) > 4
    for g, w in zip(got, want, strict=True):
        assert type(g) is compact.CompactSpan and gc.is_tracked(g)
        assert [getattr(g, k) for k in SLOTS] == [getattr(w, k) for k in SLOTS]
        assert g.attrs == w.attrs and g.events == w.events  # (the caches fill as the reference's do)
    cls = compact.CompactSpan
    refs = sys.getrefcount(cls)
    more = compact._acc.decode(data)
    held = sys.getrefcount(cls) - refs  # (counted outside the assert: pytest's rewriting holds what it shows)
    n = len(more)
    del more
    after = sys.getrefcount(cls) - refs
    assert (held, after) == (n, 0)  # each span holds its class once, and lets go of it


class _Counted(compact.CompactSpan):
    """A subclass whose __init__ does more: spans must be made by calling it."""

    __slots__ = ()
    made = 0

    def __init__(self, *a) -> None:
        super().__init__(*a)
        type(self).made += 1


class _Other:
    __slots__ = SLOTS

    def __init__(self, trace_id, layout, packed, others) -> None:
        self.trace_id, self.layout, self.packed, self.others = trace_id, layout, packed, others
        self._attrs, self._events, self._times = None, None, "unpacked"  # not what span_new does


@pytest.mark.parametrize("cls", [_Counted, _Other])
def test_a_class_whose_init_does_anything_else_is_called_for_every_span(cls):
    data = _data()
    with _configured(cls):
        assert not compact._acc.direct()
        before = getattr(cls, "made", 0)
        got = compact._acc.decode(data)
        assert got is not None and all(type(s) is cls for s in got)
        if cls is _Counted:
            assert cls.made - before == len(got)
        else:
            assert all(s._times == "unpacked" for s in got)
    assert compact._acc.direct()
