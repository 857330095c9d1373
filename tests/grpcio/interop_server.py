#!/usr/bin/env python3
"""A gRPC interop test server (grpc.testing.TestService) built on grpcio.

Serves as the reference peer for protoplane's ``interop-client``: it follows
gRPC's interop-test-descriptions for the server side.

Usage::

    interop_server.py [--port N] [--host ADDR] [--no-sniff]

``--port 0`` (the default) picks a free port.  Once the server accepts
connections it prints ``listening on PORT`` on stdout (flushed); SIGTERM or
SIGINT stop it.

Behaviour (per method)
----------------------
Every method echoes the request header ``x-grpc-test-echo-initial`` as initial
metadata and ``x-grpc-test-echo-trailing-bin`` as trailing metadata (all
values, in order), including on error.

* ``EmptyCall``: returns ``Empty``.
* ``UnaryCall`` / ``CacheableUnaryCall``: checks ``expect_compressed``
  (INVALID_ARGUMENT if the request was not compressed), compresses the response
  with gzip iff ``response_compressed`` is true, fails with ``response_status``
  (code and message) if its code is non-zero, else answers with a payload of
  ``response_size`` zero bytes.
* ``StreamingOutputCall``: one response per ``response_parameters`` entry, each
  after sleeping ``interval_us`` and of ``size`` zero bytes, compressed iff its
  ``compressed`` is true; ``response_status`` is honoured before any response.
* ``StreamingInputCall``: sums the request payload sizes; per-message
  ``expect_compressed`` checks.
* ``FullDuplexCall``: for each request, first ``response_status``, then its
  ``response_parameters`` as above, immediately (ping-pong).
* ``HalfDuplexCall``: buffers all requests, then answers them in order.
* ``UnimplementedCall`` and the whole ``UnimplementedService`` are not
  registered, so grpcio answers UNIMPLEMENTED.

Compression checks: grpcio does not expose whether a request message arrived
compressed, so by default the server listens behind an in-process sniffing
proxy (h2sniff.py) that reads the gRPC framing and records each request
message's compressed flag; handlers look their message up by digest and by the
peer port the proxy connected from.  ``--no-sniff`` binds grpcio directly; the
``expect_compressed`` check is then skipped (accepted) with a warning.

Limits: messages up to ``--max-message-mib`` MiB (default 32) in both
directions, enough for protoplane's 16 MiB ``huge_unary`` case.
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True  # keep __pycache__ out of the source tree

import argparse
import signal
import threading
from concurrent import futures
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc  # noqa: E402

import grpcio_stubs  # noqa: E402
import h2sniff  # noqa: E402

INITIAL_KEY = "x-grpc-test-echo-initial"
TRAILING_KEY = "x-grpc-test-echo-trailing-bin"
SERVICE = "grpc.testing.TestService"

# Numeric status code -> grpc.StatusCode (grpcio cannot send codes outside 0..16).
STATUS_BY_CODE = {status.value[0]: status for status in grpc.StatusCode}


class Incoming(NamedTuple):
    """A request message together with the exact bytes it was parsed from."""

    raw: bytes
    msg: object


def _deserializer(message_class):
    """Deserializer that keeps the raw bytes, needed to find the wire record."""

    def parse(raw: bytes) -> Incoming:
        return Incoming(raw, message_class.FromString(raw))

    return parse


def _serialize(message) -> bytes:
    return message.SerializeToString()


class CompressionOracle:
    """Answers "did this request message arrive compressed?" via the proxy."""

    def __init__(self, proxy: Optional[h2sniff.SniffingProxy]) -> None:
        self._proxy = proxy
        self._warned = False

    def was_compressed(self, context: grpc.ServicerContext, incoming: Incoming) -> Optional[bool]:
        """True/False from the wire record, or None when it cannot be known."""
        if self._proxy is None:
            return None
        # context.peer() is e.g. "ipv4:127.0.0.1:54321"; the port identifies
        # the proxy's upstream connection.
        try:
            port = int(context.peer().rsplit(":", 1)[1])
        except (IndexError, ValueError):
            return None
        record = self._proxy.connection_for_peer_port(port)
        if record is None:
            return None
        wire = record.take_request(h2sniff.digest(incoming.raw))
        return None if wire is None else wire.compressed

    def check_expected(self, context: grpc.ServicerContext, incoming: Incoming, expect_compressed) -> None:
        """Abort with INVALID_ARGUMENT if compression was expected but absent.

        Every request message goes through here (also those that do not ask
        for a check) so that its wire record is claimed in order.
        """
        compressed = self.was_compressed(context, incoming)
        if not expect_compressed.value:
            return
        if compressed is None:
            if not self._warned:
                self._warned = True
                print("warning: cannot verify expect_compressed (no wire record); accepting", file=sys.stderr)
            return
        if not compressed:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "expected a compressed request message")


class TestService:
    """The grpc.testing.TestService implementation."""

    def __init__(self, pb, oracle: CompressionOracle) -> None:
        self.pb = pb
        self.oracle = oracle

    # -- helpers -----------------------------------------------------------
    @staticmethod
    def _echo_metadata(context: grpc.ServicerContext) -> None:
        """Echo the interop metadata keys (initial now, trailing at the end)."""
        metadata = context.invocation_metadata() or ()
        initial = tuple((k, v) for k, v in metadata if k == INITIAL_KEY)
        trailing = tuple((k, v) for k, v in metadata if k == TRAILING_KEY)
        if initial:
            context.send_initial_metadata(initial)
        if trailing:
            context.set_trailing_metadata(trailing)

    @staticmethod
    def _maybe_fail(context: grpc.ServicerContext, echo_status) -> None:
        """End the call with the requested status if its code is non-zero."""
        if echo_status.code != 0:
            code = STATUS_BY_CODE.get(echo_status.code, grpc.StatusCode.UNKNOWN)
            context.abort(code, echo_status.message)

    def _payload(self, context: grpc.ServicerContext, size: int):
        if size < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"negative response size {size}")
        return self.pb.messages.Payload(body=bytes(size))

    @staticmethod
    def _termination_event(context: grpc.ServicerContext) -> threading.Event:
        """An event set when the RPC ends (completion, cancel or deadline)."""
        ended = threading.Event()
        if not context.add_callback(ended.set):
            ended.set()  # already terminated
        return ended

    def _stream_responses(
        self, context: grpc.ServicerContext, ended: threading.Event, params: Iterable
    ) -> Iterator:
        """Responses for a list of ResponseParameters (sleep, size, compression).

        The call must already be set to gzip (see _streaming_start); messages
        not marked ``compressed`` opt out one by one.
        """
        for p in params:
            if p.interval_us > 0 and ended.wait(p.interval_us / 1e6):
                return  # call cancelled or deadline passed while sleeping
            if not ended.is_set() and not p.compressed.value:
                context.disable_next_message_compression()
            yield self.pb.messages.StreamingOutputCallResponse(payload=self._payload(context, p.size))

    def _streaming_start(self, context: grpc.ServicerContext) -> threading.Event:
        """Common prologue of the server-streaming methods.

        Compression can only be chosen before the response headers go out, and
        the echoed initial metadata is sent right away.  So every streaming
        call is set to gzip and each message that should not be compressed
        calls disable_next_message_compression() (grpcio's per-message knob).
        If the client does not accept gzip, grpcio sends everything plain.
        """
        context.set_compression(grpc.Compression.Gzip)
        self._echo_metadata(context)
        return self._termination_event(context)

    # -- methods -----------------------------------------------------------
    def EmptyCall(self, incoming: Incoming, context):
        self.oracle.was_compressed(context, incoming)  # claim the wire record
        self._echo_metadata(context)
        return self.pb.messages.Empty()

    def UnaryCall(self, incoming: Incoming, context):
        req = incoming.msg
        context.set_compression(
            grpc.Compression.Gzip if req.response_compressed.value else grpc.Compression.NoCompression
        )
        self._echo_metadata(context)
        self.oracle.check_expected(context, incoming, req.expect_compressed)
        self._maybe_fail(context, req.response_status)
        return self.pb.messages.SimpleResponse(payload=self._payload(context, req.response_size))

    # The cacheable variant only differs in HTTP caching, which has no meaning here.
    CacheableUnaryCall = UnaryCall

    def StreamingOutputCall(self, incoming: Incoming, context):
        req = incoming.msg
        ended = self._streaming_start(context)
        self.oracle.was_compressed(context, incoming)
        self._maybe_fail(context, req.response_status)
        yield from self._stream_responses(context, ended, req.response_parameters)

    def StreamingInputCall(self, requests: Iterator[Incoming], context):
        self._echo_metadata(context)
        total = 0
        for incoming in requests:
            self.oracle.check_expected(context, incoming, incoming.msg.expect_compressed)
            total += len(incoming.msg.payload.body)
        return self.pb.messages.StreamingInputCallResponse(aggregated_payload_size=total)

    def FullDuplexCall(self, requests: Iterator[Incoming], context):
        ended = self._streaming_start(context)
        for incoming in requests:
            req = incoming.msg
            self.oracle.was_compressed(context, incoming)
            self._maybe_fail(context, req.response_status)
            yield from self._stream_responses(context, ended, req.response_parameters)

    def HalfDuplexCall(self, requests: Iterator[Incoming], context):
        ended = self._streaming_start(context)
        buffered = []
        for incoming in requests:
            self.oracle.was_compressed(context, incoming)
            buffered.append(incoming.msg)
        for req in buffered:
            self._maybe_fail(context, req.response_status)
            yield from self._stream_responses(context, ended, req.response_parameters)

    # -- registration ------------------------------------------------------
    def generic_handler(self) -> grpc.GenericRpcHandler:
        m = self.pb.messages
        empty = self.pb.messages.Empty

        def handler(kind, fn, request_class):
            make = getattr(grpc, f"{kind}_rpc_method_handler")
            return make(fn, request_deserializer=_deserializer(request_class), response_serializer=_serialize)

        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "EmptyCall": handler("unary_unary", self.EmptyCall, empty),
                "UnaryCall": handler("unary_unary", self.UnaryCall, m.SimpleRequest),
                "CacheableUnaryCall": handler("unary_unary", self.CacheableUnaryCall, m.SimpleRequest),
                "StreamingOutputCall": handler("unary_stream", self.StreamingOutputCall, m.StreamingOutputCallRequest),
                "StreamingInputCall": handler("stream_unary", self.StreamingInputCall, m.StreamingInputCallRequest),
                "FullDuplexCall": handler("stream_stream", self.FullDuplexCall, m.StreamingOutputCallRequest),
                "HalfDuplexCall": handler("stream_stream", self.HalfDuplexCall, m.StreamingOutputCallRequest),
                # UnimplementedCall deliberately absent -> UNIMPLEMENTED.
            },
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=0, help="TCP port; 0 picks a free one (default)")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ap.add_argument("--no-sniff", action="store_true", help="bind grpcio directly (no expect_compressed checks)")
    ap.add_argument("--max-message-mib", type=int, default=32, help="max message size both ways (default 32)")
    ap.add_argument("--workers", type=int, default=64, help="handler threads (one per active stream)")
    args = ap.parse_args()

    pb = grpcio_stubs.load()
    limit = args.max_message_mib * 1024 * 1024
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=args.workers),
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.so_reuseport", 0),  # fail loudly if the port is taken
        ],
    )
    if args.no_sniff:
        proxy = None
        port = server.add_insecure_port(f"{args.host}:{args.port}")
    else:
        backend_port = server.add_insecure_port("127.0.0.1:0")
        if backend_port == 0:
            print("error: cannot bind the backend port", file=sys.stderr)
            return 1
        proxy = h2sniff.SniffingProxy(("127.0.0.1", backend_port), args.host, args.port)
        port = proxy.port
    if port == 0:
        print(f"error: cannot listen on {args.host}:{args.port}", file=sys.stderr)
        return 1

    server.add_generic_rpc_handlers((TestService(pb, CompressionOracle(proxy)).generic_handler(),))
    server.start()

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"listening on {port}", flush=True)
    while not stop.wait(1.0):
        pass
    if proxy is not None:
        proxy.close()
    server.stop(grace=0).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
