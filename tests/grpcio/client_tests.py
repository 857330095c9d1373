#!/usr/bin/env python3
"""grpcio client test suite for any grpc.testing.TestService server.

Usage::

    client_tests.py --target HOST:PORT [--case NAME ...] [--list] [--rpc-timeout S]

Runs every case (or those named with ``--case``, repeatable) against the
server, printing one line per case::

    PASS name (0.012s)
    FAIL name (0.034s): what went wrong

followed by a summary line; the exit status is 1 if any case failed.

Each case opens its own channel, so a broken connection does not cascade.
All RPCs carry a deadline (``--rpc-timeout``, default 30 s; 120 s for the
16 MiB case) so a hung server fails the case instead of hanging the suite.

The compression cases route their channel through a local sniffing proxy
(h2sniff.py) that reads the gRPC framing, so they can assert that messages
really were (or were not) compressed on the wire -- grpcio itself does not
expose that.  See ``CASES`` below for the list and what each checks.
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True  # keep __pycache__ out of the source tree

import argparse
import queue
import threading
import time
import traceback
from concurrent import futures
from pathlib import Path
from typing import Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc  # noqa: E402

import grpcio_stubs  # noqa: E402
import h2sniff  # noqa: E402

INITIAL_KEY = "x-grpc-test-echo-initial"
TRAILING_KEY = "x-grpc-test-echo-trailing-bin"
MIB = 1024 * 1024
HUGE = 16 * MIB
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 32 * MIB),
    ("grpc.max_send_message_length", 32 * MIB),
]
# Sizes from the interop spec (large_unary, client_streaming, server_streaming, ping_pong).
LARGE_REQUEST, LARGE_RESPONSE = 271828, 314159
REQUEST_SIZES = [27182, 8, 1828, 45904]
RESPONSE_SIZES = [31415, 9, 2653, 58979]
SPECIAL_MESSAGE = "\t\ntest with whitespace\r\nand Unicode BMP \u263a and non-BMP \U0001f608\t\n"


class CheckFailed(Exception):
    """A test expectation did not hold."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def expect_rpc_error(fn: Callable[[], object], code: grpc.StatusCode, details: str | None = None) -> grpc.RpcError:
    """Run fn, which must raise RpcError with this code (and exact details if given)."""
    try:
        result = fn()
    except grpc.RpcError as err:
        check(err.code() == code, f"got status {err.code()} ({err.details()!r}), want {code}")
        if details is not None:
            check(err.details() == details, f"got message {err.details()!r}, want {details!r}")
        return err
    raise CheckFailed(f"call succeeded ({type(result).__name__}), want status {code}")


def metadata_values(metadata, key: str) -> list:
    return [v for k, v in (metadata or ()) if k == key]


class RequestFeeder:
    """A blocking request iterator for client/bidi streams driven step by step."""

    _DONE = object()

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()

    def send(self, message) -> None:
        self._queue.put(message)

    def close(self) -> None:
        self._queue.put(self._DONE)

    def __iter__(self) -> Iterator:
        while True:
            item = self._queue.get()
            if item is self._DONE:
                return
            yield item


class Context:
    """What a case gets: stubs, the target, and helpers to open channels."""

    def __init__(self, pb, target: str, rpc_timeout: float) -> None:
        self.pb = pb
        self.m = pb.messages
        self.target = target
        self.timeout = rpc_timeout
        self._cleanup: list[Callable[[], None]] = []

    def channel(self, target: str | None = None) -> grpc.Channel:
        ch = grpc.insecure_channel(target or self.target, options=CHANNEL_OPTIONS)
        self._cleanup.append(ch.close)
        return ch

    def stub(self, target: str | None = None):
        return self.pb.services.TestServiceStub(self.channel(target))

    def sniffed_stub(self):
        """A stub whose (private) connection goes through a sniffing proxy."""
        host, _, port = self.target.rpartition(":")
        proxy = h2sniff.SniffingProxy((host.strip("[]"), int(port)), sniff_requests=True, sniff_responses=True)
        self._cleanup.append(proxy.close)
        return self.stub(f"127.0.0.1:{proxy.port}"), proxy

    def close(self) -> None:
        for fn in reversed(self._cleanup):
            try:
                fn()
            except Exception:  # noqa: BLE001 - best-effort cleanup
                pass
        self._cleanup.clear()

    # -- request builders ---------------------------------------------------
    def payload(self, size: int):
        return self.m.Payload(body=bytes(size))

    def simple(self, request_size: int = 0, response_size: int = 0, **fields):
        return self.m.SimpleRequest(payload=self.payload(request_size), response_size=response_size, **fields)

    def streaming(self, sizes=(), interval_us: int = 0, **fields):
        params = [self.m.ResponseParameters(size=s, interval_us=interval_us) for s in sizes]
        return self.m.StreamingOutputCallRequest(response_parameters=params, **fields)


