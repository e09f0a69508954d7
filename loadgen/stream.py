"""The client's view of one SSE response, on top of :mod:`deltatap.core.sse` (its parser and format registry).

Fed ``(bytes, t_mono_ns)`` slices stamped at the socket, it keeps what the load generator records and
the tap's :class:`~deltatap.sse.StreamObserver` does not: the stamp of *every* content event, the
content text (for reference-token counting and chat history; never written out), and a count of
malformed events. The first content token follows the same rule as the taps (methodology 5.1.3.1):
the first content event whose text is not whitespace-only.
"""

from __future__ import annotations

import json

from deltatap.core.sse import FORMATS, SseEvent, SseParser, StreamFacts, StreamFormat, detect_format, format_for_path


class ClientStream:
    __slots__ = (
        "parser", "facts", "format", "_fmt", "_hint", "event_times", "parts", "first_token_mono_ns",
        "leading_whitespace", "events", "malformed", "done", "chunks", "first_token_bound_ns", "last_bound_ns", "_bound",
    )

    def __init__(self, path: str | None = None, format: str | None = None) -> None:
        self.parser = SseParser()
        self.facts = StreamFacts()
        self._fmt: StreamFormat | None = FORMATS[format] if format else None
        self.format = format
        self._hint = format_for_path(path)
        self.event_times: list[int] = []  # one stamp per content event
        self.parts: list[str] = []
        self.first_token_mono_ns: int | None = None
        self.first_token_bound_ns = 0  # its bytes arrived at most this much before first_token_mono_ns
        self.last_bound_ns = 0  # the same for the last content event
        self._bound = 0
        self.leading_whitespace = 0
        self.events = 0
        self.malformed = 0
        self.done = False
        self.chunks = 0

    def feed(self, data: bytes, t_mono_ns: int, bound_ns: int = 0) -> None:
        self.chunks += 1
        self._bound = bound_ns
        for ev in self.parser.feed(data):
            self._event(ev, t_mono_ns)

    def finish(self, t_mono_ns: int, bound_ns: int = 0) -> None:
        self._bound = bound_ns
        for ev in self.parser.finish():
            self._event(ev, t_mono_ns)

    @property
    def truncated(self) -> bool:
        return self.parser.truncated

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def _event(self, ev: SseEvent, t: int) -> None:
        self.events += 1
        data = ev.data
        if data == "[DONE]":
            self.done = True
            return
        if not data:
            return
        try:
            obj = json.loads(data)
        except ValueError:
            self.malformed += 1
            return
        if self._fmt is None:
            name = detect_format(obj, ev.event, self._hint)
            if name is None:
                self.malformed += 1
                return
            self._fmt = FORMATS[name]
            self.format = name
        text, _tokens, done = self._fmt.extract(obj, ev.event, self.facts)
        if done:
            self.done = True
        if not text:
            return
        self.event_times.append(t)
        self.last_bound_ns = self._bound
        self.parts.append(text)
        if self.first_token_mono_ns is None:
            if text.isspace():
                self.leading_whitespace += 1
            else:
                self.first_token_mono_ns = t
                self.first_token_bound_ns = self._bound
