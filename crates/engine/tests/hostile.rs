//! Hostile applications: an engine in this process, an honest application
//! beside it serving `socialnetwork.SocialNetwork`, gRPC clients over TCP,
//! and a misbehaving application in a **second process** that speaks the
//! raw attach protocol (`protoplane_shm::attach`) and then breaks the rules
//! on purpose. Each test is one misbehaviour; each asserts that the engine
//! lives, that the honest application's calls pass during and after, and
//! that the engine's descriptors and attachments come back to where they
//! were.
//!
//! The second process is this test binary run again with
//! `PP_HOSTILE=<scenario>` (see [`hostile_child`]): it attaches, does the
//! damage, prints what happened on its stdout, and lives until its stdin
//! closes. The engine runs in the test process, so a crash of the engine
//! (SIGBUS, an abort) fails the test.
//!
//! The scenarios share the process's descriptor table, so they run one at
//! a time (`SERIAL`).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use protoplane_engine::{Config, Running};
use protoplane_rpc::{
    BoxFuture, CallOptions, Channel, Code, Metadata, Request, Responder, Schema, Service, Status,
    Streaming,
};
use protoplane_shm::attach::{self, Answer, Hello, VERSION};
use protoplane_wire::Builder;
use tokio::runtime::Runtime;
use tokio::time::timeout;

mod common;

use common::{len_field, runtime, varint, BOUND};

const SOCIAL: &str = "socialnetwork.SocialNetwork";
const REGISTER: &str = "/socialnetwork.SocialNetwork/RegisterUser";
/// The service the hostile application attaches as (its own, so the
/// honest service's calls never reach it unless a scenario says so).
const HOSTILE: &str = "grpc.testing.UnimplementedService";
const HOSTILE_CALL: &str = "/grpc.testing.UnimplementedService/UnimplementedCall";

/// One scenario at a time: they count the process's descriptors.
static SERIAL: Mutex<()> = Mutex::new(());

fn protos() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../protos")
}

fn social() -> Arc<Schema> {
    let root = protos();
    let file = root.join("socialnetwork/social_network.proto");
    Arc::new(Schema::from_proto_files(&[file], &[root]).expect("the social-network schema"))
}

fn interop() -> Arc<Schema> {
    let root = protos();
    let file = root.join("interop/grpc_testing.proto");
    Arc::new(Schema::from_proto_files(&[file], &[root]).expect("the interop schema"))
}

/// Answers every method with an empty message of its output type.
struct Honest {
    schema: Arc<Schema>,
    name: &'static str,
}

impl Service for Honest {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        self.name
    }

    fn call(
        self: Arc<Self>,
        method: u32,
        request: Request<Streaming>,
        mut responder: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(async move {
            let mut requests = request.message;
            let _ = requests.single().await?;
            let ts = self.schema.tables();
            let out = self.schema.method(method).ok_or(Status::new(Code::Internal, "method"))?;
            let b = Builder::new(ts, out.output)?;
            responder.send(b.finish()).await?;
            Ok(Metadata::new())
        })
    }
}

/// A `RegisterUserRequest`.
fn register(req_id: i64) -> Vec<u8> {
    let mut out = vec![0x08];
    varint(&mut out, req_id as u64);
    len_field(&mut out, 2, "Ada");
    out
}

/// Descriptors open in this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

