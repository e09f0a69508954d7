"""Sans-I/O Server-Sent-Events parsing and LLM stream observation: one definition for the tap, load generator, firewall.

Nothing here touches a socket or a clock: callers feed ``(bytes, t_mono_ns)`` pairs they stamped
themselves (before any await) and read the results. The bytes are only *read*: a tap forwards the
original chunk untouched and feeds the same object here afterwards.

Public API
----------

``SseParser``
    Incremental WHATWG event-stream parser. ``feed(data: bytes) -> list[SseEvent]`` accepts any
    split of the stream (events split across reads, many events per read); line endings ``\\n``,
    ``\\r\\n`` and ``\\r`` (also a ``\\r\\n`` split across two reads); ``:comment`` lines are
    counted (``comments``) and otherwise ignored; a leading BOM is dropped. ``finish()`` is called
    at end of stream: it dispatches an event whose lines are complete but whose blank line never
    came (servers and captures often end with ``data: [DONE]\\n``; the standard would discard it)
    and sets ``truncated`` when a partial line was left over.

``SseEvent(data, event, id, retry)``
    One dispatched event; ``event`` is ``""`` for the default ``message`` type.

``StreamFormat`` registry — :data:`FORMATS`, :func:`register_format`, :func:`get_format`,
:func:`format_for_path`, :func:`detect_format` (defined in :mod:`deltatap.core.stream_formats`, re-exported here)
    One small class per wire format, registered by name (the names of ``Attr.STREAM_FORMAT``):
    ``openai-chat`` (``/v1/chat/completions``, including llama.cpp's, which adds ``timings``),
    ``openai-completions`` (``/v1/completions``), ``responses`` (the Responses API event
    stream), ``anthropic`` (Messages streams) and ``llamacpp`` (llama.cpp's native
    ``/completion``). Each has ``detect(obj, event_name) -> bool`` and
    ``extract(obj, event_name, facts) -> (text, tokens, done)``: the content text an event
    carries (``""`` when it carries none), how many tokens it stands for, and whether it ends
    the stream; it records usage, engine timings, model, ids and finish reasons into ``facts``.

``ContentStream(format=None, path=None, keep_text=False)``
    What one response carries, and the one place that classifies its events: ``feed(chunk, t_mono_ns,
    bound_ns=0) -> int`` (content events completed by this chunk), ``finish(t_mono_ns, bound_ns=0)``, and
    ``take(event, t_mono_ns, bound_ns=0) -> (text, tokens, done)`` for each event (a subclass that keeps events
    extends it). It detects the format from the first JSON event when not given (``path`` is a hint tried first),
    counts events, content events, tokens and ``malformed`` events (data that is not JSON, or JSON no format
    recognises), applies the first-content-token rule below (``first_token_mono_ns``, ``last_token_mono_ns`` and
    their bounds, ``leading_whitespace_events``), sees the end (``done``) and fills the :class:`StreamFacts`
    (usage, llama.cpp ``timings``, model, response id, finish reasons, in-stream errors). The tap, the load
    generator (``deltatap.loadgen.stream.ClientStream``: every content event's stamp, the text) and the reference
    firewall (``OutboundStream``: events held per inspection window) are this class plus what they keep on top.

``StreamObserver(format=None, path=None)``
    The tap's :class:`ContentStream`: ``feed`` also counts chunks and bytes and keeps the inter-token gap
    statistics (:class:`GapStats`); ``forwarded(t_mono_ns)`` is called once the bytes fed since the previous
    ``forwarded`` call were written on (a tap's downstream side), which gives the first and last token's
    forwarded stamps and the forwarded gaps.

``GapStats`` (defined in :mod:`deltatap.core.gap_stats`, re-exported here)
    Streaming gap statistics: ``count``, ``mean_ns``, ``max_ns`` and ``p99_ns()`` from a bounded
    structure (the 128 largest gaps kept exactly — so p99 is exact below 12,800 gaps — plus a
    log-bucket sketch with 1 % relative error beyond that). ``observe(t_ns)`` adds the gap since
    the previous call; ``add(gap_ns)`` adds a gap directly.

First content token (methodology section 5.1.3.1)
-------------------------------------------------
An event carries content when the format's ``extract`` returns non-empty text: assistant text,
reasoning/thinking text, refusal text, or tool-call argument fragments. Role-only deltas, empty
deltas, ``content: null``, usage-only and finish-only events, comments, ``[DONE]``, pings and any
other framing carry none. The *first content token* is the first content event whose text is not
whitespace-only (the draft excludes "empty tokens or whitespace-only tokens"); whitespace-only
content events still count as content events and tokens and still produce gaps.
``ContentStream.leading_whitespace_events`` counts those that came before the first token, so a
report can note them as the draft asks. ``ContentStream.count`` (called by ``take`` for each event) is the definition of
this rule; its one twin is the C accelerator of :meth:`StreamObserver.feed` (``deltatap/core/_content.c``, for the
ordinary events it handles itself), which tests/kernel/test_content_native.py holds to it.

Privacy: text is only inspected for its length and whether it is blank; nothing stores it, except a
``ContentStream(keep_text=True)`` (the load generator's, in memory, never written out).
"""

