"""Servicers of the package's test service, written as plain grpcio
servicers (sync and async): what `python -m protoplane.serve` attaches in
the tests. `describe` is the one function both the handler (reading a view)
and the test (reading the `*_pb2` it sent) run, so any field read wrong
shows as a different summary."""

import asyncio
import threading
import time

import grpc

import pptest_pb2
import pptest_pb2_grpc

# A request kept past its call (action "keep"), read by a later call.
_kept = []
_lock = threading.Lock()


def describe(r):
    """Every field of a Req, as text."""
    parts = [
        f"id={r.id}", f"text={r.text!r}", f"blob={bytes(r.blob)!r}", f"ratio={r.ratio!r}",
        f"flag={r.flag}", f"color={r.color}", f"inner.name={r.inner.name!r}",
        f"inner.values={list(r.inner.values)}", f"has_inner={r.HasField('inner')}",
        f"items={[(i.name, list(i.values)) for i in r.items]}",
        f"counts={sorted(dict(r.counts).items())}",
        f"by_id={sorted((k, v.name, list(v.values)) for k, v in dict(r.by_id).items())}",
        f"choice={r.WhichOneof('choice')}", f"word={r.word!r}", f"number={r.number}",
        f"has_maybe={r.HasField('maybe')}", f"maybe={r.maybe}", f"tags={list(r.tags)}",
        f"big={r.big}", f"f={r.f!r}", f"neg={r.neg}", f"len_items={len(r.items)}",
        f"last_tag={r.tags[-1] if len(r.tags) else None!r}",
    ]
    return " ".join(parts)


def _act(request, context):
    """Shared by sync and async handlers: what `action` asks for, except sleeping."""
    a = request.action
    if a == "fail":
        context.set_trailing_metadata((("why", "asked"), ("why-bin", b"\x00\x01")))
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "failed as asked")
    if a == "raise":
        raise KeyError("boom")
    if a == "code":
        context.set_code(grpc.StatusCode.NOT_FOUND)
        context.set_details("not here")
        return pptest_pb2.Reply()
    if a == "none":
        return None
    if a == "metadata":
        md = dict(context.invocation_metadata())
        context.send_initial_metadata((("initial", md.get("x-echo", "")),))
        context.set_trailing_metadata((("trailing-bin", md.get("x-echo-bin", b"")),))
        return pptest_pb2.Reply(summary=f"peer={context.peer()}")
    if a == "keep":
        with _lock:
            _kept.append(request)
        return pptest_pb2.Reply(summary="kept")
    if a == "read-kept":
        with _lock:
            old = _kept.pop()
        try:
            return pptest_pb2.Reply(summary=f"read {old.text!r}")
        except Exception as e:  # noqa: BLE001 - the test wants the exception's name
            return pptest_pb2.Reply(summary=f"raised {type(e).__name__}")
    if a == "deadline":
        left = context.time_remaining()
        return pptest_pb2.Reply(summary=f"left={left is not None and 0 < left <= 30}")
    if a == "nested":
        inner, first = request.inner, request.items[0]
        return pptest_pb2.Reply(summary="/".join([
            inner.SerializeToString().hex(), first.SerializeToString().hex(),
            repr(inner.to_pb2().name), str(inner.ByteSize())]))
    if a == "pb2":
        msg = request.to_pb2() if hasattr(request, "to_pb2") else request
        return pptest_pb2.Reply(summary=type(msg).__name__ + " " + describe(msg))
    return None


class Tester(pptest_pb2_grpc.TesterServicer):
    def Describe(self, request, context):
        if request.action == "sleep":
            end = time.monotonic() + request.ratio
            while time.monotonic() < end and context.is_active():
                time.sleep(0.01)
            return pptest_pb2.Reply(summary=f"slept active={context.is_active()}")
        if request.action:
            r = _act(request, context)
            if r is not None or request.action == "none":
                return r
        return pptest_pb2.Reply(summary=describe(request), total=request.id)

    def Count(self, request, context):
        for i in range(request.id):
            yield pptest_pb2.Reply(summary=request.text, total=i)
        if request.action == "fail":
            context.abort(grpc.StatusCode.ABORTED, "after the stream")

    def Sum(self, request_iterator, context):
        total, texts = 0, []
        for r in request_iterator:
            total += r.id
            texts.append(r.text)
        return pptest_pb2.Reply(summary=",".join(texts), total=total)

    def Chat(self, request_iterator, context):
        for r in request_iterator:
            yield pptest_pb2.Reply(summary=r.text.upper(), total=r.id * 2)


class AsyncTester(pptest_pb2_grpc.TesterServicer):
    async def Describe(self, request, context):
        if request.action == "sleep":
            end = time.monotonic() + request.ratio
            while time.monotonic() < end and context.is_active():
                await asyncio.sleep(0.01)
            return pptest_pb2.Reply(summary=f"slept active={context.is_active()}")
        if request.action:
            r = _act(request, context)
            if r is not None or request.action == "none":
                return r
        await asyncio.sleep(0)
        return pptest_pb2.Reply(summary=describe(request), total=request.id)

    async def Count(self, request, context):
        for i in range(request.id):
            await asyncio.sleep(0)
            yield pptest_pb2.Reply(summary=request.text, total=i)
        if request.action == "fail":
            context.abort(grpc.StatusCode.ABORTED, "after the stream")

    async def Sum(self, request_iterator, context):
        total, texts = 0, []
        async for r in request_iterator:
            total += r.id
            texts.append(r.text)
        return pptest_pb2.Reply(summary=",".join(texts), total=total)

    async def Chat(self, request_iterator, context):
        async for r in request_iterator:
            yield pptest_pb2.Reply(summary=r.text.upper(), total=r.id * 2)