CASES: dict[str, Callable[[Context], None]] = {}


def case(fn: Callable[[Context], None]) -> Callable[[Context], None]:
    """Register a test case under its function name."""
    CASES[fn.__name__] = fn
    return fn


# --- basic call shapes -------------------------------------------------------


@case
def empty_unary(c: Context) -> None:
    """EmptyCall with an empty request returns an empty response."""
    reply = c.stub().EmptyCall(c.pb.messages.Empty(), timeout=c.timeout)
    check(reply == c.pb.messages.Empty(), f"got {reply!r}")


@case
def large_unary(c: Context) -> None:
    """UnaryCall: 271828-byte request, 314159-byte response."""
    reply = c.stub().UnaryCall(c.simple(LARGE_REQUEST, LARGE_RESPONSE), timeout=c.timeout)
    check(reply.payload.body == bytes(LARGE_RESPONSE), f"response body length {len(reply.payload.body)}")


@case
def server_streaming(c: Context) -> None:
    """StreamingOutputCall returns one response per ResponseParameters, in order."""
    call = c.stub().StreamingOutputCall(c.streaming(RESPONSE_SIZES), timeout=c.timeout)
    sizes = [len(r.payload.body) for r in call]
    check(sizes == RESPONSE_SIZES, f"response sizes {sizes}, want {RESPONSE_SIZES}")
    check(call.code() == grpc.StatusCode.OK, f"status {call.code()}")


@case
def client_streaming(c: Context) -> None:
    """StreamingInputCall returns the sum of the request payload sizes."""
    requests = (c.m.StreamingInputCallRequest(payload=c.payload(s)) for s in REQUEST_SIZES)
    reply = c.stub().StreamingInputCall(requests, timeout=c.timeout)
    check(reply.aggregated_payload_size == sum(REQUEST_SIZES), f"aggregated size {reply.aggregated_payload_size}")


@case
def ping_pong(c: Context) -> None:
    """FullDuplexCall: each request is answered before the next one is sent."""
    feeder = RequestFeeder()
    call = c.stub().FullDuplexCall(iter(feeder), timeout=c.timeout)
    try:
        for req_size, resp_size in zip(REQUEST_SIZES, RESPONSE_SIZES):
            feeder.send(c.streaming([resp_size], payload=c.payload(req_size)))
            reply = next(call)
            check(len(reply.payload.body) == resp_size, f"response size {len(reply.payload.body)}, want {resp_size}")
    finally:
        feeder.close()
    rest = list(call)
    check(not rest, f"{len(rest)} unexpected extra responses")
    check(call.code() == grpc.StatusCode.OK, f"status {call.code()}")


@case
def empty_stream(c: Context) -> None:
    """FullDuplexCall with no requests ends OK with no responses."""
    call = c.stub().FullDuplexCall(iter(()), timeout=c.timeout)
    responses = list(call)
    check(not responses, f"got {len(responses)} responses")
    check(call.code() == grpc.StatusCode.OK, f"status {call.code()}")


@case
def concurrent_unary(c: Context) -> None:
    """64 UnaryCalls in flight at once on one channel, each with its own size."""
    stub = c.stub()

    def one(i: int) -> int:
        return len(stub.UnaryCall(c.simple(i, 1000 + i), timeout=c.timeout).payload.body)

    with futures.ThreadPoolExecutor(max_workers=16) as pool:
        sizes = list(pool.map(one, range(64)))
    check(sizes == [1000 + i for i in range(64)], "response sizes mixed up between concurrent calls")