from __future__ import annotations

import heapq
import json
import re
from dataclasses import dataclass

from deltatap.core import native
from deltatap.core.gap_stats import _LOG_GAMMA, GapStats
from deltatap.core.stream_formats import (
    _NONE,
    FORMATS,
    TIMING_KEYS,
    Extracted,
    StreamFacts,
    StreamFormat,
    detect_format,
    format_for_path,
    get_format,
    register_format,
)

__all__ = [
    "FORMATS",
    "TIMING_KEYS",
    "ContentStream",
    "Extracted",
    "GapStats",
    "SseEvent",
    "SseParser",
    "StreamFacts",
    "StreamFormat",
    "StreamObserver",
    "detect_format",
    "format_for_path",
    "get_format",
    "itl_per_request_ns",
    "register_format",
]

# --------------------------------------------------------------------------------------------
# The event-stream parser
# --------------------------------------------------------------------------------------------

_LINE_END = re.compile(rb"\r\n|\r|\n")
_JSON = json.JSONDecoder()
_scan_json = _JSON.scan_once  # the C scanner json's decode calls, without decode's two whitespace regex matches


def _decode_json(text: str) -> object:
    """``json.loads(text)``: the C scanner alone when the value fills ``text`` exactly (an event's data almost always
    does); anything else (surrounding whitespace, extra data, not JSON) goes through the whole decoder, so the result
    and the errors are json's own."""
    try:
        obj, end = _scan_json(text, 0)
    except StopIteration:
        return _JSON.decode(text)
    if end != len(text):
        return _JSON.decode(text)
    return obj
_BOM = b"\xef\xbb\xbf"


@dataclass(slots=True)
class SseEvent:
    data: str
    event: str = ""
    id: str | None = None
    retry: int | None = None


class SseParser:
    """Incremental event-stream parser (WHATWG HTML "server-sent events", section 9.2.6)."""

    __slots__ = ("_buf", "_skip_lf", "_started", "_data", "_event", "_id", "_retry", "_has_data", "comments", "events", "truncated")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._skip_lf = False  # the previous read ended in "\r": a leading "\n" belongs to it
        self._started = False
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        self._retry: int | None = None
        self._has_data = False
        self.comments = 0
        self.events = 0
        self.truncated = False

    def feed(self, data: bytes | bytearray | memoryview) -> list[SseEvent]:
        if not data:
            return []
        buf = self._buf
        if not buf and self._started and not self._skip_lf:
            raw = data if isinstance(data, bytes) else bytes(data)
            if b"\r" not in raw:
                return self._feed_lf(raw)
        buf += data
        if not self._started:
            if len(buf) < 3 and _BOM.startswith(bytes(buf)):
                return []
            if buf.startswith(_BOM):
                del buf[:3]
            self._started = True
        if self._skip_lf and buf[:1] == b"\n":
            del buf[:1]
        self._skip_lf = False
        out: list[SseEvent] = []
        pos = 0
        n = len(buf)
        while pos < n:
            m = _LINE_END.search(buf, pos)
            if m is None:
                break
            end = m.start()
            if end + 1 == n and buf[end] == 0x0D:  # a lone "\r" at the end: maybe half of "\r\n" (not a whole "\r\n")
                self._skip_lf = True
            self._line(bytes(buf[pos:end]), out)
            pos = m.end()
        if pos:
            del buf[:pos]
        return out

    def _feed_lf(self, data: bytes) -> list[SseEvent]:
        """Fast path: nothing buffered and no ``\\r`` in ``data`` (the usual case): split on ``\\n``."""
        lines = data.split(b"\n")
        rest = lines.pop()  # bytes after the last "\n": a partial line (or b"")
        out: list[SseEvent] = []
        line = self._line
        for raw in lines:
            line(raw, out)
        if rest:
            self._buf += rest
        return out

    def finish(self) -> list[SseEvent]:
        """End of stream: dispatch a complete-but-unterminated event; flag a partial line as truncated."""
        self.truncated = bool(self._buf)
        self._buf.clear()
        out: list[SseEvent] = []
        self._line(b"", out)
        return out

    def _reset(self) -> None:
        self._data = []
        self._event = ""
        self._has_data = False
        self._retry = None

    def _line(self, raw: bytes, out: list[SseEvent]) -> None:
        if not raw:
            if self._has_data:
                self.events += 1
                out.append(SseEvent("\n".join(self._data), self._event, self._id, self._retry))
            self._reset()
            return
        if raw[:6] == b"data: ":  # the usual line, spelled out
            self._data.append(raw[6:].decode("utf-8", "replace"))
            self._has_data = True
            return
        if raw[0] == 0x3A:  # ":" comment
            self.comments += 1
            return
        line = raw.decode("utf-8", "replace")
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._has_data = True
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._id = value
        elif name == "retry":
            if value.isascii() and value.isdigit() and len(value) <= 18:  # ASCII digits (WHATWG); a longer one is no delay
                self._retry = int(value)