/// An engine, an honest application attached to it, a gRPC channel.
struct Fixture {
    engine_rt: Option<Runtime>,
    app_rt: Option<Runtime>,
    client: Runtime,
    running: Running,
    ch: Channel,
    dir: PathBuf,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Fixture {
    fn start(name: &str, tweak: impl FnOnce(&mut Config)) -> Fixture {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let dir = std::env::temp_dir().join(format!("pp-hostile-{name}-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let (social, interop) = (social(), interop());
        let mut config = Config {
            grpc: Some("127.0.0.1:0".parse().expect("addr")),
            attach: dir.join("engine.sock"),
            schemas: vec![social.clone(), interop],
            half_mb: 2,
            ring_slots: 64,
            ..Config::default()
        };
        tweak(&mut config);
        let engine_rt = runtime();
        let running =
            engine_rt.block_on(protoplane_engine::start(config.clone())).expect("engine starts");
        let app_rt = runtime();
        let app = protoplane_app::attach(&config.attach)
            .service(Arc::new(Honest { schema: social, name: SOCIAL }));
        app_rt.spawn(app.run());
        let client = runtime();
        let addr = running.grpc.expect("grpc").to_string();
        let ch = client
            .block_on(async { timeout(BOUND, Channel::connect(&addr)).await })
            .expect("in time")
            .expect("connect");
        let f = Fixture {
            engine_rt: Some(engine_rt),
            app_rt: Some(app_rt),
            client,
            running,
            ch,
            dir,
            _serial: serial,
        };
        f.wait_for(|| f.attached(SOCIAL) == 1, "the honest application attaches");
        f
    }

    fn attached(&self, service: &str) -> usize {
        self.running.registry.attached(service)
    }

    fn wait_for(&self, mut cond: impl FnMut() -> bool, what: &str) {
        let until = Instant::now() + BOUND;
        while !cond() {
            assert!(Instant::now() < until, "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// One unary call with a deadline: its status.
    fn call(&self, path: &str, req: &[u8], deadline: Duration) -> Status {
        self.client.block_on(async {
            let opts = CallOptions { timeout: Some(deadline), ..CallOptions::default() };
            let mut c = match self.ch.start(path, opts).await {
                Ok(c) => c,
                Err(st) => return st,
            };
            if c.send(req).await.is_err() {
                return c.finish_status().await;
            }
            c.close_send();
            while let Ok(Some(_)) = c.recv().await {}
            c.finish_status().await
        })
    }

    /// `n` honest calls, every one of which must pass.
    fn honest_calls(&self, n: i64) {
        for i in 0..n {
            let st = self.call(REGISTER, &register(i), BOUND);
            assert_eq!(st.code, Code::Ok, "honest call {i}: {st:?}");
        }
    }

    /// Starts the hostile application doing `scenario`, and waits for its
    /// first line (`attached` or `refused ...`).
    fn hostile(&self, scenario: &str) -> Hostile {
        Hostile::spawn(scenario, &self.running.attach)
    }

    /// Why the engine detached the application with process id `pid`.
    fn detached(&self, pid: u32) -> Option<String> {
        self.running.registry.detached().into_iter().find(|d| d.pid == pid).map(|d| d.reason)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        for rt in [self.app_rt.take(), self.engine_rt.take()].into_iter().flatten() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The hostile application's process.
struct Hostile {
    child: Child,
    lines: BufReader<ChildStdout>,
}

impl Hostile {
    fn spawn(scenario: &str, attach: &Path) -> Hostile {
        let exe = std::env::current_exe().expect("this test binary");
        let mut child = Command::new(exe)
            .args(["--exact", "hostile_child", "--nocapture", "--test-threads=1", "-q"])
            .env("PP_HOSTILE", scenario)
            .env("PP_ATTACH", attach)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the hostile application starts");
        let lines = BufReader::new(child.stdout.take().expect("stdout"));
        Hostile { child, lines }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next line the hostile application reports (the test harness's
    /// own output is skipped).
    fn line(&mut self) -> String {
        let mut l = String::new();
        loop {
            l.clear();
            let n = self.lines.read_line(&mut l).expect("the hostile application's report");
            assert!(n > 0, "the hostile application ended without a report");
            if let Some(report) = l.trim().strip_prefix("hostile: ") {
                return report.to_string();
            }
        }
    }

    /// Tells it to go on to its next step.
    fn next(&mut self) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        let _ = stdin.write_all(b"next\n");
        let _ = stdin.flush();
    }

    /// Ends it (its stdin closes: it exits).
    fn end(mut self) {
        drop(self.child.stdin.take());
        let until = Instant::now() + BOUND;
        while self.child.try_wait().ok().flatten().is_none() {
            if Instant::now() > until {
                let _ = self.child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.wait();
    }
}

// ---- the hostile application's side ---------------------------------------

/// Reports a line to the test.
fn report(what: &str) {
    println!("hostile: {what}");
    let _ = std::io::stdout().flush();
}

/// Waits for the test's next `next` (or exits when its stdin closes).
fn wait_next() {
    let mut l = String::new();
    if std::io::stdin().read_line(&mut l).unwrap_or(0) == 0 {
        std::process::exit(0);
    }
}

/// Attaches as `services` with the real handshake: the attach socket, and
/// the descriptors of the answer.
fn raw_attach(
    path: &Path,
    services: Vec<(String, u64)>,
) -> (UnixStream, Vec<std::os::fd::OwnedFd>) {
    let sock = UnixStream::connect(path).expect("connect to the attach socket");
    let hello = Hello { version: VERSION, pid: std::process::id(), services };
    attach::send(&sock, &hello.encode(), &[]).expect("send the hello");
    let (msg, fds) = attach::recv(&sock).expect("the answer");
    match Answer::decode(&msg).expect("an answer") {
        Answer::Accept { .. } => report("attached"),
        Answer::Refuse(why) => {
            report(&format!("refused {why}"));
            wait_next();
            std::process::exit(0);
        }
    }
    (sock, fds)
}

fn hostile_services() -> Vec<(String, u64)> {
    vec![(HOSTILE.to_string(), interop().tables().digest())]
}

/// The hostile application, when this binary runs as one (`PP_HOSTILE`);
/// an empty test otherwise.
#[test]
fn hostile_child() {
    let Ok(scenario) = std::env::var("PP_HOSTILE") else { return };
    let path = PathBuf::from(std::env::var("PP_ATTACH").expect("PP_ATTACH"));
    match scenario.as_str() {
        "truncate" => {
            let (_sock, fds) = raw_attach(&path, hostile_services());
            // The shared file (control page, rings, this side's half): cut
            // to nothing, then to one page.
            let shared = std::fs::File::from(fds.into_iter().next().expect("the shared file"));
            let cut = [0, 4096].map(|len| shared.set_len(len).map_err(|e| e.to_string()));
            report(&format!("truncate {cut:?}"));
            wait_next();
        }
        "doorbell" => {
            let (_sock, fds) = raw_attach(&path, hostile_services());
            // Every doorbell descriptor: filled until it refuses more (an
            // eventfd's counter at its maximum, a socket's buffer full),
            // then switched to blocking mode. Had the engine shared these
            // descriptors' file status flags, its next read or write on
            // them would block for good.
            let mut done = Vec::new();
            for fd in fds.into_iter().skip(2) {
                let mut s = UnixStream::from(fd);
                let _ = s.set_nonblocking(true);
                let mut n = 0usize;
                while n < 1 << 24 && s.write(&u64::MAX.wrapping_sub(1).to_le_bytes()).is_ok() {
                    n += 8;
                }
                done.push((n, s.set_nonblocking(false).is_ok()));
                std::mem::forget(s);
            }
            report(&format!("doorbells {done:?}"));
            wait_next();
        }
        other => panic!("no scenario {other}"),
    }
    // Attached until the test is done with it.
    wait_next();
}

// ---- the scenarios ---------------------------------------------------------

#[test]
fn truncating_the_shared_file_is_refused_and_the_engine_lives() {
    let f = Fixture::start("truncate", |_| {});
    let fds = open_fds();
    let mut h = f.hostile("truncate");
    assert_eq!(h.line(), "attached");
    let what = h.line();
    // Both attempts refused by the seal (EPERM).
    assert_eq!(what.matches("Err(").count(), 2, "{what}");
    // The engine touches every page of the region again: requests go to
    // the hostile application (its ring, its doorbell) and the drain loop
    // reads its control page and ring. Before the seal this was SIGBUS.
    for _ in 0..5 {
        let st = f.call(HOSTILE_CALL, &[], Duration::from_millis(50));
        assert!(matches!(st.code, Code::DeadlineExceeded | Code::Unavailable), "{st:?}");
    }
    f.honest_calls(20);
    h.next();
    let pid = h.pid();
    h.end();
    f.wait_for(|| f.attached(HOSTILE) == 0, "the hostile application is detached");
    assert!(f.detached(pid).is_some());
    f.honest_calls(20);
    f.wait_for(|| open_fds() <= fds, "the engine's descriptors come back");
}

#[test]
fn a_doorbell_switched_to_blocking_mode_blocks_nobody() {
    let f = Fixture::start("doorbell", |_| {});
    let fds = open_fds();
    let mut h = f.hostile("doorbell");
    assert_eq!(h.line(), "attached");
    let what = h.line();
    assert!(what.starts_with("doorbells [(") && what.contains("true)"), "{what}");
    // Requests to it: the engine rings its doorbell and, between passes,
    // clears its own; both must return at once.
    for _ in 0..5 {
        let st = f.call(HOSTILE_CALL, &[], Duration::from_millis(50));
        assert!(matches!(st.code, Code::DeadlineExceeded | Code::Unavailable), "{st:?}");
    }
    f.honest_calls(20);
    // A second honest application still attaches.
    let app = protoplane_app::attach(&f.running.attach)
        .service(Arc::new(Honest { schema: social(), name: SOCIAL }));
    let second = f.client.spawn(app.run());
    f.wait_for(|| f.attached(SOCIAL) == 2, "a second honest application attaches");
    f.honest_calls(20);
    second.abort();
    h.next();
    h.end();
    f.wait_for(|| f.attached(HOSTILE) == 0 && f.attached(SOCIAL) == 1, "both leave");
    f.honest_calls(10);
    f.wait_for(|| open_fds() <= fds, "the engine's descriptors come back");
}
