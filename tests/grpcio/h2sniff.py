"""A TCP proxy that watches gRPC traffic to learn each message's compressed flag.

Why this exists
---------------
grpcio (the C-core based Python package) hides the gRPC message framing from
application code: a server handler cannot tell whether a request arrived
compressed, and a client cannot tell whether a response was.  The interop spec
needs both:

* servers must reject a request that sets ``expect_compressed`` but arrives
  uncompressed (INVALID_ARGUMENT) -- clients use this as a feature probe in
  ``client_compressed_unary``;
* client tests want to assert that ``response_compressed`` really produced a
  compressed message on the wire (and that an uncompressed one did not).

The proxy below sits between the two peers, forwards bytes unchanged in both
directions and, on the side(s) it is asked to, runs a small incremental parser
over the HTTP/2 byte stream.  No HPACK is needed: only the 9-byte frame
headers and the payload of DATA frames are read, and inside DATA the 5-byte
gRPC length prefix (``compressed-flag:u8, length:u32be``).  Each complete
message is reported as a :class:`WireMessage` carrying its stream id, the
compressed flag, and a digest of the (decompressed) message bytes, so that a
handler holding the same bytes can find the record of its own message.

Plain-text HTTP/2 ("h2c" with prior knowledge, which is what gRPC uses) only.
"""

from __future__ import annotations

import collections
import hashlib
import socket
import threading
import zlib
from dataclasses import dataclass
from typing import Callable, Optional

CLIENT_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER_LEN = 9
FRAME_DATA = 0x0
FRAME_RST_STREAM = 0x3
FLAG_END_STREAM = 0x1
FLAG_PADDED = 0x8
GRPC_PREFIX_LEN = 5


def digest(data: bytes) -> bytes:
    """The digest used to match a message seen on the wire with a handler's copy."""
    return hashlib.sha256(data).digest()


@dataclass(frozen=True)
class WireMessage:
    """One complete gRPC message observed in one direction of a connection."""

    stream_id: int
    compressed: bool
    wire_length: int  # length as framed, i.e. after compression
    digest: Optional[bytes]  # of the decompressed bytes; None if undecodable


def _decompress(data: bytes) -> Optional[bytes]:
    """Inflate a compressed gRPC message (gzip or zlib/"deflate"); None on failure.

    The encoding name travels in HPACK-coded headers that we do not decode, so
    rely on zlib's automatic header detection (wbits = 32 + 15) instead.
    """
    try:
        inflater = zlib.decompressobj(wbits=47)
        out = inflater.decompress(data) + inflater.flush()
        return out if inflater.eof else None
    except zlib.error:
        return None


