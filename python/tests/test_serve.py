"""grpcio clients against the engine with a grpcio servicer attached from
Python: every call kind, every field kind read through the request views,
statuses, metadata, deadlines, blocking handlers, views read after their
call, and processes that die."""

import threading
import time

import grpc
import pytest

from conftest import App, attach, wait_for


def full_request():
    import pptest_pb2 as pb

    r = pb.Req(
        id=-7, text="héllo", blob=b"\x00\xffbytes", ratio=2.5, flag=True, color=pb.BLUE,
        inner=pb.Inner(name="in", values=[1, -2, 3]),
        items=[pb.Inner(name="a", values=[1]), pb.Inner(name="b")],
        counts={"x": 1, "y": -(2**40)}, by_id={7: pb.Inner(name="seven", values=[7])},
        number=42, maybe=0, tags=["t1", "t2", "t3"], big=2**64 - 1, f=1.5, neg=-99,
    )
    return r


def test_every_field_reads_as_pb2_reads_it(stub):
    import pptest_pb2 as pb
    from pptest_servicer import describe

    for req in (full_request(), pb.Req(), pb.Req(word="w", text="only")):
        reply = stub.Describe(req, timeout=10)
        assert reply.summary == describe(req)
        assert reply.total == req.id


def test_request_converts_to_pb2(stub):
    from pptest_servicer import describe

    req = full_request()
    req.action = "pb2"
    reply = stub.Describe(req, timeout=10)
    assert reply.summary == "Req " + describe(req)


def test_nested_messages_serialize_alone(stub):
    req = full_request()
    req.action = "nested"
    want = "/".join([req.inner.SerializeToString().hex(), req.items[0].SerializeToString().hex(),
                     repr(req.inner.name), str(req.inner.ByteSize())])
    assert stub.Describe(req, timeout=10).summary == want


def test_server_streaming(stub):
    import pptest_pb2 as pb

    replies = list(stub.Count(pb.Req(id=50, text="s"), timeout=10))
    assert [r.total for r in replies] == list(range(50))
    assert all(r.summary == "s" for r in replies)
    with pytest.raises(grpc.RpcError) as e:
        list(stub.Count(pb.Req(id=3, action="fail"), timeout=10))
    assert e.value.code() == grpc.StatusCode.ABORTED


def test_client_streaming(stub):
    import pptest_pb2 as pb

    reqs = [pb.Req(id=i, text=str(i)) for i in range(20)]
    reply = stub.Sum(iter(reqs), timeout=10)
    assert reply.total == sum(range(20))
    assert reply.summary == ",".join(str(i) for i in range(20))
    assert stub.Sum(iter([]), timeout=10).total == 0


def test_bidirectional(stub):
    import pptest_pb2 as pb

    out = list(stub.Chat(iter(pb.Req(id=i, text=f"m{i}") for i in range(10)), timeout=10))
    assert [(r.summary, r.total) for r in out] == [(f"M{i}", 2 * i) for i in range(10)]