_PySseParser = SseParser  # the reference (the differential test compares the accelerator with it)
_acc = native.load("deltatap.core._sse", __name__)
if _acc is not None:
    _acc.setup(SseEvent)
    SseParser = _acc.SseParser  # type: ignore[misc,assignment]  # the same parser in C: one call per read
# the same parser again with StreamObserver.feed in one C call per read (SseParser.observe; see _content.c)
_observe_acc = native.load("deltatap.core._content", __name__)
if _observe_acc is not None:
    _observe_acc.setup(SseEvent)
    _observe_acc.setup_observer(FORMATS["openai-chat"], FORMATS["openai-completions"], heapq.heappush, heapq.heapreplace, _LOG_GAMMA)
    SseParser = _observe_acc.SseParser  # type: ignore[misc,assignment]
    _ObservingParser = _observe_acc.SseParser
    _gaps_observe = _observe_acc.gaps_observe  # what n calls of GapStats.observe(t) do, in one

    class _GapCore(_observe_acc.GapCore):  # type: ignore[misc,name-defined]
        """GapStats's state, observe and add in C (the C observer updates it without a Python step), and mean_ns
        (GapStats.mean_ns's division, a C getter); what else reads it is GapStats's own code."""

        __slots__ = ()
        quantile_ns = GapStats.quantile_ns
        p99_ns = GapStats.p99_ns
else:
    _ObservingParser = _gaps_observe = _GapCore = None  # type: ignore[assignment,misc]


# --------------------------------------------------------------------------------------------
# One response's content: the single place of format detection and the first-content-token rule
# --------------------------------------------------------------------------------------------

_DONE: Extracted = ("", 0, True)