# --- metadata ----------------------------------------------------------------

ECHO_METADATA = (
    (INITIAL_KEY, "test_initial_metadata_value"),
    (TRAILING_KEY, b"\x0a\x0b\x0a\x0b\x0a\x0b"),
)


def check_echo(initial, trailing, sent=ECHO_METADATA, trailers_only_ok: bool = False) -> None:
    """The interop keys came back: ASCII one as initial, -bin one as trailing metadata.

    With ``trailers_only_ok`` a response without initial metadata at all
    (HTTP/2 Trailers-Only, used for calls that fail before any message) may
    carry the "initial" key in its trailers instead.
    """
    want_initial = [v for k, v in sent if k == INITIAL_KEY]
    want_trailing = [v for k, v in sent if k == TRAILING_KEY]
    got_initial = metadata_values(initial, INITIAL_KEY)
    if trailers_only_ok and not initial:
        got_initial = metadata_values(trailing, INITIAL_KEY)
    got_trailing = metadata_values(trailing, TRAILING_KEY)
    check(got_initial == want_initial, f"initial {INITIAL_KEY} = {got_initial!r}, want {want_initial!r}")
    check(got_trailing == want_trailing, f"trailing {TRAILING_KEY} = {got_trailing!r}, want {want_trailing!r}")


@case
def custom_metadata_unary(c: Context) -> None:
    """UnaryCall echoes the ASCII key as initial and the -bin key as trailing metadata."""
    reply, call = c.stub().UnaryCall.with_call(c.simple(1, 1), metadata=ECHO_METADATA, timeout=c.timeout)
    check(len(reply.payload.body) == 1, "wrong response size")
    check_echo(call.initial_metadata(), call.trailing_metadata())


@case
def custom_metadata_streaming(c: Context) -> None:
    """FullDuplexCall echoes the same metadata (initial before the first response)."""
    feeder = RequestFeeder()
    call = c.stub().FullDuplexCall(iter(feeder), metadata=ECHO_METADATA, timeout=c.timeout)
    try:
        feeder.send(c.streaming([1], payload=c.payload(1)))
        initial = call.initial_metadata()
        check(len(next(call).payload.body) == 1, "wrong response size")
    finally:
        feeder.close()
    check(not list(call), "unexpected extra responses")
    check_echo(initial, call.trailing_metadata())


@case
def custom_metadata_values(c: Context) -> None:
    """Every printable ASCII character, and binary values whose base64 forms need 0/1/2 '=' pads."""
    stub = c.stub()
    ascii_value = "".join(chr(i) for i in range(0x21, 0x7F)) + " inner  spaces ~"
    binaries = [b"\x00", b"\xff\x00", b"\x80\x81\x82", bytes(range(256)), b"\x00" * 1000]
    for value in binaries:
        sent = ((INITIAL_KEY, ascii_value), (TRAILING_KEY, value))
        _, call = stub.UnaryCall.with_call(c.simple(), metadata=sent, timeout=c.timeout)
        check_echo(call.initial_metadata(), call.trailing_metadata(), sent)


@case
def custom_metadata_on_error(c: Context) -> None:
    """Echoed metadata still arrives when the call fails (EchoStatus); Trailers-Only allowed."""
    req = c.simple(response_status=c.m.EchoStatus(code=9, message="failing on purpose"))
    err = expect_rpc_error(
        lambda: c.stub().UnaryCall(req, metadata=ECHO_METADATA, timeout=c.timeout),
        grpc.StatusCode.FAILED_PRECONDITION,
        "failing on purpose",
    )
    check_echo(err.initial_metadata(), err.trailing_metadata(), trailers_only_ok=True)


# --- deadlines ---------------------------------------------------------------


@case
def deadline_exceeded_full_duplex(c: Context) -> None:
    """FullDuplexCall whose server sleeps 3 s, with a 300 ms deadline -> DEADLINE_EXCEEDED promptly."""
    started = time.monotonic()
    call = c.stub().FullDuplexCall(iter([c.streaming([1], interval_us=3_000_000)]), timeout=0.3)
    expect_rpc_error(lambda: list(call), grpc.StatusCode.DEADLINE_EXCEEDED)
    elapsed = time.monotonic() - started
    check(elapsed < 2.0, f"deadline took {elapsed:.2f}s to fire")


