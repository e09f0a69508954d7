"""Span kinds: one module per kind of span the collector reads, each a declarative description
(:class:`~deltatap.collector.kinds.model.SpanKind`), compiled once per span layout by
:mod:`deltatap.collector.kinds.compile`.

The registry (:func:`registered`) is ordered: a span is of the first kind that matches it. Add a kind with
:func:`register` (before any :class:`~deltatap.collector.decompose.Decomposer` is made: each takes the registry
as it is when made); the live decoder keeps every attribute a registered kind reads (:func:`attrs_read`), and the
new kind's spans take the compiled path like the built-in ones. See docs/collector.md, "Adding a span kind".
"""

from __future__ import annotations

from deltatap.collector.kinds import client, component, envoy, litellm, tap, vllm
from deltatap.collector.kinds.model import SpanKind
from deltatap.core.vocab import Attr

_KINDS: list[SpanKind] = [tap.KIND, client.KIND, component.KIND, litellm.KIND, vllm.KIND, envoy.KIND]
# read outside the kinds: the joiner (request id, fingerprint, link) and provenance.json (collector.outputs.note_senders)
_ALSO_READ = frozenset({Attr.REQUEST_ID, Attr.BODY_FINGERPRINT, Attr.LINK, "service.name", "service.version", Attr.GENAI_REQUEST_MODEL})
_state = {"version": 0, "attrs": frozenset[str]()}


def registered() -> tuple[SpanKind, ...]:
    return tuple(_KINDS)


def register(kind: SpanKind, before: str | None = None) -> None:
    """Add ``kind`` at the end of the registry, or before the kind named ``before``; a kind of the same name is replaced."""
    if not isinstance(kind, SpanKind):
        raise TypeError(f"register() takes a SpanKind, not {type(kind).__name__}")
    names = [k.name for k in _KINDS]
    if kind.name in names:
        _KINDS[names.index(kind.name)] = kind
    elif before is not None:
        if before not in names:
            raise ValueError(f"no span kind named {before!r}; registered: {names}")
        _KINDS.insert(names.index(before), kind)
    else:
        _KINDS.append(kind)
    _state["version"] += 1


def unregister(name: str) -> None:
    _KINDS[:] = [k for k in _KINDS if k.name != name]
    _state["version"] += 1


def version() -> int:
    """Changes whenever the registry does (the live decoder's attribute caches follow it)."""
    return _state["version"]


def attrs_read() -> frozenset[str]:
    """Every attribute the registered kinds, the joiner and provenance read (besides ``deltatap.label.*``)."""
    if _state.get("attrs_version") != _state["version"]:
        out = set(_ALSO_READ)
        for k in _KINDS:
            out |= k.attributes()
        _state["attrs"], _state["attrs_version"] = frozenset(out - {Attr.LABEL_PREFIX}), _state["version"]
    return _state["attrs"]  # type: ignore[return-value]
