"""The client's view of one SSE response: the tap's :class:`~deltatap.core.sse.StreamObserver` plus what the load
generator records and the tap does not.

Framing, format detection, the first-content-token rule (methodology 5.1.3.1), token, malformed-event and
usage/timings accounting are the core's (:class:`~deltatap.core.sse.ContentStream`), the same code the tap and the
reference firewall run; with the ``deltatap.core._content`` accelerator, each read is one C call
(``SseParser.observe``), as in the tap. On top, fed ``(bytes, t_mono_ns, bound_ns)`` slices stamped at the socket,
it keeps the stamp of *every* content event (``event_times``) and the response body as read (the slices
themselves, no copy). The content text (``text``, for reference-token counting and chat history; never written
out) is taken from that body when something asks for it: the kept body is parsed once more by a
``ContentStream(keep_text=True)`` with the same format and path, which gives the same events, in the same order, as
the reads did (the parser's result does not depend on how the bytes were split), so the same texts — without a
Python step per event while the responses are read. ``keep_text=True`` keeps the text as it is read instead (every
event through ``take``, as the Python reference does; no body kept): what the runner asks for once the bodies kept by
its records pass its limit.
"""

from __future__ import annotations

from deltatap.core.sse import ContentStream, StreamObserver


class ClientStream(StreamObserver):
    __slots__ = ("event_times", "body", "_given", "_finished")

    def __init__(self, path: str | None = None, format: str | None = None, keep_text: bool = False) -> None:
        super().__init__(format, path)
        self.event_times: list[int] = []  # one stamp per content event
        # the payload slices as read (the text is taken from them on demand); None with keep_text: the text of each
        # content event is kept as it is read instead (ContentStream's parts: every event through take, in Python)
        self.body: list[bytes] | None = None if keep_text else []
        if keep_text:
            self.parts = []
        self._given = (format, path)
        self._finished = False

    def feed(self, data: bytes | bytearray | memoryview, t_mono_ns: int, bound_ns: int = 0) -> int:
        body = self.body
        if body is not None:
            body.append(data if type(data) is bytes else bytes(data))  # (a caller's buffer may be reused)
        n = StreamObserver.feed(self, data, t_mono_ns, bound_ns)
        if n == 1:  # the usual read: one token
            self.event_times.append(t_mono_ns)
        elif n:
            self.event_times.extend([t_mono_ns] * n)
        return n

    def finish(self, t_mono_ns: int, bound_ns: int = 0) -> int:
        self._finished = True
        n = StreamObserver.finish(self, t_mono_ns, bound_ns)
        if n:
            self.event_times.extend([t_mono_ns] * n)
        return n

    @property
    def text(self) -> str:
        """The content text read so far: every content event's text, in order (from the kept body, parsed again at
        each call: :meth:`output` is what a record keeps)."""
        out = self.output()
        return out if type(out) is str else body_text(*out)

    def output(self) -> str | tuple[bytes, str | None, str | None, bool]:
        """The text, or what it is taken from, compact (the body joined): ``body_text(*output)``."""
        if self.body is None:
            return "".join(self.parts or ())
        return b"".join(self.body), *self._given, self._finished

    @property
    def leading_whitespace(self) -> int:
        """Whitespace-only content events before the first token (the record's ``leading_whitespace_events``)."""
        return self.leading_whitespace_events

    @property
    def last_bound_ns(self) -> int:
        """How much earlier the last content event's bytes may have arrived than its stamp."""
        return self.last_token_bound_ns


def body_text(body: bytes, format: str | None = None, path: str | None = None, finished: bool = True) -> str:
    """The content text of an event-stream body: what ``ContentStream(format, path, keep_text=True)`` keeps, fed
    the same bytes (and finished, when the stream was)."""
    ref = ContentStream(format, path, keep_text=True)
    ref.feed(body, 0)
    if finished:
        ref.finish(0)
    return ref.text