@case
def deadline_exceeded_server_streaming(c: Context) -> None:
    """Unary-request StreamingOutputCall: 1st response at once, 2nd after 3 s; 500 ms deadline.

    (SimpleRequest has no delay field, so this is the unary-shaped deadline test.)
    """
    params = [c.m.ResponseParameters(size=7), c.m.ResponseParameters(size=8, interval_us=3_000_000)]
    call = c.stub().StreamingOutputCall(c.m.StreamingOutputCallRequest(response_parameters=params), timeout=0.5)
    first = next(call)
    check(len(first.payload.body) == 7, "wrong first response")
    expect_rpc_error(lambda: list(call), grpc.StatusCode.DEADLINE_EXCEEDED)


@case
def deadline_not_exceeded(c: Context) -> None:
    """Short server delays (3 x 50 ms) within a generous deadline complete normally."""
    call = c.stub().StreamingOutputCall(c.streaming([1, 2, 3], interval_us=50_000), timeout=c.timeout)
    check([len(r.payload.body) for r in call] == [1, 2, 3], "wrong responses")


@case
def timeout_on_sleeping_server(c: Context) -> None:
    """The interop case: FullDuplexCall, 1 ms deadline, one request asking for nothing, no half-close."""
    feeder = RequestFeeder()
    feeder.send(c.streaming(payload=c.payload(27182)))
    call = c.stub().FullDuplexCall(iter(feeder), timeout=0.001)
    try:
        expect_rpc_error(lambda: list(call), grpc.StatusCode.DEADLINE_EXCEEDED)
    finally:
        feeder.close()


# --- cancellation ------------------------------------------------------------


@case
def cancel_after_begin(c: Context) -> None:
    """StreamingInputCall cancelled before any request: CANCELLED, server still serves."""
    stub = c.stub()
    feeder = RequestFeeder()
    future = stub.StreamingInputCall.future(iter(feeder), timeout=c.timeout)
    future.cancel()
    feeder.close()
    check(future.cancelled() or future.code() == grpc.StatusCode.CANCELLED, f"status {future.code()}")
    stub.EmptyCall(c.pb.messages.Empty(), timeout=c.timeout)


@case
def cancel_after_first_response(c: Context) -> None:
    """FullDuplexCall cancelled after one response: CANCELLED, server still serves."""
    stub = c.stub()
    feeder = RequestFeeder()
    call = stub.FullDuplexCall(iter(feeder), timeout=c.timeout)
    try:
        feeder.send(c.streaming([31415], payload=c.payload(27182)))
        check(len(next(call).payload.body) == 31415, "wrong first response")
        call.cancel()
        expect_rpc_error(lambda: next(call), grpc.StatusCode.CANCELLED)
    finally:
        feeder.close()
    stub.EmptyCall(c.pb.messages.Empty(), timeout=c.timeout)


# --- status codes and messages -----------------------------------------------


@case
def status_code_and_message(c: Context) -> None:
    """EchoStatus(2, msg) via UnaryCall and FullDuplexCall -> UNKNOWN with that exact message."""
    echo = c.m.EchoStatus(code=2, message="test status message")
    stub = c.stub()
    expect_rpc_error(
        lambda: stub.UnaryCall(c.simple(response_status=echo), timeout=c.timeout),
        grpc.StatusCode.UNKNOWN,
        echo.message,
    )
    call = stub.FullDuplexCall(iter([c.streaming(response_status=echo)]), timeout=c.timeout)
    expect_rpc_error(lambda: list(call), grpc.StatusCode.UNKNOWN, echo.message)


@case
def special_status_message(c: Context) -> None:
    """Whitespace, BMP and non-BMP characters survive the grpc-message percent-encoding."""
    echo = c.m.EchoStatus(code=2, message=SPECIAL_MESSAGE)
    expect_rpc_error(
        lambda: c.stub().UnaryCall(c.simple(response_status=echo), timeout=c.timeout),
        grpc.StatusCode.UNKNOWN,
        SPECIAL_MESSAGE,
    )


