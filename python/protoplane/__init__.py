"""protoplane for Python services.

Serve a grpcio servicer on a protoplane engine, changing only the setup
lines::

    import protoplane
    app = protoplane.attach("/tmp/pp.sock")
    pkg_pb2_grpc.add_XServicer_to_server(MyServicer(), app)
    app.serve()                    # or: await app.serve_async()

The engine (``protoplane engine --attach /tmp/pp.sock --grpc-port 50051``)
does HTTP/2, gRPC, TLS and protobuf decoding; this process runs only the
handlers. Requests arrive as views that read the engine's decoded block in
place (attribute access, ``HasField``, ``WhichOneof``, repeated fields,
maps, nested messages, ``SerializeToString``); ``protoplane.to_pb2(request)``
(or ``attach(..., requests="pb2")``) gives a ``*_pb2`` object instead.
Handlers return ``*_pb2`` messages (or ``bytes`` already serialized).
"""

from ._native import CallEnded, Message, Repeated
from ._server import AbortError, Server, ServicerContext
from ._types import to_pb2

__all__ = ["attach", "Server", "ServicerContext", "AbortError", "CallEnded", "Message",
           "Repeated", "to_pb2"]


def attach(path, *, max_workers=None, requests="view", spin_us=50, nice=19):
    """An application for the engine whose attach socket is `path`.

    max_workers: threads running sync handlers (``serve()``).
    requests: ``"view"`` (read in place, the default) or ``"pb2"``.
    spin_us: how long the attachment polls the engine's rings after work
    before it sleeps (0: never). Polling at the lowest priority costs the
    handlers nothing; it saves a wake-up per call at low load.
    nice: the attachment thread's priority; the lowest by default, so it
    runs when the handlers leave the core instead of taking it from them
    (see ``protoplane._native``).
    """
    return Server(path, max_workers=max_workers, requests=requests, spin_us=spin_us, nice=nice)
