"""Attach a grpcio servicer to a protoplane engine from the command line.

    python -m protoplane.serve --attach SOCK MODULE:SERVICER_CLASS [...]

MODULE is imported (the current directory is on the path), each
SERVICER_CLASS is instantiated with no arguments and registered through the
``add_XServicer_to_server`` function beside its generated base class. The
process serves until SIGTERM or SIGINT, and attaches again whenever the
engine restarts.
"""

import argparse
import asyncio
import importlib
import os
import signal
import sys

import protoplane


def _load(spec):
    module, _, name = spec.partition(":")
    if not module or not name:
        raise SystemExit(f"{spec!r}: expected MODULE:SERVICER_CLASS")
    return getattr(importlib.import_module(module), name)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m protoplane.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--attach", required=True, metavar="SOCK", help="the engine's attach socket")
    p.add_argument("servicers", nargs="+", metavar="MODULE:SERVICER_CLASS")
    p.add_argument("--workers", type=int, default=None, help="threads for sync handlers")
    p.add_argument("--asyncio", action="store_true",
                   help="serve on an asyncio event loop (async servicers)")
    p.add_argument("--requests", choices=("view", "pb2"), default="view",
                   help="requests as views read in place (default) or as *_pb2 objects")
    p.add_argument("--spin-us", type=int, default=50,
                   help="poll the engine's rings this long after work before sleeping")
    p.add_argument("--nice", type=int, default=19,
                   help="the attachment thread's priority (the lowest by default: it yields the "
                        "core to the handlers)")
    p.add_argument("-I", "--path", action="append", default=[],
                   help="a directory to import from (repeatable)")
    a = p.parse_args(argv)
    sys.path[:0] = a.path + [os.getcwd()]
    app = protoplane.attach(a.attach, max_workers=a.workers, requests=a.requests,
                            spin_us=a.spin_us, nice=a.nice)
    for spec in a.servicers:
        app.add_servicer(_load(spec)())
    # SIGTERM and SIGINT stop serving (calls in progress are cancelled) and
    # end the process. Installed explicitly: a process started in the
    # background by a non-interactive shell inherits SIGINT ignored, and
    # Python would then never raise KeyboardInterrupt.
    def stop(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"protoplane: serving {', '.join(app._services)} on {a.attach}", flush=True)
    if a.asyncio:
        try:
            asyncio.run(app.serve_async())
        except KeyboardInterrupt:
            pass
    else:
        app.serve()


if __name__ == "__main__":
    main()
