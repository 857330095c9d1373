"""Generate and import the Python stubs for grpc.testing.TestService.

The interop schemas (grpc/testing/{test,messages,empty}.proto) are third-party
material that lives outside the repository, in ``$ROOT/../shared``.  They are
never copied into the repo: stubs are generated at test time with the protoc
bundled in grpcio-tools, into ``$ROOT/target/grpcio-gen/`` (``target`` is
gitignored), and imported from there.

Package-name clash
------------------
The schemas live in proto package ``grpc.testing`` under the import path
``grpc/testing/``, so protoc emits ``grpc/testing/*_pb2.py`` whose imports read
``from grpc.testing import empty_pb2``.  ``grpc`` however is grpcio's own
(regular) package, so Python would only look for ``grpc.testing`` inside the
installed grpcio.  We therefore append the generated ``grpc`` directory to
``grpc.__path__``; ``grpc.testing`` then resolves to the generated directory
(grpcio itself ships no ``grpc.testing`` subpackage, so nothing is shadowed).
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
PROTO_FILES = ("grpc/testing/empty.proto", "grpc/testing/messages.proto", "grpc/testing/test.proto")


def default_proto_root() -> Path:
    """``$ROOT/../shared/protos/grpc-testing`` (overridable for odd layouts)."""
    env = os.environ.get("GRPC_TESTING_PROTO_ROOT")
    if env:
        return Path(env)
    return REPO_ROOT.parent / "shared" / "protos" / "grpc-testing"


def default_out_dir() -> Path:
    return REPO_ROOT / "target" / "grpcio-gen"


def generate(proto_root: Path, out_dir: Path) -> Path:
    """Run grpc_tools.protoc (in-process) and return ``out_dir``.

    Output goes to a temporary sibling directory first and is then renamed
    into place, so concurrent callers (server and client started together)
    never import a half-written tree.  Existing output is regenerated only when
    a schema is newer than the stamp file.
    """
    from grpc_tools import protoc  # imported lazily: only needed here

    stamp = out_dir / ".generated"
    sources = [proto_root / p for p in PROTO_FILES]
    missing = [str(s) for s in sources if not s.is_file()]
    if missing:
        raise FileNotFoundError(f"interop protos not found: {', '.join(missing)}")
    if stamp.is_file() and all(s.stat().st_mtime <= stamp.stat().st_mtime for s in sources):
        return out_dir

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".grpcio-gen-", dir=out_dir.parent))
    try:
        # protoc's own well-known types (none are used today, but harmless).
        wkt = Path(protoc.__file__).parent / "_proto"
        args = [
            "grpc_tools.protoc",
            f"-I{proto_root}",
            f"-I{wkt}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            *PROTO_FILES,
        ]
        rc = protoc.main(args)
        if rc != 0:
            raise RuntimeError(f"grpc_tools.protoc failed with status {rc}")
        (tmp / ".generated").write_text("ok\n")
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


def load(proto_root: Path | None = None, out_dir: Path | None = None) -> SimpleNamespace:
    """Generate (if needed) and import the stubs.

    Returns a namespace with ``empty_pb2``, ``messages_pb2`` and ``test_pb2_grpc``.
    """
    proto_root = proto_root or default_proto_root()
    out_dir = generate(proto_root, out_dir or default_out_dir())

    import grpc

    gen_pkg = str(out_dir / "grpc")
    if gen_pkg not in grpc.__path__:
        grpc.__path__.append(gen_pkg)
    importlib.invalidate_caches()
    return SimpleNamespace(
        empty_pb2=importlib.import_module("grpc.testing.empty_pb2"),
        messages_pb2=importlib.import_module("grpc.testing.messages_pb2"),
        test_pb2_grpc=importlib.import_module("grpc.testing.test_pb2_grpc"),
    )


if __name__ == "__main__":
    # `python grpcio_stubs.py [OUT_DIR]`: just generate (used by run.sh).
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else default_out_dir()
    generate(default_proto_root(), out)
    load(out_dir=out)
    print(f"stubs ready in {out}")