class _MessageAssembler:
    """Reassembles gRPC length-prefixed messages from one stream's DATA payloads."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[bool, bytes]]:
        self._buf += data
        out = []
        while len(self._buf) >= GRPC_PREFIX_LEN:
            length = int.from_bytes(self._buf[1:5], "big")
            end = GRPC_PREFIX_LEN + length
            if len(self._buf) < end:
                break
            compressed = self._buf[0] & 1 == 1
            out.append((compressed, bytes(self._buf[GRPC_PREFIX_LEN:end])))
            del self._buf[:end]
        return out


class H2MessageParser:
    """Incremental parser of one direction of an HTTP/2 connection.

    ``feed()`` takes bytes in arrival order and calls ``on_message`` for every
    complete gRPC message found in DATA frames.  Anything unexpected (a wrong
    client preface, a frame larger than 16 MiB) puts the parser into a
    ``broken`` state in which it silently stops parsing; forwarding is never
    affected.
    """

    MAX_FRAME = (1 << 24) - 1  # HTTP/2 upper bound for SETTINGS_MAX_FRAME_SIZE

    def __init__(self, on_message: Callable[[WireMessage], None], expect_preface: bool) -> None:
        self._on_message = on_message
        self._preface_left = CLIENT_PREFACE if expect_preface else b""
        self._buf = bytearray()
        self._streams: dict[int, _MessageAssembler] = {}
        self.broken = False

    def feed(self, data: bytes) -> None:
        if self.broken:
            return
        self._buf += data
        if self._preface_left:
            n = min(len(self._preface_left), len(self._buf))
            if bytes(self._buf[:n]) != self._preface_left[:n]:
                self.broken = True
                return
            del self._buf[:n]
            self._preface_left = self._preface_left[n:]
            if self._preface_left:
                return
        while len(self._buf) >= FRAME_HEADER_LEN:
            length = int.from_bytes(self._buf[0:3], "big")
            if length > self.MAX_FRAME:
                self.broken = True
                return
            if len(self._buf) < FRAME_HEADER_LEN + length:
                break
            ftype = self._buf[3]
            flags = self._buf[4]
            stream_id = int.from_bytes(self._buf[5:9], "big") & 0x7FFFFFFF
            payload = bytes(self._buf[FRAME_HEADER_LEN : FRAME_HEADER_LEN + length])
            del self._buf[: FRAME_HEADER_LEN + length]
            if ftype == FRAME_DATA:
                self._data_frame(stream_id, flags, payload)
            elif ftype == FRAME_RST_STREAM:
                self._streams.pop(stream_id, None)

    def _data_frame(self, stream_id: int, flags: int, payload: bytes) -> None:
        if flags & FLAG_PADDED and payload:
            pad = payload[0]
            payload = payload[1 : len(payload) - pad]
        assembler = self._streams.setdefault(stream_id, _MessageAssembler())
        for compressed, body in assembler.feed(payload):
            plain = _decompress(body) if compressed else body
            self._on_message(
                WireMessage(
                    stream_id=stream_id,
                    compressed=compressed,
                    wire_length=len(body),
                    digest=None if plain is None else digest(plain),
                )
            )
        if flags & FLAG_END_STREAM:
            self._streams.pop(stream_id, None)


class ConnectionRecord:
    """What the proxy saw on one proxied connection."""

    MAX_PENDING = 4096  # bound on unclaimed client->server records per connection

    def __init__(self, upstream_local_port: int) -> None:
        self.upstream_local_port = upstream_local_port
        self._lock = threading.Lock()
        self._to_server: collections.deque[WireMessage] = collections.deque(maxlen=self.MAX_PENDING)
        self.to_client: list[WireMessage] = []

    def _add_to_server(self, msg: WireMessage) -> None:
        with self._lock:
            self._to_server.append(msg)

    def _add_to_client(self, msg: WireMessage) -> None:
        with self._lock:
            self.to_client.append(msg)

    def to_server(self) -> list[WireMessage]:
        with self._lock:
            return list(self._to_server)

    def take_request(self, message_digest: bytes) -> Optional[WireMessage]:
        """Remove and return the oldest client->server record with this digest.

        Records are claimed oldest-first, so two identical messages sent one
        after the other on a connection (say, an uncompressed probe followed by
        the same request compressed) are told apart by order.
        """
        with self._lock:
            for i, msg in enumerate(self._to_server):
                if msg.digest == message_digest:
                    del self._to_server[i]
                    return msg
        return None


class SniffingProxy:
    """Forwarding proxy: listen_host:port -> upstream, recording gRPC messages.

    ``sniff_requests`` / ``sniff_responses`` select which directions are parsed
    (parsing costs CPU; forwarding is always byte-for-byte).  Records are kept
    per connection and can be looked up by the proxy's *upstream* local port,
    which is what a server behind the proxy sees as the peer port.
    """

    def __init__(
        self,
        upstream: tuple[str, int],
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        sniff_requests: bool = True,
        sniff_responses: bool = False,
    ) -> None:
        self._upstream = upstream
        self._sniff_requests = sniff_requests
        self._sniff_responses = sniff_responses
        self._lock = threading.Lock()
        self._by_port: dict[int, ConnectionRecord] = {}
        self._all: list[ConnectionRecord] = []
        self._closed = False
        self._listener = socket.create_server((listen_host, listen_port), reuse_port=False)
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept_loop, name="h2sniff-accept", daemon=True).start()

    # -- lookups ---------------------------------------------------------
    def connection_for_peer_port(self, port: int) -> Optional[ConnectionRecord]:
        with self._lock:
            return self._by_port.get(port)

    def connections(self) -> list[ConnectionRecord]:
        """Every connection seen so far (also closed ones), oldest first."""
        with self._lock:
            return list(self._all)

    def close(self) -> None:
        self._closed = True
        try:
            self._listener.close()
        except OSError:
            pass

    # -- forwarding ------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._upstream)
            except OSError:
                client.close()
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            record = ConnectionRecord(upstream.getsockname()[1])
            with self._lock:
                self._by_port[record.upstream_local_port] = record
                self._all.append(record)
            up_parser = (
                H2MessageParser(record._add_to_server, expect_preface=True) if self._sniff_requests else None
            )
            down_parser = (
                H2MessageParser(record._add_to_client, expect_preface=False) if self._sniff_responses else None
            )
            done = threading.Barrier(2, action=lambda c=client, u=upstream, r=record: self._finish(c, u, r))
            for src, dst, parser in ((client, upstream, up_parser), (upstream, client, down_parser)):
                threading.Thread(
                    target=self._pump, args=(src, dst, parser, done), name="h2sniff-pump", daemon=True
                ).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, parser: Optional[H2MessageParser], done) -> None:
        clean = False
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    clean = True
                    break
                # Parse before forwarding: a record then always exists by the
                # time the peer can act on the message.
                if parser is not None:
                    parser.feed(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            # A clean EOF is passed on as a half-close; an error tears down
            # both sockets so the opposite pump does not block forever.
            targets = [(dst, socket.SHUT_WR)] if clean else [(dst, socket.SHUT_RDWR), (src, socket.SHUT_RDWR)]
            for sock, how in targets:
                try:
                    sock.shutdown(how)
                except OSError:
                    pass
            done.wait()

    def _finish(self, client: socket.socket, upstream: socket.socket, record: ConnectionRecord) -> None:
        for s in (client, upstream):
            try:
                s.close()
            except OSError:
                pass
        with self._lock:
            if self._by_port.get(record.upstream_local_port) is record:
                del self._by_port[record.upstream_local_port]
