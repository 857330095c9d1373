"""grpcio servicers served by a protoplane engine.

``Server`` takes what grpcio's generated ``add_XServicer_to_server`` hands a
``grpc.Server`` (``add_generic_rpc_handlers`` and
``add_registered_method_handlers``), so a servicer is attached by changing
only the setup lines. Calls come from the native attachment
(``protoplane._native``), which runs on a Rust thread and never takes the
GIL; see that module for how calls reach Python and why.

Two ways to run handlers:

- ``serve()``: a pool of ``max_workers`` threads, each waiting for a call
  with the GIL released and running its handler to the end. A handler that
  blocks (I/O, ``time.sleep``) holds one thread; the others go on. Async
  handlers (``async def``) are run on an event loop of the pool's own.
- ``await serve_async()``: the calling event loop. The attachment writes
  one byte to a socket the loop watches when calls are waiting, and the
  loop takes them all in one go and starts a task per call. Sync handlers
  then run in a thread pool, as ``grpc.aio`` runs them.
"""

import asyncio
import inspect
import os
import socket
import sys
import threading
import time

import grpc

from . import _native

_UNKNOWN = grpc.StatusCode.UNKNOWN.value[0]
_INTERNAL = grpc.StatusCode.INTERNAL.value[0]
_OK = 0


class AbortError(Exception):
    """Raised by ``context.abort``: the handler ends with the status given."""


class _Method:
    __slots__ = ("name", "fn", "request_streaming", "response_streaming",
                 "deserialize", "serialize", "is_async")

    def __init__(self, name, handler, requests):
        self.name = name
        self.request_streaming = bool(handler.request_streaming)
        self.response_streaming = bool(handler.response_streaming)
        self.fn = {
            (False, False): handler.unary_unary,
            (False, True): handler.unary_stream,
            (True, False): handler.stream_unary,
            (True, True): handler.stream_stream,
        }[(self.request_streaming, self.response_streaming)]
        # Requests as views (read in place) unless the application asked for
        # `*_pb2` objects; a method without a deserializer gets bytes.
        des = handler.request_deserializer
        if des is None:
            self.deserialize = lambda view: view.SerializeToString()
        elif requests == "pb2":
            self.deserialize = lambda view, des=des: des(view.SerializeToString())
        else:
            self.deserialize = None
        self.serialize = handler.response_serializer
        self.is_async = inspect.iscoroutinefunction(self.fn) or inspect.isasyncgenfunction(self.fn)


def _code_number(code):
    if code is None:
        return _OK
    if isinstance(code, grpc.StatusCode):
        return code.value[0]
    return int(code)