class ContentStream:
    """What one SSE response carries, fed ``(chunk, t_mono_ns[, bound_ns])``: its events, their content, the first
    content token, usage and timings. The tap (:class:`StreamObserver`), the load generator
    (``deltatap.loadgen.stream.ClientStream``) and the reference firewall (``OutboundStream``) are this class plus
    what each records on top; none of them classifies an event itself.

    Every event goes through :meth:`take`: ``[DONE]`` ends the stream; an empty ``data`` is framing; anything else is
    decoded as JSON, the format is detected from the first event that decodes (``format`` given, or ``path`` as a
    hint tried first), and the format's ``extract`` gives its content text and token count. An event that does not
    decode, or that no format recognises before one was detected, counts in ``malformed``. ``keep_text`` keeps the
    content text of each content event in ``parts`` (the load generator's, for token counting and chat history);
    otherwise no text is kept."""

    __slots__ = (
        "parser", "facts", "format", "_fmt", "_hint", "events", "content_events", "tokens", "malformed",
        "leading_whitespace_events", "done", "first_token_mono_ns", "first_token_bound_ns", "last_token_mono_ns",
        "last_token_bound_ns", "parts",
    )

    def __init__(self, format: str | None = None, path: str | None = None, *, keep_text: bool = False) -> None:
        self.parser = SseParser()
        self.facts = StreamFacts()
        self.format: str | None = None
        self._fmt: StreamFormat | None = None
        if format is not None:
            self._fmt = get_format(format)
            self.format = format
        self._hint = format_for_path(path)
        self.events = 0
        self.content_events = 0
        self.tokens = 0
        self.malformed = 0
        self.leading_whitespace_events = 0
        self.done = False
        self.first_token_mono_ns: int | None = None
        self.last_token_mono_ns: int | None = None
        # how much earlier the token's bytes may have arrived than its read stamp (0: exact; see deltatap.net.wire)
        self.first_token_bound_ns = 0
        self.last_token_bound_ns = 0
        self.parts: list[str] | None = [] if keep_text else None

    def feed(self, data: bytes | bytearray | memoryview, t_mono_ns: int, bound_ns: int = 0) -> int:
        """Feed one chunk as read at ``t_mono_ns`` (its bytes arrived at most ``bound_ns`` before); returns the
        number of content events it completed."""
        n = 0
        take = self.take
        for ev in self.parser.feed(data):
            if take(ev, t_mono_ns, bound_ns)[0]:
                n += 1
        return n

    def finish(self, t_mono_ns: int, bound_ns: int = 0) -> int:
        """End of stream at ``t_mono_ns``: handles an unterminated last event; returns content events it held."""
        n = 0
        for ev in self.parser.finish():
            if self.take(ev, t_mono_ns, bound_ns)[0]:
                n += 1
        return n

    def take(self, ev: SseEvent, t_mono_ns: int, bound_ns: int = 0) -> Extracted:
        """Classify one event read at ``t_mono_ns`` and account for it: ``(content text, tokens, ends the
        stream)``. Subclasses that keep events (the firewall holds them for inspection) extend this."""
        self.events += 1
        data = ev.data
        if data == "[DONE]":
            self.done = True
            return _DONE
        if not data:
            return _NONE
        try:
            obj = _decode_json(data)
        except (ValueError, RecursionError):  # (not JSON; or nested deeper than json's recursion allows)
            self.malformed += 1
            return _NONE
        fmt = self._fmt
        if fmt is None:
            name = detect_format(obj, ev.event, self._hint)
            if name is None:
                self.malformed += 1
                return _NONE
            fmt = self._fmt = FORMATS[name]
            self.format = name
        return self.count(fmt.extract(obj, ev.event, self.facts), t_mono_ns, bound_ns)

    def count(self, got: Extracted, t_mono_ns: int, bound_ns: int = 0) -> Extracted:
        """Account for one classified unit ``(content text, tokens, ends the stream)`` read at ``t_mono_ns``: the
        first-content-token rule. :meth:`take` calls it for each SSE event; an observer of another framing (the
        gRPC tap's, one unit per message) calls it for each of its units, so the rule stays written once."""
        text, tokens, done = got
        if done:
            self.done = True
        if not text:
            return got
        self.content_events += 1
        self.tokens += tokens
        self.last_token_mono_ns = t_mono_ns
        self.last_token_bound_ns = bound_ns
        if self.parts is not None:
            self.parts.append(text)
        if self.first_token_mono_ns is None:
            if text.isspace():  # methodology 5.1.3.1: whitespace-only tokens are not the first token
                self.leading_whitespace_events += 1
            else:
                self.first_token_mono_ns = t_mono_ns
                self.first_token_bound_ns = bound_ns
        return got

    @property
    def text(self) -> str:
        """The content text so far (``keep_text`` only; ``""`` otherwise)."""
        return "".join(self.parts) if self.parts else ""

    @property
    def comments(self) -> int:
        return self.parser.comments

    @property
    def truncated(self) -> bool:
        return self.parser.truncated


# --------------------------------------------------------------------------------------------
# The per-response observer (the tap's)
# --------------------------------------------------------------------------------------------


