#!/usr/bin/env python3
"""The engine's per-call policy, seen by grpcio clients.

Usage::

    policy_client.py --write-config FILE      # POLICY_BEFORE, to start the engine with
    policy_client.py --target HOST:PORT --config FILE --admin SOCK --protoplane PATH

The engine at HOST:PORT was started with ``--config FILE`` holding
``POLICY_BEFORE`` (below) and ``--admin SOCK``, with the interop service
attached.  Checks, one ``PASS``/``FAIL`` line each:

* a rule denies UnaryCall to ``x-tenant: guest`` (PERMISSION_DENIED) and
  lets ``x-tenant: staff`` through;
* a rate limit of EmptyCall refuses the third call of a burst of two with
  RESOURCE_EXHAUSTED and a ``google.rpc.RetryInfo`` detail in
  ``grpc-status-details-bin``;
* a concurrency limit of one FullDuplexCall refuses a second stream;
* the file is rewritten (``POLICY_AFTER``) and ``protoplane admin SOCK
  reload`` installs it while the first stream stays open: the stream is
  answered again, a second stream is admitted, EmptyCall is denied.

Exit status 1 if anything failed.
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True

import argparse
import queue
import subprocess
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc  # noqa: E402

import grpcio_stubs  # noqa: E402

POLICY_BEFORE = """
[[policy.rules]]
action = "deny"
methods = ["/grpc.testing.TestService/UnaryCall"]
clients = ["metadata:x-tenant=guest"]

[policy.limits."/grpc.testing.TestService/EmptyCall"]
rate = 0.2
burst = 2

[policy.limits."/grpc.testing.TestService/FullDuplexCall"]
concurrency = 1
"""

POLICY_AFTER = """
[[policy.rules]]
action = "deny"
methods = ["/grpc.testing.TestService/EmptyCall"]

[policy.limits."/grpc.testing.TestService/FullDuplexCall"]
concurrency = 2
"""

TIMEOUT = 10.0


def varint(b: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        x = b[i]
        i += 1
        n |= (x & 0x7F) << shift
        shift += 7
        if x < 0x80:
            return n, i


def fields(b: bytes):
    """(field number, wire type, value) of a protobuf message's fields."""
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(b, i)
        elif wt == 2:
            n, i = varint(b, i)
            v, i = b[i:i + n], i + n
        else:
            raise ValueError(f"wire type {wt}")
        yield num, wt, v


def detail_types(err: grpc.RpcError) -> list[str]:
    """The type URLs of the details in google.rpc.Status (trailer)."""
    for key, value in err.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            out = []
            for num, _, any_ in fields(value):
                if num == 3:
                    out += [v.decode() for n, _, v in fields(any_) if n == 1]
            return out
    return []


class Stream:
    """A FullDuplexCall fed one message at a time."""

    def __init__(self, stub, m) -> None:
        self.q: queue.Queue = queue.Queue()
        self.m = m
        self.responses = stub.FullDuplexCall(iter(self.q.get, None), timeout=60)

    def ping(self):
        self.q.put(self.m.StreamingOutputCallRequest(
            response_parameters=[self.m.ResponseParameters(size=1)]))
        return next(self.responses)

    def close(self) -> None:
        self.q.put(None)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write-config")
    ap.add_argument("--target")
    ap.add_argument("--config")
    ap.add_argument("--admin")
    ap.add_argument("--protoplane")
    args = ap.parse_args()
    if args.write_config:
        Path(args.write_config).write_text(POLICY_BEFORE)
        return 0
    if not (args.target and args.config and args.admin and args.protoplane):
        ap.error("--target, --config, --admin and --protoplane go together")
    pb = grpcio_stubs.load()
    m = pb.messages
    channel = grpc.insecure_channel(args.target)
    stub = pb.services.TestServiceStub(channel)
    failed = 0

    def check(name: str, fn) -> None:
        nonlocal failed
        try:
            fn()
            print(f"PASS policy {name}")
        except Exception as e:  # noqa: BLE001 - report and go on
            failed += 1
            print(f"FAIL policy {name}: {e!r}")

    def code_of(fn) -> grpc.StatusCode:
        try:
            fn()
            return grpc.StatusCode.OK
        except grpc.RpcError as e:
            return e.code()

    def deny_by_metadata():
        guest = code_of(lambda: stub.UnaryCall(
            m.SimpleRequest(), metadata=[("x-tenant", "guest")], timeout=TIMEOUT))
        assert guest == grpc.StatusCode.PERMISSION_DENIED, guest
        stub.UnaryCall(m.SimpleRequest(), metadata=[("x-tenant", "staff")], timeout=TIMEOUT)

    def rate_limit():
        for _ in range(2):
            stub.EmptyCall(m.Empty(), timeout=TIMEOUT)
        try:
            stub.EmptyCall(m.Empty(), timeout=TIMEOUT)
            raise AssertionError("the third call of a burst of two went through")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.code()
            types = detail_types(e)
            assert any(t.endswith("google.rpc.RetryInfo") for t in types), types

    held = Stream(stub, m)

    def concurrency_limit():
        held.ping()
        second = Stream(stub, m)
        try:
            second.ping()
            raise AssertionError("a second stream went through")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.code()
        finally:
            second.close()

    def reload_keeps_the_stream():
        Path(args.config).write_text(POLICY_AFTER)
        out = subprocess.run([args.protoplane, "admin", args.admin, "reload"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and out.stdout.startswith("ok"), out.stdout + out.stderr
        held.ping()
        second = Stream(stub, m)
        second.ping()
        second.close()
        denied = code_of(lambda: stub.EmptyCall(m.Empty(), timeout=TIMEOUT))
        assert denied == grpc.StatusCode.PERMISSION_DENIED, denied

    check("deny by method and metadata", deny_by_metadata)
    check("rate limit with RetryInfo", rate_limit)
    check("concurrency limit", concurrency_limit)
    check("reload with a stream open", reload_keeps_the_stream)
    held.close()
    channel.close()
    print(f"policy_client: {4 - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