class ServicerContext:
    """What grpcio's ``grpc.ServicerContext`` offers a handler."""

    __slots__ = ("_call", "_code", "_details", "_trailing", "_callbacks", "_loop")

    def __init__(self, call, flush_soon=None):
        self._call = call
        self._code = None
        self._details = ""
        self._trailing = ()
        self._callbacks = None
        # An event loop's way to hand finished calls over once per pass.
        self._loop = flush_soon

    # --- the call ---------------------------------------------------------
    def invocation_metadata(self):
        return self._call.metadata()

    def peer(self):
        return self._call.peer()

    def peer_identities(self):
        names = _cert_names(self._call.peer_certificates())
        return names or None

    def peer_identity_key(self):
        return "x509_common_name" if self.peer_identities() else None

    def auth_context(self):
        certs = self._call.peer_certificates()
        if not certs:
            return {}
        import ssl
        ctx = {
            "transport_security_type": [b"ssl"],
            "x509_pem_cert": [ssl.DER_cert_to_PEM_cert(certs[0]).encode()],
        }
        names = _cert_names(certs)
        if names:
            ctx["x509_common_name"] = names
        return ctx

    def time_remaining(self):
        return self._call.time_remaining()

    def is_active(self):
        return self._call.is_active()

    def add_callback(self, callback):
        if self._callbacks is None:
            self._callbacks = []
        self._callbacks.append(callback)
        return True

    def cancel(self):
        self.abort(grpc.StatusCode.CANCELLED, "cancelled by the server")

    # --- what goes back ---------------------------------------------------
    def send_initial_metadata(self, initial_metadata):
        for k, v in initial_metadata:
            self._call.add_initial_metadata(k, v)
        self._call.send_headers()

    def set_trailing_metadata(self, trailing_metadata):
        self._trailing = tuple(trailing_metadata)

    def trailing_metadata(self):
        return self._trailing

    def set_code(self, code):
        self._code = code

    def code(self):
        return self._code

    def set_details(self, details):
        self._details = details

    def details(self):
        return self._details

    def abort(self, code, details):
        if code == grpc.StatusCode.OK:
            raise ValueError("abort() needs a status other than OK")
        self._code = code
        self._details = details
        raise AbortError(details)

    def abort_with_status(self, status):
        self.set_trailing_metadata(tuple(self._trailing) + tuple(status.trailing_metadata or ()))
        self.abort(status.code, status.details)

    def set_compression(self, compression):
        pass

    def disable_next_message_compression(self):
        pass

    # --- ending -----------------------------------------------------------
    def _finish(self, response=None, default_code=_OK, default_details=""):
        code = _code_number(self._code) if self._code is not None else default_code
        details = self._details if self._code is not None else default_details
        if code != _OK:
            response = None
        if self._call.finish(code, details or "", self._trailing, response) == 2 and self._loop:
            self._loop()
        cbs, self._callbacks = self._callbacks, None
        for cb in cbs or ():
            try:
                cb()
            except Exception:  # as grpcio: a callback's failure is only logged
                print(f"protoplane: a call's callback raised: {sys.exc_info()[1]!r}",
                      file=sys.stderr)

    def _fail(self, exc):
        if isinstance(exc, AbortError) or (self._code is not None and _code_number(self._code) != _OK):
            self._finish()
        else:
            self._finish(default_code=_UNKNOWN,
                         default_details=f"Exception calling application: {exc}")


class _Done:
    """An awaitable that is already complete: what ``grpc.aio``'s context
    returns from the methods an async handler awaits (``await
    context.send_initial_metadata(...)``), while a sync handler may ignore
    it."""

    __slots__ = ()

    def __await__(self):
        return
        yield  # noqa: unreachable - makes this a generator


_DONE = _Done()


class AsyncServicerContext(ServicerContext):
    """The context of a call served on an event loop: ``grpc.aio``'s
    awaitable methods, done at once (nothing here waits)."""

    __slots__ = ()

    def send_initial_metadata(self, initial_metadata):
        ServicerContext.send_initial_metadata(self, initial_metadata)
        return _DONE

    def abort(self, code, details="", trailing_metadata=()):
        if trailing_metadata:
            self.set_trailing_metadata(trailing_metadata)
        ServicerContext.abort(self, code, details)

    def read(self):
        raise RuntimeError("read() is not supported: iterate over the request iterator")

    def write(self, message):
        raise RuntimeError("write() is not supported: yield responses")


def _cert_names(certs):
    """The leaf certificate's common names, where the `cryptography` package
    can read them."""
    if not certs:
        return []
    try:
        from cryptography import x509
        from cryptography.x509.oid import NameOID
    except ImportError:
        return []
    cert = x509.load_der_x509_certificate(certs[0])
    return [a.value.encode() for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]


class _Requests:
    """The requests of a client-streaming call, as an iterator (sync) or an
    async iterator (async handlers)."""

    __slots__ = ("_call", "_convert")

    def __init__(self, call, convert):
        self._call = call
        self._convert = convert

    def __iter__(self):
        return self

    def __next__(self):
        r = self._call.next_request()
        if r is None:
            raise StopIteration
        return self._convert(r)

    def __aiter__(self):
        return self

    async def __anext__(self):
        ok, r = self._call.try_next_request()
        if not ok:
            r = await asyncio.get_running_loop().run_in_executor(None, self._call.next_request)
        if r is None:
            raise StopAsyncIteration
        return self._convert(r)


def _identity(view):
    return view