def test_statuses(stub):
    import pptest_pb2 as pb

    with pytest.raises(grpc.RpcError) as e:
        stub.Describe(pb.Req(action="fail"), timeout=10)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert e.value.details() == "failed as asked"
    md = dict(e.value.trailing_metadata())
    assert md["why"] == "asked" and md["why-bin"] == b"\x00\x01"

    with pytest.raises(grpc.RpcError) as e:
        stub.Describe(pb.Req(action="raise"), timeout=10)
    assert e.value.code() == grpc.StatusCode.UNKNOWN
    assert "Exception calling application" in e.value.details()

    with pytest.raises(grpc.RpcError) as e:
        stub.Describe(pb.Req(action="code"), timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and e.value.details() == "not here"

    with pytest.raises(grpc.RpcError) as e:
        stub.Describe(pb.Req(action="none"), timeout=10)
    assert e.value.code() == grpc.StatusCode.INTERNAL


def test_metadata_both_ways(stub):
    import pptest_pb2 as pb

    reply, call = stub.Describe.with_call(
        pb.Req(action="metadata"), timeout=10,
        metadata=(("x-echo", "hi"), ("x-echo-bin", b"\x01\x02")))
    assert dict(call.initial_metadata())["initial"] == "hi"
    assert dict(call.trailing_metadata())["trailing-bin"] == b"\x01\x02"
    # The client's address, as grpcio prints one (the engine notes it
    # once per connection).
    assert reply.summary.startswith(("peer=ipv4:127.0.0.1:", "peer=ipv6:")), reply.summary


def test_deadline_reaches_the_handler(stub):
    import pptest_pb2 as pb

    assert stub.Describe(pb.Req(action="deadline"), timeout=20).summary == "left=True"
    t = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        stub.Describe(pb.Req(action="sleep", ratio=5.0), timeout=0.3)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - t < 3


def test_a_blocked_handler_does_not_stall_others(stub):
    import pptest_pb2 as pb

    slow = stub.Describe.future(pb.Req(action="sleep", ratio=2.0), timeout=10)
    time.sleep(0.1)
    t = time.monotonic()
    for i in range(20):
        assert stub.Describe(pb.Req(id=i), timeout=10).total == i
    assert time.monotonic() - t < 1.5, "quick calls waited for the sleeping one"
    assert slow.result().summary == "slept active=True"


def test_a_view_read_after_its_call_raises(stub):
    import pptest_pb2 as pb

    assert stub.Describe(pb.Req(action="keep", text="gone"), timeout=10).summary == "kept"
    assert stub.Describe(pb.Req(action="read-kept"), timeout=10).summary == "raised CallEnded"


def test_many_calls_in_flight(stub):
    import pptest_pb2 as pb

    futs = [stub.Describe.future(pb.Req(id=i, text=str(i)), timeout=20) for i in range(300)]
    assert [f.result().total for f in futs] == list(range(300))


def test_unknown_method_is_unimplemented(served):
    ch = grpc.insecure_channel(f"127.0.0.1:{served.port}")
    call = ch.unary_unary("/pptest.Tester/Nope")
    with pytest.raises(grpc.RpcError) as e:
        call(b"", timeout=5)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    ch.close()


def test_a_dead_application_fails_its_calls_and_the_engine_goes_on(engine, gen_dir):
    import pptest_pb2 as pb
    import pptest_pb2_grpc

    app = attach(engine, gen_dir, "pptest_servicer:Tester")
    ch = grpc.insecure_channel(f"127.0.0.1:{engine.port}")
    stub = pptest_pb2_grpc.TesterStub(ch)
    slow = stub.Describe.future(pb.Req(action="sleep", ratio=20.0), timeout=30)
    time.sleep(0.3)
    app.proc.kill()
    app.proc.wait()
    with pytest.raises(grpc.RpcError) as e:
        slow.result()
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.RpcError) as e:
        stub.Describe(pb.Req(id=1), timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    # A new process takes over; the engine never stopped.
    app2 = attach(engine, gen_dir, "pptest_servicer:Tester", count=2)
    assert stub.Describe(pb.Req(id=5), timeout=10).total == 5
    app2.stop()
    ch.close()


def test_the_application_attaches_again_after_the_engine_restarts(tmp_path, gen_dir):
    import pptest_pb2 as pb
    import pptest_pb2_grpc
    from conftest import Engine

    engine = Engine(tmp_path).start()
    app = attach(engine, gen_dir, "pptest_servicer:Tester")
    try:
        port = engine.port
        engine.stop()
        engine.port = port
        engine.start()
        wait_for(lambda: engine.attached("pptest.Tester"), 30, "attaching again", app.proc)
        ch = grpc.insecure_channel(f"127.0.0.1:{engine.port}")
        reply = pptest_pb2_grpc.TesterStub(ch).Describe(pb.Req(id=9), timeout=10)
        assert reply.total == 9
        ch.close()
    finally:
        app.stop()
        engine.stop()


def test_a_hung_application_is_cut_off_and_the_engine_goes_on(tmp_path, gen_dir):
    import signal

    import pptest_pb2 as pb
    import pptest_pb2_grpc
    from conftest import Engine

    engine = Engine(tmp_path, extra=["--stall-timeout-ms", "500"]).start()
    app = attach(engine, gen_dir, "pptest_servicer:Tester")
    ch = grpc.insecure_channel(f"127.0.0.1:{engine.port}")
    stub = pptest_pb2_grpc.TesterStub(ch)
    try:
        assert stub.Describe(pb.Req(id=1), timeout=10).total == 1
        app.proc.send_signal(signal.SIGSTOP)  # hangs: alive, takes nothing
        # Stopped for certain before the next call (else it may still take
        # the request and then hang with it, which only its deadline ends).
        wait_for(lambda: open(f"/proc/{app.proc.pid}/stat").read().rsplit(")", 1)[1].split()[0]
                 in ("T", "t"), 10, "the application stopping")
        t = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            stub.Describe(pb.Req(id=2), timeout=20)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - t < 10
        app2 = attach(engine, gen_dir, "pptest_servicer:Tester", count=2)
        assert stub.Describe(pb.Req(id=3), timeout=10).total == 3
        app2.stop()
    finally:
        app.proc.send_signal(signal.SIGKILL)
        app.proc.wait()
        ch.close()
        engine.stop()
