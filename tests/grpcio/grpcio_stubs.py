"""Generate and import the Python stubs for grpc.testing.TestService.

The schema is the repository's own declaration of gRPC's interop service,
``protos/interop/grpc_testing.proto``: the same package, service, method,
message and field names and numbers as gRPC's, which is all the wire sees,
so grpcio interoperates with it exactly as with gRPC's own files.  Stubs are
generated at test time with the protoc bundled in grpcio-tools, into
``$ROOT/target/grpcio-gen/`` (``target`` is gitignored), and imported from
there.

The file's import path is ``grpc_testing.proto``, so protoc emits the
top-level modules ``grpc_testing_pb2`` and ``grpc_testing_pb2_grpc``: the
proto package ``grpc.testing`` does not enter the Python module path, and
nothing collides with grpcio's own ``grpc`` package.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

# tests/grpcio/grpcio_stubs.py -> repository root is two levels up.
REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO = REPO_ROOT / "protos" / "interop" / "grpc_testing.proto"


def default_out_dir() -> Path:
    return REPO_ROOT / "target" / "grpcio-gen"


def generate(out_dir: Path) -> Path:
    """Run grpc_tools.protoc (in-process) and return ``out_dir``.

    Output goes to a temporary sibling directory first and is then renamed
    into place, so concurrent callers (server and client started together)
    never import a half-written tree.  Existing output is regenerated only when
    the schema is newer than the stamp file or the stamp names another schema
    (output of an older layout).
    """
    from grpc_tools import protoc  # imported lazily: only needed here

    stamp = out_dir / ".generated"
    if not PROTO.is_file():
        raise FileNotFoundError(f"interop schema not found: {PROTO}")
    if (
        stamp.is_file()
        and stamp.read_text() == f"{PROTO}\n"
        and PROTO.stat().st_mtime <= stamp.stat().st_mtime
    ):
        return out_dir

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".grpcio-gen-", dir=out_dir.parent))
    try:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO.parent}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            PROTO.name,
        ]
        rc = protoc.main(args)
        if rc != 0:
            raise RuntimeError(f"grpc_tools.protoc failed with status {rc}")
        (tmp / ".generated").write_text(f"{PROTO}\n")
        # Swap in atomically-ish: move any old tree aside, then rename.
        old = None
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=".grpcio-old-", dir=out_dir.parent))
            os.replace(out_dir, old / "gen")
        try:
            os.replace(tmp, out_dir)
        except OSError:
            # Lost a race with another generator: its output is equivalent.
            if not (out_dir / ".generated").is_file():
                raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def load(out_dir: Path | None = None) -> SimpleNamespace:
    """Generate (if needed) and import the stubs.

    Returns a namespace with ``messages`` (the message classes) and
    ``services`` (the stubs and servicers).
    """
    out_dir = generate(out_dir or default_out_dir())
    if str(out_dir) not in sys.path:
        sys.path.insert(0, str(out_dir))
    importlib.invalidate_caches()
    return SimpleNamespace(
        messages=importlib.import_module("grpc_testing_pb2"),
        services=importlib.import_module("grpc_testing_pb2_grpc"),
    )


if __name__ == "__main__":
    # `python grpcio_stubs.py [OUT_DIR]`: just generate (used by run.sh).
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else default_out_dir()
    load(out)
    print(f"stubs ready in {out}")