@case
def status_codes_all(c: Context) -> None:
    """Every non-OK code 1..16, each with a message full of characters that need escaping."""
    stub = c.stub()
    for status in grpc.StatusCode:
        code = status.value[0]
        if code == 0:
            continue
        message = f"code {code}: 100% \u00fcn\u00efc\u00f6d\u00e9 %41 \u2603 \U0001f600 \"quoted\"\\"
        echo = c.m.EchoStatus(code=code, message=message)
        expect_rpc_error(
            lambda: stub.UnaryCall(c.simple(response_status=echo), timeout=c.timeout), status, message
        )


# --- big messages ------------------------------------------------------------


@case
def huge_unary(c: Context) -> None:
    """UnaryCall with a 16 MiB request and a 16 MiB response."""
    body = bytes(range(256)) * (HUGE // 256)  # not all zeros: exercises real payload bytes
    req = c.m.SimpleRequest(payload=c.m.Payload(body=body), response_size=HUGE)
    reply = c.stub().UnaryCall(req, timeout=max(c.timeout, 120.0))
    check(len(reply.payload.body) == HUGE, f"response body length {len(reply.payload.body)}")
    check(reply.payload.body == bytes(HUGE), "response body is not all zeros")


# --- compression (wire-checked through the sniffing proxy) --------------------


def only_message(messages: list, what: str):
    check(len(messages) == 1, f"saw {len(messages)} {what} messages on the wire, want 1")
    return messages[0]


@case
def client_compressed_unary(c: Context) -> None:
    """gzip-compressed request with expect_compressed=true is accepted; wire flag set."""
    stub, proxy = c.sniffed_stub()
    req = c.simple(LARGE_REQUEST, LARGE_RESPONSE, expect_compressed=c.m.BoolValue(value=True))
    reply = stub.UnaryCall(req, compression=grpc.Compression.Gzip, timeout=c.timeout)
    check(len(reply.payload.body) == LARGE_RESPONSE, "wrong response size")
    (conn,) = proxy.connections()
    wire = only_message(conn.to_server(), "request")
    check(wire.compressed, "request message was not compressed on the wire")
    check(wire.wire_length < LARGE_REQUEST // 10, f"compressed request is {wire.wire_length} bytes")
    check(wire.digest == h2sniff.digest(req.SerializeToString()), "request did not decompress to what was sent")


@case
def client_uncompressed_unary(c: Context) -> None:
    """Without call compression the request goes out plain and expect_compressed=false is accepted."""
    stub, proxy = c.sniffed_stub()
    req = c.simple(LARGE_REQUEST, LARGE_RESPONSE, expect_compressed=c.m.BoolValue(value=False))
    reply = stub.UnaryCall(req, timeout=c.timeout)
    check(len(reply.payload.body) == LARGE_RESPONSE, "wrong response size")
    (conn,) = proxy.connections()
    check(not only_message(conn.to_server(), "request").compressed, "request was compressed")


@case
def expect_compressed_rejects_uncompressed(c: Context) -> None:
    """The interop feature probe: expect_compressed=true on a plain request -> INVALID_ARGUMENT."""
    req = c.simple(LARGE_REQUEST, LARGE_RESPONSE, expect_compressed=c.m.BoolValue(value=True))
    expect_rpc_error(lambda: c.stub().UnaryCall(req, timeout=c.timeout), grpc.StatusCode.INVALID_ARGUMENT)


@case
def server_compressed_unary(c: Context) -> None:
    """response_compressed=true -> gzip response on the wire; false -> plain response."""
    for want in (True, False):
        stub, proxy = c.sniffed_stub()
        req = c.simple(LARGE_REQUEST, LARGE_RESPONSE, response_compressed=c.m.BoolValue(value=want))
        reply = stub.UnaryCall(req, timeout=c.timeout)
        check(reply.payload.body == bytes(LARGE_RESPONSE), "wrong response body")
        (conn,) = proxy.connections()
        wire = only_message(conn.to_client, "response")
        check(wire.compressed == want, f"response_compressed={want} but wire compressed flag is {wire.compressed}")
        check(wire.digest == h2sniff.digest(reply.SerializeToString()), "response bytes mismatch")


@case
def compressed_both_ways_streaming(c: Context) -> None:
    """Channel-wide gzip on a ping-pong FullDuplexCall with per-response compressed flags."""
    stub, proxy = c.sniffed_stub()
    feeder = RequestFeeder()
    call = stub.FullDuplexCall(iter(feeder), compression=grpc.Compression.Gzip, timeout=c.timeout)
    flags = [True, False, True]
    try:
        for i, want in enumerate(flags):
            param = c.m.ResponseParameters(size=50000 + i, compressed=c.m.BoolValue(value=want))
            feeder.send(c.m.StreamingOutputCallRequest(response_parameters=[param], payload=c.payload(40000)))
            check(len(next(call).payload.body) == 50000 + i, "wrong response size")
    finally:
        feeder.close()
    check(not list(call), "unexpected extra responses")
    (conn,) = proxy.connections()
    check(all(m.compressed for m in conn.to_server()), "some request messages were not compressed")
    got = [m.compressed for m in conn.to_client]
    check(got == flags, f"response compressed flags {got}, want {flags}")


# --- unimplemented -----------------------------------------------------------


@case
def unimplemented_method(c: Context) -> None:
    """TestService/UnimplementedCall -> UNIMPLEMENTED."""
    stub = c.stub()
    expect_rpc_error(
        lambda: stub.UnimplementedCall(c.pb.messages.Empty(), timeout=c.timeout), grpc.StatusCode.UNIMPLEMENTED
    )


@case
def unimplemented_service(c: Context) -> None:
    """UnimplementedService/UnimplementedCall -> UNIMPLEMENTED."""
    stub = c.pb.services.UnimplementedServiceStub(c.channel())
    expect_rpc_error(
        lambda: stub.UnimplementedCall(c.pb.messages.Empty(), timeout=c.timeout), grpc.StatusCode.UNIMPLEMENTED
    )


@case
def unknown_method_path(c: Context) -> None:
    """A method name the schema does not have at all -> UNIMPLEMENTED."""
    call = c.channel().unary_unary("/grpc.testing.TestService/NoSuchMethod")
    expect_rpc_error(lambda: call(b"", timeout=c.timeout), grpc.StatusCode.UNIMPLEMENTED)


# --- runner ------------------------------------------------------------------


def run_case(name: str, pb, target: str, rpc_timeout: float) -> tuple[bool, str]:
    ctx = Context(pb, target, rpc_timeout)
    try:
        CASES[name](ctx)
        return True, ""
    except CheckFailed as err:
        return False, str(err)
    except grpc.RpcError as err:
        return False, f"unexpected RPC error {err.code()}: {err.details()!r}"
    except Exception:  # noqa: BLE001 - report anything, keep going
        return False, traceback.format_exc().strip().replace("\n", "\n    ")
    finally:
        ctx.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", help="server address, HOST:PORT")
    ap.add_argument("--case", action="append", default=[], help="run only this case (repeatable)")
    ap.add_argument("--skip", action="append", default=[], help="skip this case (repeatable)")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--rpc-timeout", type=float, default=30.0, help="deadline for ordinary RPCs, seconds")
    args = ap.parse_args()

    if args.list:
        for name, fn in CASES.items():
            print(f"{name:40} {(fn.__doc__ or '').strip().splitlines()[0]}")
        return 0
    if not args.target:
        ap.error("--target is required")
    unknown = [n for n in args.case + args.skip if n not in CASES]
    if unknown:
        ap.error(f"unknown case(s): {', '.join(unknown)} (see --list)")

    pb = grpcio_stubs.load()
    names = [n for n in (args.case or CASES) if n not in args.skip]
    failed = []
    for name in names:
        started = time.monotonic()
        ok, why = run_case(name, pb, args.target, args.rpc_timeout)
        line = f"{'PASS' if ok else 'FAIL'} {name} ({time.monotonic() - started:.3f}s)"
        print(line if ok else f"{line}: {why}", flush=True)
        if not ok:
            failed.append(name)
    print(f"client_tests: {len(names) - len(failed)} passed, {len(failed)} failed" + (
        f" ({', '.join(failed)})" if failed else ""
    ), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
