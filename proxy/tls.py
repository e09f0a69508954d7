"""TLS toward the tap's downstream (``deltatap tap --tls-cert FILE --tls-key FILE``), under the same stamps as plain TCP.

asyncio's (and uvloop's) TLS transports decrypt inside the loop and hand over plaintext with no trace of when its
bytes arrived, so a read over them could only be stamped by the process, and a TLS record buffered across reads would
make even that interval wrong. Here TLS runs in memory (:class:`ssl.SSLObject` on two :class:`ssl.MemoryBIO`) on top
of the same stamped TCP transport the plain tap uses (:mod:`deltatap.net.conn`: kernel receive stamps, split per
packet where the process read late): :class:`TlsServer` is that transport's protocol, decrypts each read, and hands
the plaintext the read completed to the relay's protocol with that read's stamp and bound. A record is decrypted
when its last byte arrives, so the plaintext's stamp is the arrival of the packet that completed its record (the
bound reaches back as far as the read's own: never later than the truth, never earlier than the packets that could
have carried it). Writes are encrypted and written at once; their stamp is taken before the encryption, and the
bound covers encryption and the ``send`` (or is unknown, -1, when the bytes wait behind others, as over plain TCP).

With kernel stamps off (``DELTATAP_KERNEL_STAMPS=0``, not Linux) the transport under TLS is the loop's own, and the
stamps are the process's, bounded as over plain TCP.

The context: TLS 1.2 or later, ALPN :data:`ALPN_PROTOCOLS`; the protocol spoken after the handshake is chosen by the
factory :class:`TlsServer` is given (it gets the ALPN protocol the client and the tap agreed on, or None).
A client that fails the handshake is counted and closed; one that sent plain HTTP to the TLS port gets a plain
``400`` saying so (as nginx does), then the close.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
from collections.abc import Callable
from typing import Any

from deltatap.core.config import ConfigError
from deltatap.net.conn import StampedProtocol

log = logging.getLogger("deltatap.tap")

ALPN_PROTOCOLS: tuple[str, ...] = ("h2", "http/1.1")  # offered to clients, most preferred first (h2: proxy/h2relay.py)
_READ = 256 * 1024
_PLAIN_HTTP = re.compile(rb"^[A-Za-z]{3,10} [^ \r\n]")  # a request line: a TLS record starts with 0x14-0x17


class _NoPassword(Exception):
    pass


def _no_password() -> str:
    raise _NoPassword


def server_context(cert: str, key: str) -> ssl.SSLContext:
    """The downstream TLS context for a certificate chain and its key (PEM files); every failure is one
    :class:`ConfigError` line naming the file and what to do."""
    for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise ConfigError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION
    ctx.set_alpn_protocols(list(ALPN_PROTOCOLS))
    try:
        ssl.create_default_context(cafile=cert)  # (a PEM certificate at all? its own error, before the key's)
    except ssl.SSLError as exc:
        raise ConfigError(f"--tls-cert {cert}: not a PEM certificate ({exc.reason or exc}); give the server certificate "
                          "(chain) in PEM, '-----BEGIN CERTIFICATE-----'") from None
    try:
        ctx.load_cert_chain(cert, key, password=_no_password)
    except _NoPassword:
        raise ConfigError(f"--tls-key {key}: the key is encrypted; give an unencrypted PEM key "
                          "(e.g. openssl pkey -in KEY -out KEY.plain)") from None
    except ssl.SSLError as exc:
        reason = exc.reason or str(exc)
        if "MISMATCH" in reason.upper():
            raise ConfigError(f"--tls-key {key}: does not match the certificate {cert} ({reason})") from None
        raise ConfigError(f"--tls-key {key}: not a PEM private key ({reason}); give the certificate's key in PEM, "
                          "'-----BEGIN PRIVATE KEY-----'") from None
    return ctx


class TlsServer(StampedProtocol):
    """One downstream TLS connection: the stamped TCP transport's protocol, and the transport of the protocol that
    ``factory(alpn)`` returns once the handshake is done (it gets the plaintext through ``on_data(data, t, bound)``)."""

    def __init__(self, context: ssl.SSLContext, factory: Callable[[str | None], StampedProtocol], *,
                 handshake_timeout_s: float, on_failure: Callable[[str, str | None], None]) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._factory = factory
        self._timeout_s = handshake_timeout_s
        self._on_failure = on_failure
        self._timer: asyncio.TimerHandle | None = None
        self._first = b""  # the connection's first bytes, to recognise plain HTTP
        self.app: StampedProtocol | None = None
        self._app_eof = False
        self._shut = False  # close_notify sent
        self.peer: str | None = None

    # ---- the TCP side ------------------------------------------------------------------------
    def on_made(self) -> None:
        peer = self.transport.get_extra_info("peername")
        self.peer = peer[0] if isinstance(peer, tuple) else None
        self._timer = asyncio.get_running_loop().call_later(self._timeout_s, self._handshake_timed_out)

    def on_data(self, data: bytes, t: int, bound: int) -> None:
        if len(self._first) < 16:
            self._first += data[: 16 - len(self._first)]
        self._incoming.write(data)
        if self.app is None:
            try:
                self._ssl.do_handshake()
            except ssl.SSLWantReadError:
                self._flush()
                return
            except ssl.SSLError as exc:
                self._failed(exc)
                return
            self._flush()
            self._handshake_done()
            if self.app is None:
                return
        self._read(t, bound)

    def _read(self, t: int, bound: int) -> None:
        chunks: list[bytes] = []
        eof = False
        while True:
            try:
                chunk = self._ssl.read(_READ)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:  # close_notify: the client is done sending
                eof = True
                break
            except ssl.SSLError as exc:
                log.debug("tap: TLS error from %s: %s", self.peer, exc)
                self.transport.abort()
                return
            if not chunk:
                eof = True
                break
            chunks.append(chunk)
        self._flush()  # (TLS 1.3 may answer a key update or send tickets)
        app = self.app
        if chunks and app is not None:
            app.on_data(chunks[0] if len(chunks) == 1 else b"".join(chunks), t, bound)
        if eof:
            self._eof_to_app()

    def on_eof(self) -> bool:
        if self.app is None:
            return False
        return self._eof_to_app()

    def _eof_to_app(self) -> bool:
        app = self.app
        if self._app_eof or app is None:
            return True
        self._app_eof = True
        keep = app.eof_received()
        if not keep:
            self.close()
        return bool(keep)

    def on_lost(self, exc: BaseException | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.app is not None:
            self.app.connection_lost(exc)

    def on_pause_writing(self) -> None:
        if self.app is not None:
            self.app.pause_writing()

    def on_resume_writing(self) -> None:
        if self.app is not None:
            self.app.resume_writing()

    # ---- handshake ---------------------------------------------------------------------------
    def _handshake_done(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        alpn = self._ssl.selected_alpn_protocol()
        self.app = self._factory(alpn)
        self.app.connection_made(self)

    def _failed(self, exc: ssl.SSLError) -> None:
        plain = bool(_PLAIN_HTTP.match(self._first))
        self._on_failure("plain HTTP sent to the TLS port" if plain else (exc.reason or str(exc)), self.peer)
        if plain:
            body = b"deltatap tap: this port speaks TLS (--tls-cert); send the request over https://\n"
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                                 b"Connection: close\r\n\r\n%s" % (len(body), body))
        else:
            self._flush()  # (the alert that says why, where OpenSSL wrote one)
        self.transport.close()

    def _handshake_timed_out(self) -> None:
        self._timer = None
        if self.app is None and not self.transport.is_closing():
            self._on_failure("no TLS handshake within the header timeout", self.peer)
            self.transport.abort()

    def _flush(self) -> None:
        out = self._outgoing
        if out.pending:
            self.transport.write(out.read())

    # ---- the transport the relay's protocol sees ---------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._shut or self.transport.is_closing():
            return
        self._ssl.write(data)
        self._flush()

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def get_write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size() + self._outgoing.pending

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.transport.set_write_buffer_limits(high, low)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        """close_notify, then the TCP FIN (TLS 1.3 lets the other direction go on, as a half-close does)."""
        self._shutdown()
        if self.transport.can_write_eof():
            self.transport.write_eof()

    def _shutdown(self) -> None:
        if self._shut or self.app is None:
            return
        self._shut = True
        try:
            self._ssl.unwrap()
        except (ssl.SSLError, OSError, ValueError):
            pass  # (SSLWantReadError: the client's close_notify is not there yet; nothing to wait for)
        if not self.transport.is_closing():
            self._flush()

    def close(self) -> None:
        if not self.transport.is_closing():
            self._shutdown()
            self.transport.close()

    def abort(self) -> None:
        self.transport.abort()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def pause_reading(self) -> None:
        self.transport.pause_reading()

    def resume_reading(self) -> None:
        self.transport.resume_reading()

    def is_reading(self) -> bool:
        return self.transport.is_reading()

    def get_protocol(self) -> StampedProtocol | None:
        return self.app

    def set_protocol(self, protocol: StampedProtocol) -> None:
        """The relay's protocol changes (an HTTP/2 connection handed to the h2 relay); the plaintext goes to it."""
        self.app = protocol

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "ssl_object":
            return self._ssl
        if name == "peercert":
            return self._ssl.getpeercert()
        if name == "cipher":
            return self._ssl.cipher()
        return self.transport.get_extra_info(name, default)

