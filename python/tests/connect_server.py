"""ConnectRPC's conformance suite, server side, with a Python application
behind the engine: the "server under test" that connectconformance
(--mode server) starts.

The runner writes one size-delimited ServerCompatRequest on stdin (TLS or
not, the client certificate to require, the message size limit). This
process starts `protoplane engine` with those settings and the conformance
schema (the repository's own declaration,
crates/grpc-conformance/proto/conformance.proto), attaches the
ConformanceService servicer below to it with the protoplane package, and
answers with a ServerCompatResponse naming the engine's port. The runner's
reference clients (connect-go and grpc-go) then call the engine. SIGTERM
ends the engine and this process.

The servicer is a plain grpcio servicer, written from the runner's
docs/testing_servers.md as protoplane's Rust adapter
(crates/grpc-conformance/src/server.rs) is: each answer echoes what the
server saw of the call (RequestInfo: the request metadata, the time left,
the requests as Anys) in its first response or, when the call fails first,
as an error detail.

    python connect_server.py            # PROTOPLANE_BIN names the engine's binary
"""

import base64
import os
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PROTO_DIR = ROOT / "crates" / "grpc-conformance" / "proto"
SERVICE = "connectrpc.conformance.v1.ConformanceService"


def _generate(out):
    from grpc_tools import protoc
    import grpc_tools

    wkt = Path(grpc_tools.__file__).parent / "_proto"
    rc = protoc.main(["protoc", f"-I{PROTO_DIR}", f"-I{wkt}", f"--python_out={out}",
                      f"--grpc_python_out={out}", str(PROTO_DIR / "conformance.proto")])
    if rc != 0:
        raise SystemExit("protoc failed on conformance.proto")
    sys.path.insert(0, str(out))


