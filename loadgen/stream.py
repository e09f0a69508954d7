"""The client's view of one SSE response: the tap's :class:`~deltatap.core.sse.StreamObserver` plus what the load
generator records and the tap does not.

Framing, format detection, the first-content-token rule (methodology 5.1.3.1), token, malformed-event and
usage/timings accounting are the core's (:class:`~deltatap.core.sse.ContentStream`), the same code the tap and the
reference firewall run; with the ``deltatap.core._content`` accelerator each read is one C call
(``SseParser.observe``), as in the tap, the content text included. On top, fed ``(bytes, t_mono_ns, bound_ns)``
slices stamped at the socket, it keeps the stamp of *every* content event (``event_times``) and the content text
(``text``: each content event's, in order, for reference-token counting and chat history; never written out).
"""

from __future__ import annotations

from deltatap.core.sse import StreamObserver
from deltatap.core.sse import _ObservingParser  # (the C observer's class: feed() calls it directly, as StreamObserver.feed does)


class ClientStream(StreamObserver):
    __slots__ = ("event_times",)

    def __init__(self, path: str | None = None, format: str | None = None) -> None:
        super().__init__(format, path)
        self.event_times: list[int] = []  # one stamp per content event
        self.parts = []  # keep_text: each content event's text (the C observer appends it too)

    def feed(self, data: bytes | bytearray | memoryview, t_mono_ns: int, bound_ns: int = 0) -> int:
        p = self.parser
        if self._native and type(p) is _ObservingParser:  # (StreamObserver.feed's own first step, one call less per read)
            n = p.observe(self, data, t_mono_ns, bound_ns)
        else:
            n = StreamObserver.feed(self, data, t_mono_ns, bound_ns)
        if n == 1:  # the usual read: one token
            self.event_times.append(t_mono_ns)
        elif n:
            self.event_times.extend([t_mono_ns] * n)
        return n

    def finish(self, t_mono_ns: int, bound_ns: int = 0) -> int:
        n = StreamObserver.finish(self, t_mono_ns, bound_ns)
        if n:
            self.event_times.extend([t_mono_ns] * n)
        return n

    @property
    def leading_whitespace(self) -> int:
        """Whitespace-only content events before the first token (the record's ``leading_whitespace_events``)."""
        return self.leading_whitespace_events

    @property
    def last_bound_ns(self) -> int:
        """How much earlier the last content event's bytes may have arrived than its stamp."""
        return self.last_token_bound_ns