class StreamObserver(ContentStream):
    """Everything deltatap records about one SSE response, fed ``(chunk, t_mono_ns)``: the
    :class:`ContentStream` plus chunk and byte counts, the inter-token gaps and the forwarded side.

    With the ``deltatap.core._content`` accelerator, :meth:`feed` is one C call per read
    (``SseParser.observe``): it does what the Python below does, handling itself only the events it is sure of
    (``[DONE]``, empty data, the ``openai-chat`` and ``openai-completions`` chunks engines send: the first one, whose
    format it detects as :meth:`take` would, model and id, integer usage, string finish reasons, content / role-only /
    empty deltas, and with ``parts`` a list each content event's text) and handing every other one to :meth:`take`,
    in order; a subclass that overrides ``take``, ``count`` or ``_events`` gets the Python path."""

    # (slots: the C read path reads and writes these on every read, straight from the slot; an instance dict stays
    # for anything else set on an observer, a subclass's or a test's)
    __slots__ = (
        "chunks", "bytes", "first_chunk_mono_ns", "first_token_forwarded_mono_ns", "last_token_forwarded_mono_ns",
        "first_token_forwarded_bound_ns", "last_token_forwarded_bound_ns", "gaps", "gaps_forwarded", "_unforwarded",
        "_unforwarded_first", "_last_had_first", "__dict__",
    )
    _native = _ObservingParser is not None

    def __init_subclass__(cls, **kw: object) -> None:
        super().__init_subclass__(**kw)
        cls._native = (cls._native and cls.take is ContentStream.take and cls.count is ContentStream.count
                       and cls._events is StreamObserver._events)

    def __init__(self, format: str | None = None, path: str | None = None) -> None:
        super().__init__(format, path)
        self.chunks = 0
        self.bytes = 0
        self.first_chunk_mono_ns: int | None = None
        self.first_token_forwarded_mono_ns: int | None = None
        self.last_token_forwarded_mono_ns: int | None = None
        # how much later the token's bytes may have left than its write stamp (0: exact; see deltatap.net.wire)
        self.first_token_forwarded_bound_ns = 0
        self.last_token_forwarded_bound_ns = 0
        if self._native:
            self.gaps = _GapCore()
            self.gaps_forwarded = _GapCore()
        else:
            self.gaps = GapStats()
            self.gaps_forwarded = GapStats()
        self._unforwarded = 0  # content events fed since the last forwarded() call
        self._unforwarded_first = False
        self._last_had_first = False

    def feed(self, data: bytes | bytearray | memoryview, t_mono_ns: int, bound_ns: int = 0) -> int:
        """Feed one chunk as read at ``t_mono_ns`` (its bytes arrived at most ``bound_ns`` before); returns the
        number of content events it completed."""
        p = self.parser
        if self._native and type(p) is _ObservingParser:
            return p.observe(self, data, t_mono_ns, bound_ns)  # (the same steps, in C)
        self.chunks += 1
        self.bytes += len(data)
        if self.first_chunk_mono_ns is None:
            self.first_chunk_mono_ns = t_mono_ns
        return self._events(self.parser.feed(data), t_mono_ns, bound_ns)

    def finish(self, t_mono_ns: int, bound_ns: int = 0) -> int:
        """End of stream at ``t_mono_ns``: handles an unterminated last event; returns content events it held."""
        events = self.parser.finish()
        if not events and self._native:  # (what _events does with none - the usual end - without its frame)
            self._last_had_first = False
            return 0
        return self._events(events, t_mono_ns, bound_ns)

    def _events(self, events: list[SseEvent], t_mono_ns: int, bound_ns: int) -> int:
        waiting = self.first_token_mono_ns is None
        n_content = 0
        take = self.take
        for ev in events:
            if take(ev, t_mono_ns, bound_ns)[0]:
                n_content += 1
                self.gaps.observe(t_mono_ns)
        had_first = waiting and self.first_token_mono_ns is not None
        self._unforwarded += n_content
        self._unforwarded_first = self._unforwarded_first or had_first
        self._last_had_first = had_first
        return n_content

    @property
    def first_token_in_last_chunk(self) -> bool:
        """Whether the chunk fed last completed the first content token."""
        return self._last_had_first

    @property
    def unforwarded(self) -> tuple[int, bool]:
        """Content events fed since the previous :meth:`forwarded` call, and whether the first token is among them
        (a relay makes that write's stamp exact before it tells :meth:`forwarded`)."""
        return self._unforwarded, self._unforwarded_first

    def forwarded(self, t_mono_ns: int, bound_ns: int = 0) -> None:
        """Everything fed since the previous call was written downstream at ``t_mono_ns`` (the bytes left at most
        ``bound_ns`` later)."""
        if self._native and _gaps_observe is not None:
            _gaps_observe(self.gaps_forwarded, t_mono_ns, self._unforwarded)
        else:
            for _ in range(self._unforwarded):
                self.gaps_forwarded.observe(t_mono_ns)
        if self._unforwarded:
            self.last_token_forwarded_mono_ns = t_mono_ns
            self.last_token_forwarded_bound_ns = bound_ns
        if self._unforwarded_first:
            self.first_token_forwarded_mono_ns = t_mono_ns
            self.first_token_forwarded_bound_ns = bound_ns
        self._unforwarded = 0
        self._unforwarded_first = False


def itl_per_request_ns(first_token_ns: int | None, last_token_ns: int | None, output_tokens: int | None) -> float | None:
    """ITL (per request), the one definition (AIPerf's ``inter_token_latency``): (last token - first token) /
    (output tokens - 1), for a request with two tokens or more that ended after its first token; else None.
    The load generator's summary and the reports both read it from here."""
    if first_token_ns is None or last_token_ns is None or not output_tokens or output_tokens < 2 or last_token_ns <= first_token_ns:
        return None
    return (last_token_ns - first_token_ns) / (output_tokens - 1)
