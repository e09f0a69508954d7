"""Per-request records: stamped on the hot path in ``mono_ns``, written as JSON lines in Unix ns.

The JSON-lines format is an interface other tools read (the collector joins it to spans on
``trace_id`` / ``request_id``); docs/records.md is its schema. Times are integers, ``*_unix_ns``,
``null`` when the point was not observed (never interpolated).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from deltatap.core.clock import to_unix_ns
from deltatap.core.vocab import Outcome

RECORD_VERSION = 1


class ErrorKind:
    """Why a request did not end ``ok``; the summary counts each kind."""

    UNREACHABLE = "unreachable"  # connection refused / DNS / connect timeout
    HTTP_STATUS = "http_status"  # an HTTP status >= 400 (the status itself is the record's http_status)
    REFUSED = "refused"  # refusal: refusal status, or finish_reason "content_filter"
    NON_SSE = "non_sse"  # 2xx answer that is not an event stream
    MALFORMED_SSE = "malformed_sse"  # an event stream whose events are not JSON of a known format
    STREAM_ERROR = "stream_error"  # the stream itself reported an error
    TRUNCATED = "truncated"  # the server closed before the end of the stream
    DISCONNECTED = "disconnected"  # connection reset / payload error
    TIMEOUT = "timeout"  # --request-timeout elapsed
    CANCELLED = "cancelled"  # the run ended (duration over, Ctrl-C) before the answer did


@dataclass(slots=True)
class RequestRecord:
    index: int
    request_id: str
    trace_id: str
    span_id: str
    phase: str = "measure"  # measure | warmup | probe
    worker: int = 0
    session: int | None = None
    turn: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    max_tokens: int = 0
    # stamps, mono_ns of this process
    planned_mono_ns: int | None = None
    send_mono_ns: int | None = None  # the request call began (the scheduler's actual send)
    written_mono_ns: int | None = None  # last byte of the request handed to the kernel (T_submit, B.1.1)
    headers_mono_ns: int | None = None  # read that completed the response head
    first_token_mono_ns: int | None = None  # first content token (5.1.3.1), t12
    chunk_mono_ns: list[int] = field(default_factory=list)  # every content event's read
    last_token_mono_ns: int | None = None
    end_mono_ns: int | None = None
    # event -> (before_ns, after_ns): the event happened in [t - before, t + after] (deltatap.core.vocab.format_stamp_bounds;
    # a side -1, BOUND_UNKNOWN: not known, stated "?" on the client span - e.g. client.send with no response head)
    stamp_bounds: dict[str, tuple[int, int]] = field(default_factory=dict)
    # outcome
    status: str = Outcome.OK
    http_status: int | None = None
    error_kind: str | None = None
    error: str | None = None
    server_message: str | None = None  # a non-2xx answer's own message (error.message, else the body's start)
    # tokens and stream facts
    input_tokens: int = 0  # reference tokenizer (cl100k_base), everything sent
    output_tokens: int | None = None  # reference tokenizer over the received content
    usage_input_tokens: int | None = None  # server-reported usage (option A)
    usage_output_tokens: int | None = None
    stream_format: str | None = None
    transport_chunks: int = 0
    sse_events: int = 0
    content_events: int = 0
    malformed_events: int = 0
    leading_whitespace_events: int = 0
    finish_reason: str | None = None
    energy_j: float | None = None
    output_text: str = ""  # kept in memory for token counting and chat history; never written

    @property
    def submit_mono_ns(self) -> int | None:
        """T_submit: the request's last byte written, else the send call."""
        return self.written_mono_ns if self.written_mono_ns is not None else self.send_mono_ns

    def to_dict(self) -> dict[str, Any]:
        u = _unix
        return {
            "v": RECORD_VERSION,
            "index": self.index,
            "request_id": self.request_id,
            "trace_id": self.trace_id,
            "span_id": self.span_id,
            "phase": self.phase,
            "worker": self.worker,
            "session": self.session,
            "turn": self.turn,
            "status": str(self.status),
            "http_status": self.http_status,
            "error_kind": self.error_kind,
            "error": self.error,
            "server_message": self.server_message,
            "planned_send_unix_ns": u(self.planned_mono_ns),
            "send_unix_ns": u(self.send_mono_ns),
            "request_written_unix_ns": u(self.written_mono_ns),
            "response_headers_unix_ns": u(self.headers_mono_ns),
            "first_token_unix_ns": u(self.first_token_mono_ns),
            "chunk_unix_ns": [to_unix_ns(t) for t in self.chunk_mono_ns],
            "last_token_unix_ns": u(self.last_token_mono_ns),
            "end_unix_ns": u(self.end_mono_ns),
            "schedule_lag_ns": (self.send_mono_ns - self.planned_mono_ns)
            if self.send_mono_ns is not None and self.planned_mono_ns is not None
            else None,
            "max_tokens": self.max_tokens,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "usage_input_tokens": self.usage_input_tokens,
            "usage_output_tokens": self.usage_output_tokens,
            "stream_format": self.stream_format,
            "transport_chunks": self.transport_chunks,
            "sse_events": self.sse_events,
            "content_events": self.content_events,
            "malformed_events": self.malformed_events,
            "leading_whitespace_events": self.leading_whitespace_events,
            "finish_reason": self.finish_reason,
            "energy_j": self.energy_j,
            "labels": self.labels,
        }


def _unix(mono: int | None) -> int | None:
    return None if mono is None else to_unix_ns(mono)


class RecordWriter:
    """Appends records as JSON lines (called off the hot path, after a request ended)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] = self.path.open("w", encoding="utf-8")
        self.count = 0

    def write(self, rec: RequestRecord) -> None:
        self._fh.write(json.dumps(rec.to_dict(), separators=(",", ":")) + "\n")
        self.count += 1

    def close(self) -> None:
        self._fh.close()


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Records of a ``records.jsonl`` as dicts (the documented schema)."""
    with Path(path).open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