def _read_delimited(stream):
    prefix = stream.read(4)
    if len(prefix) < 4:
        raise SystemExit("stdin ended before a ServerCompatRequest arrived")
    (n,) = struct.unpack(">I", prefix)
    return stream.read(n)


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number, payload):
    """A length-delimited field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def rpc_status(code, message, details):
    """A serialized google.rpc.Status {code, message, details (Anys)}:
    what grpc-status-details-bin carries (written by hand: no package
    beyond protobuf and grpcio is needed)."""
    out = b""
    if code:
        out += _varint(1 << 3) + _varint(code)
    if message:
        out += _field(2, message.encode())
    for any_bytes in details:
        out += _field(3, any_bytes)
    return out


def make_servicer():
    import grpc
    from google.protobuf import any_pb2

    import conformance_pb2 as pb
    import conformance_pb2_grpc as pb_grpc

    codes = {c.value[0]: c for c in grpc.StatusCode}

    def metadata_of(headers):
        md = []
        for h in headers:
            name = h.name.lower()
            for v in h.value:
                if name.endswith("-bin"):
                    try:
                        v = base64.b64decode(v + "=" * (-len(v) % 4))
                    except ValueError:
                        v = v.encode()
                md.append((name, v))
        return md

    def headers_of(md):
        order, values = [], {}
        for k, v in md:
            if k not in values:
                order.append(k)
                values[k] = []
            if isinstance(v, bytes):
                v = base64.b64encode(v).decode().rstrip("=")
            values[k].append(v)
        return [pb.Header(name=k, value=values[k]) for k in order]

    class Seen:
        """What the server saw of the call, taken when the handler starts."""

        def __init__(self, context):
            self.headers = headers_of(context.invocation_metadata() or ())
            left = context.time_remaining()
            self.timeout_ms = None if left is None else int(left * 1000)

    def packed(request, type_name):
        # The request's bytes exactly as they arrived (unknown fields too).
        return any_pb2.Any(type_url=f"type.googleapis.com/connectrpc.conformance.v1.{type_name}",
                           value=request.SerializeToString())

    def info(seen, requests):
        ri = pb.ConformancePayload.RequestInfo(requests=requests)
        if seen is not None:
            ri.request_headers.extend(seen.headers)
            if seen.timeout_ms is not None:
                ri.timeout_ms = seen.timeout_ms
        return ri

    def response(cls, data, request_info=None):
        payload = pb.ConformancePayload(data=data)
        if request_info is not None:
            payload.request_info.CopyFrom(request_info)
        return cls(payload=payload)

    def fail(context, error, extra, trailers):
        details = [any_pb2.Any(type_url=d.type_url, value=d.value).SerializeToString()
                   for d in error.details]
        if extra is not None:
            details.append(any_pb2.Any(
                type_url="type.googleapis.com/connectrpc.conformance.v1.ConformancePayload.RequestInfo",
                value=extra.SerializeToString()).SerializeToString())
        message = error.message if error.HasField("message") else ""
        trailing = list(trailers)
        trailing.append(("grpc-status-details-bin", rpc_status(error.code, message, details)))
        context.set_trailing_metadata(trailing)
        context.abort(codes.get(error.code, grpc.StatusCode.UNKNOWN), message)

    def headers_now(context, definition):
        md = metadata_of(definition.response_headers)
        context.send_initial_metadata(md)

    def answer_once(context, definition, seen, requests, cls):
        if definition is None:
            return response(cls, b"", info(seen, requests))
        headers_now(context, definition)
        trailers = metadata_of(definition.response_trailers)
        if definition.WhichOneof("response") == "error":
            extra = info(seen, requests)
            time.sleep(definition.response_delay_ms / 1000)
            fail(context, definition.error, extra, trailers)
        data = definition.response_data if definition.WhichOneof("response") == "response_data" else b""
        out = response(cls, data, info(seen, requests))
        time.sleep(definition.response_delay_ms / 1000)
        context.set_trailing_metadata(trailers)
        return out

    def stream_rest(context, definition, seen, requests, sent, cls):
        while sent < len(definition.response_data):
            ri = info(seen, requests) if sent == 0 else None
            out = response(cls, definition.response_data[sent], ri)
            time.sleep(definition.response_delay_ms / 1000)
            yield out
            sent += 1
        trailers = metadata_of(definition.response_trailers)
        if definition.HasField("error"):
            extra = info(seen, requests) if sent == 0 else None
            fail(context, definition.error, extra, trailers)
        context.set_trailing_metadata(trailers)

    class Conformance(pb_grpc.ConformanceServiceServicer):
        def Unary(self, request, context):
            seen = Seen(context)
            d = request.response_definition if request.HasField("response_definition") else None
            return answer_once(context, d, seen, [packed(request, "UnaryRequest")], pb.UnaryResponse)

        def IdempotentUnary(self, request, context):
            seen = Seen(context)
            d = request.response_definition if request.HasField("response_definition") else None
            return answer_once(context, d, seen, [packed(request, "IdempotentUnaryRequest")],
                               pb.IdempotentUnaryResponse)

        def ClientStream(self, request_iterator, context):
            seen = Seen(context)
            d, requests = None, []
            for r in request_iterator:
                if not requests and r.HasField("response_definition"):
                    # Only the first request's definition counts.
                    d = r.to_pb2().response_definition
                requests.append(packed(r, "ClientStreamRequest"))
            return answer_once(context, d, seen, requests, pb.ClientStreamResponse)

        def ServerStream(self, request, context):
            seen = Seen(context)
            if not request.HasField("response_definition"):
                return
            d = request.to_pb2().response_definition
            requests = [packed(request, "ServerStreamRequest")]
            headers_now(context, d)
            yield from stream_rest(context, d, seen, requests, 0, pb.ServerStreamResponse)

        def BidiStream(self, request_iterator, context):
            seen = Seen(context)
            d, full_duplex, first, sent, requests = None, False, True, 0, []
            for r in request_iterator:
                requests.append(packed(r, "BidiStreamRequest"))
                if first:
                    first = False
                    if r.HasField("response_definition"):
                        d = r.to_pb2().response_definition
                    full_duplex = r.full_duplex
                    if d is not None and full_duplex:
                        headers_now(context, d)
                if not full_duplex:
                    continue
                # Full duplex: one response per request while there are
                # responses to send; then the error, if any, ends the call.
                if d is None or sent >= len(d.response_data):
                    break
                ri = info(seen, requests) if sent == 0 else info(None, requests)
                out = response(pb.BidiStreamResponse, d.response_data[sent], ri)
                time.sleep(d.response_delay_ms / 1000)
                yield out
                sent += 1
                requests = []
            if d is None:
                return
            if not full_duplex:
                # Half duplex: nothing goes out before the upload is complete.
                headers_now(context, d)
            yield from stream_rest(context, d, seen, requests, sent, pb.BidiStreamResponse)

    return Conformance()


def main():
    work = Path(tempfile.mkdtemp(prefix="pp-connect-py."))
    _generate(work)
    import conformance_pb2 as pb
    import protoplane

    req = pb.ServerCompatRequest.FromString(_read_delimited(sys.stdin.buffer))
    if req.protocol != pb.PROTOCOL_GRPC:
        raise SystemExit(f"protocol {req.protocol}: this server speaks gRPC only")
    engine = [os.environ.get("PROTOPLANE_BIN") or str(ROOT / "target" / "release" / "protoplane"),
              "engine", "--grpc-port", "0", "--attach", str(work / "engine.sock"),
              "--proto", str(PROTO_DIR / "conformance.proto"), "-I", str(PROTO_DIR),
              "--shutdown-grace", "1"]
    if req.message_receive_limit:
        engine += ["--max-recv-message", str(req.message_receive_limit)]
    if req.use_tls:
        (work / "server.pem").write_bytes(req.server_creds.cert)
        (work / "server.key").write_bytes(req.server_creds.key)
        engine += ["--tls_cert", str(work / "server.pem"), "--tls_key", str(work / "server.key")]
        if req.client_tls_cert:
            (work / "client-ca.pem").write_bytes(req.client_tls_cert)
            engine += ["--tls_client_ca", str(work / "client-ca.pem")]
    err_path = work / "engine.stderr"
    with open(work / "engine.stdout", "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(engine, stdout=out, stderr=err, stdin=subprocess.DEVNULL)

    def stop(*_):
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    port = None
    deadline = time.monotonic() + 30
    while port is None and time.monotonic() < deadline:
        for line in (work / "engine.stdout").read_text().splitlines():
            if line.startswith("grpc listening on "):
                port = int(line.rsplit(":", 1)[1])
        if proc.poll() is not None:
            raise SystemExit(f"the engine exited: {err_path.read_text()}")
        time.sleep(0.05)
    if port is None:
        raise SystemExit("the engine did not listen within 30 s")

    app = protoplane.attach(str(work / "engine.sock"), max_workers=16)
    import conformance_pb2_grpc as pb_grpc
    pb_grpc.add_ConformanceServiceServicer_to_server(make_servicer(), app)
    threading.Thread(target=app.serve, daemon=True).start()
    while f"attached for {SERVICE}" not in err_path.read_text():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit(f"the servicer did not attach: {err_path.read_text()}")
        time.sleep(0.05)

    resp = pb.ServerCompatResponse(host="127.0.0.1", port=port)
    if req.use_tls:
        resp.pem_cert = req.server_creds.cert
    data = resp.SerializeToString()
    sys.stdout.buffer.write(struct.pack(">I", len(data)) + data)
    sys.stdout.buffer.flush()
    print(f"protoplane python conformance server on 127.0.0.1:{port} (tls: {req.use_tls})",
          file=sys.stderr, flush=True)
    proc.wait()
    stop()


if __name__ == "__main__":
    main()
