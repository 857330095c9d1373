"""Fixtures: a real engine (`protoplane engine`, from target/release or
$PROTOPLANE_BIN), the package's test servicer attached from a separate
process (`python -m protoplane.serve`, the documented entry point), and
grpcio clients calling the engine's gRPC port."""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def protoplane_bin():
    b = os.environ.get("PROTOPLANE_BIN") or str(ROOT / "target" / "release" / "protoplane")
    if not os.path.exists(b):
        pytest.skip(f"no protoplane binary at {b} (cargo build --release -p protoplane-cli)")
    return b


@pytest.fixture(scope="session")
def gen_dir():
    """pptest_pb2 and pptest_pb2_grpc, generated with grpcio-tools' protoc."""
    from grpc_tools import protoc

    out = Path(tempfile.mkdtemp(prefix="pp-pytest-gen."))
    rc = protoc.main(["protoc", f"-I{HERE / 'protos'}", f"--python_out={out}",
                      f"--grpc_python_out={out}", str(HERE / "protos" / "pptest.proto")])
    assert rc == 0, "protoc failed"
    sys.path[:0] = [str(out), str(HERE)]
    yield out
    shutil.rmtree(out, ignore_errors=True)


def wait_for(pred, timeout, what, proc=None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the process exited with {proc.returncode}")
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout}s")


class Engine:
    def __init__(self, workdir, extra=()):
        self.dir = Path(workdir)
        self.sock = str(self.dir / "engine.sock")
        self.err = self.dir / "engine.stderr"
        self.out = self.dir / "engine.stdout"
        self.extra = list(extra)
        self.proc = None
        self.port = None

    def start(self):
        self.err.write_text("")
        with open(self.out, "wb") as out, open(self.err, "ab") as err:
            self.proc = subprocess.Popen(
                [protoplane_bin(), "engine", "--grpc-port", str(self.port or 0), "--attach", self.sock,
                 "--proto", str(HERE / "protos" / "pptest.proto"), "-I", str(HERE / "protos"),
                 "--shutdown-grace", "1", *self.extra],
                stdout=out, stderr=err, stdin=subprocess.DEVNULL)

        def port():
            m = re.search(r"listening on (?:.*:)?(\d+)\s*$", self.out.read_text(), re.M)
            return m and int(m.group(1))
        self.port = wait_for(port, 30, "the engine's port", self.proc)
        return self

    def attached(self, service, count=1):
        return self.log().count(f"attached for {service}") >= count

    def log(self):
        return self.err.read_text(errors="replace")

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class App:
    """`python -m protoplane.serve` in a process of its own."""

    def __init__(self, engine, gen, spec, *args):
        self.engine = engine
        self.log = engine.dir / f"app-{spec.replace(':', '-')}.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "protoplane.serve", "--attach", engine.sock,
                 "-I", str(gen), "-I", str(HERE), spec, *args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def engine(tmp_path):
    e = Engine(tmp_path).start()
    yield e
    e.stop()


def attach(engine, gen, spec, *args, count=1):
    app = App(engine, gen, spec, *args)
    try:
        wait_for(lambda: engine.attached("pptest.Tester", count), 30,
                 f"{spec} attaching (log: {app.log})", app.proc)
    except AssertionError:
        app.stop()
        raise AssertionError(f"{spec} did not attach:\n{app.log.read_text()}\n{engine.log()}")
    return app


@pytest.fixture(params=["sync", "async"])
def served(request, engine, gen_dir):
    """The engine with the test servicer attached: sync (thread pool) or
    async (event loop)."""
    if request.param == "sync":
        app = attach(engine, gen_dir, "pptest_servicer:Tester", "--workers", "8")
    else:
        app = attach(engine, gen_dir, "pptest_servicer:AsyncTester", "--asyncio")
    yield engine
    app.stop()


@pytest.fixture
def stub(served):
    import grpc
    import pptest_pb2_grpc

    ch = grpc.insecure_channel(f"127.0.0.1:{served.port}")
    yield pptest_pb2_grpc.TesterStub(ch)
    ch.close()