class Server:
    """A protoplane application serving grpcio servicers (see ``attach``)."""

    def __init__(self, path, max_workers=None, requests="view", spin_us=50, nice=19):
        if requests not in ("view", "pb2"):
            raise ValueError('requests is "view" (read in place) or "pb2"')
        self._path = str(path)
        self._native = _native.Attachment(self._path, spin_us, nice)
        self._max_workers = max_workers or min(32, (os.cpu_count() or 1) + 4)
        self._requests = requests
        self._services = {}
        self._methods = []
        self._started = False
        self._threads = []
        self._stopped = threading.Event()
        self._aloop = None
        self._lock = threading.Lock()

    # --- what grpcio's generated code calls -------------------------------
    def add_generic_rpc_handlers(self, generic_rpc_handlers):
        for h in generic_rpc_handlers:
            handlers = getattr(h, "_method_handlers", None)
            name = h.service_name() if hasattr(h, "service_name") else None
            if handlers is None or name is None:
                raise TypeError(
                    "protoplane serves the handlers grpcio generates "
                    "(grpc.method_handlers_generic_handler); a custom GenericRpcHandler "
                    "cannot list its methods")
            self._add(name, {path.rsplit("/", 1)[1]: mh for path, mh in handlers.items()})

    def add_registered_method_handlers(self, service_name, method_handlers):
        self._add(service_name, dict(method_handlers))

    def add_servicer(self, servicer):
        """Registers a servicer without naming its ``add_XServicer_to_server``:
        the function is found beside the ``XServicer`` base class."""
        for cls in type(servicer).__mro__:
            mod = sys.modules.get(cls.__module__)
            fn = getattr(mod, f"add_{cls.__name__}_to_server", None) if mod else None
            if fn is not None:
                fn(servicer, self)
                return self
        raise TypeError(f"{type(servicer).__name__} derives from no generated *Servicer class")

    def add_insecure_port(self, address):
        raise RuntimeError("a protoplane application has no port: the engine listens "
                           "(protoplane engine --grpc-port ...)")

    def _add(self, name, handlers):
        if self._started:
            raise RuntimeError("servicers are added before serving")
        known = self._services.setdefault(name, {})
        for method, mh in handlers.items():
            known.setdefault(method, mh)

    # --- serving ----------------------------------------------------------
    def _register(self):
        from ._types import descriptor_set
        if self._started:
            raise RuntimeError("already serving")
        if not self._services:
            raise RuntimeError("no servicer added")
        for name, handlers in self._services.items():
            pairs = []
            for method, mh in handlers.items():
                pairs.append((method, len(self._methods)))
                self._methods.append(_Method(f"/{name}/{method}", mh, self._requests))
            shapes = self._native.add_service(name, descriptor_set(name), pairs)
            for (method, cs, ss), (_, i) in zip(shapes, pairs):
                m = self._methods[i]
                if (m.request_streaming, m.response_streaming) != (cs, ss):
                    raise TypeError(f"/{name}/{method}: the handler's streaming "
                                    f"({m.request_streaming}, {m.response_streaming}) is not "
                                    f"the schema's ({cs}, {ss})")
        self._started = True

    def start(self):
        """Attaches and starts the worker threads (grpcio's ``start``)."""
        self._register()
        self._native.start()
        for i in range(self._max_workers):
            t = threading.Thread(target=self._worker, name=f"protoplane-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def serve(self):
        """Serves until stopped (``stop()``, Ctrl-C) or refused by the engine."""
        self.start()
        try:
            self.wait_for_termination()
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()
        err = self._native.error()
        if err:
            raise RuntimeError(f"the engine refused the application: {err}")

    def wait_for_termination(self, timeout=None):
        """Blocks until serving ends; False if `timeout` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._native.ended():
            left = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
            if left <= 0:
                return False
            self._stopped.wait(left)
        return True

    def stop(self, grace=None):
        """Detaches: calls in progress are cancelled, waiting ones fail."""
        self._native.stop()
        self._stopped.set()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=grace if grace is not None else 5)
        self._threads = []
        if self._aloop is not None:
            self._aloop.call_soon_threadsafe(self._aloop.stop)

    # --- one call ---------------------------------------------------------
    def _worker(self):
        native = self._native
        while True:
            call = native.next_call(0.5)
            if call is None:
                if native.ended():
                    return
                continue
            m = self._methods[call.handler]
            if m.is_async:
                asyncio.run_coroutine_threadsafe(self._run_async(call, m), self._async_loop())
            else:
                self._run(call, m)

    def _async_loop(self):
        """An event loop for async handlers under the thread pool."""
        if self._aloop is None:
            with self._lock:
                if self._aloop is None:
                    loop = asyncio.new_event_loop()
                    threading.Thread(target=loop.run_forever, name="protoplane-async",
                                     daemon=True).start()
                    self._aloop = loop
        return self._aloop

    def _request(self, call, m):
        convert = m.deserialize or _identity
        if m.request_streaming:
            return _Requests(call, convert)
        return convert(call.request())

    def _run(self, call, m):
        ctx = ServicerContext(call)
        try:
            req = self._request(call, m)
            if not m.response_streaming:
                resp = m.fn(req, ctx)
                self._answer(ctx, m, resp)
                return
            for resp in m.fn(req, ctx):
                data = resp if isinstance(resp, (bytes, bytearray)) else m.serialize(resp)
                if not call.send(data):
                    break
            ctx._finish()
        except BaseException as e:  # noqa: BLE001 - every failure ends the call
            ctx._fail(e)
            if not isinstance(e, Exception):
                raise

    def _answer(self, ctx, m, resp):
        if resp is None:
            ctx._finish(default_code=_INTERNAL, default_details="Failed to serialize response!")
            return
        try:
            data = resp if isinstance(resp, (bytes, bytearray)) else m.serialize(resp)
        except Exception:
            ctx._finish(default_code=_INTERNAL, default_details="Failed to serialize response!")
            return
        ctx._finish(data)

    async def _run_async(self, call, m, flush_soon=None):
        ctx = AsyncServicerContext(call, flush_soon)
        try:
            req = self._request(call, m)
            if not m.response_streaming:
                if m.is_async:
                    resp = await m.fn(req, ctx)
                else:
                    resp = await asyncio.get_running_loop().run_in_executor(None, m.fn, req, ctx)
                self._answer(ctx, m, resp)
                return
            gen = m.fn(req, ctx)
            if inspect.isasyncgen(gen):
                async for resp in gen:
                    if not await self._send_async(call, m, resp):
                        break
            else:
                if inspect.isawaitable(gen):
                    gen = await gen
                for resp in gen or ():
                    if not await self._send_async(call, m, resp):
                        break
            ctx._finish()
        except Exception as e:  # noqa: BLE001
            ctx._fail(e)

    async def _send_async(self, call, m, resp):
        data = resp if isinstance(resp, (bytes, bytearray)) else m.serialize(resp)
        r = call.try_send(data)
        if r == 1:
            return await asyncio.get_running_loop().run_in_executor(None, call.send, data)
        return r == 0

    async def serve_async(self):
        """Serves on the running event loop until ``stop()`` or refusal."""
        loop = asyncio.get_running_loop()
        self._register()
        fd = self._native.bell()
        bell = socket.socket(fileno=fd)
        bell.setblocking(False)
        ended = loop.create_future()
        native = self._native
        methods = self._methods
        run = self._run_async

        running = [0]

        def flush_soon():
            # The last call running: its result goes over now. Others: after
            # this pass's tasks, every call they finish in one go.
            if running[0] <= 1:
                native.flush()
            else:
                loop.call_soon(native.flush)

        async def run_one(call):
            try:
                await run(call, methods[call.handler], flush_soon)
            finally:
                running[0] -= 1

        def ring():
            try:
                while bell.recv(4096):
                    pass
            except BlockingIOError:
                pass
            calls = native.take_calls()
            running[0] += len(calls)
            for call in calls:
                loop.create_task(run_one(call))
            if native.ended() and not ended.done():
                ended.set_result(None)

        loop.add_reader(fd, ring)
        native.start()
        try:
            await ended
        finally:
            loop.remove_reader(fd)
            bell.close()
            native.stop()
        err = native.error()
        if err:
            raise RuntimeError(f"the engine refused the application: {err}")
