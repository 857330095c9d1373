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
use protoplane_grpc::{
    BoxFuture, Code, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_rpc::{CallOptions, Channel};
use protoplane_shm::attach::{self, Answer, Hello, VERSION};
use protoplane_shm::desc::{self, Descriptor};
use protoplane_shm::layout::ENGINE_PARKED;
use protoplane_shm::{Access, Bell, Consumer, Doorbell, Layout, Mapping, Part, Producer, Ring};
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

fn social() -> Arc<Schema> {
    common::social_schema()
}

fn interop() -> Arc<Schema> {
    common::repo_schema("interop/grpc_testing.proto")
}

/// Answers every method with an empty message of its output type, except
/// `ComposePost`, which never answers: it waits to be cancelled, and
/// counts that it was (its future dropped).
struct Honest {
    schema: Arc<Schema>,
    name: &'static str,
    hanging: Arc<Hanging>,
}

/// `ComposePost` handlers started and cancelled.
#[derive(Debug, Default)]
struct Hanging {
    started: std::sync::atomic::AtomicU64,
    cancelled: std::sync::atomic::AtomicU64,
}

struct Cancelled(Arc<Hanging>);

impl Drop for Cancelled {
    fn drop(&mut self) {
        self.0.cancelled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

fn honest(hanging: &Arc<Hanging>) -> Arc<Honest> {
    Arc::new(Honest { schema: social(), name: SOCIAL, hanging: hanging.clone() })
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
            if out.name == "ComposePost" {
                self.hanging.started.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _guard = Cancelled(self.hanging.clone());
                std::future::pending::<()>().await;
            }
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
    hanging: Arc<Hanging>,
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
        let hanging = Arc::new(Hanging::default());
        let app = protoplane_app::attach(&config.attach).service(honest(&hanging));
        drop(social);
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
            hanging,
            _serial: serial,
        };
        f.wait_for(|| f.attached(SOCIAL) == 1, "the honest application attaches");
        // One call end to end, so every descriptor of the steady state
        // exists before a test counts them (the server's side of the
        // channel's connection is accepted asynchronously).
        f.honest_calls(1);
        f
    }

    fn attached(&self, service: &str) -> usize {
        self.running.registry.attached(service)
    }

    /// Waits until the engine routes `service`'s calls to the application
    /// that just said it attached: it hears the engine's answer before the
    /// engine's task registers it (the step after sending the answer).
    fn registered(&self, service: &str) {
        self.wait_for(|| self.attached(service) == 1, "the engine registers the application");
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

/// Attaches as `services` with the real handshake: the attach socket, the
/// region's layout and the descriptors of the answer.
fn raw_attach(path: &Path, services: Vec<(String, u64)>) -> Attached {
    match try_attach(path, services) {
        Ok(x) => {
            report("attached");
            x
        }
        Err(why) => {
            report(&format!("refused {why}"));
            wait_next();
            std::process::exit(0);
        }
    }
}

type Attached = (UnixStream, Layout, Vec<std::os::fd::OwnedFd>);

fn try_attach(path: &Path, services: Vec<(String, u64)>) -> Result<Attached, String> {
    let sock = UnixStream::connect(path).expect("connect to the attach socket");
    let hello = Hello {
        version: VERSION,
        pid: std::process::id(),
        services,
        schemas: false,
        channels: vec![],
        lanes: false,
    };
    attach::send(&sock, &hello.encode(), &[]).expect("send the hello");
    let (msg, fds) = attach::recv(&sock).expect("the answer");
    match Answer::decode(&msg).expect("an answer") {
        Answer::Accept { layout, .. } => Ok((sock, layout, fds)),
        Answer::Refuse(why) => Err(why),
    }
}

/// The application's ends of the rings: requests in, responses out.
fn rings(layout: &Layout, map: &Arc<Mapping>) -> (Consumer, Producer) {
    let ring = |at| Ring::new(map.clone(), at, layout.ring_slots).expect("ring");
    (Consumer::new(ring(layout.request_ring())), Producer::new(ring(layout.response_ring())))
}

/// The region as an application maps it.
fn app_map(layout: &Layout, fds: &[std::os::fd::OwnedFd]) -> Arc<Mapping> {
    let parts = layout.app_parts(&fds[0], &fds[1]);
    Arc::new(Mapping::map_parts(&parts).expect("map the region"))
}

/// Serves the request ring on a thread of its own with `on` (which may
/// answer through the producer), ringing the engine's doorbell after each
/// request as an application does, until the process exits.
fn serve_ring(
    layout: &Layout,
    map: &Arc<Mapping>,
    fds: &[std::os::fd::OwnedFd],
    mut on: impl FnMut(&Descriptor, &Producer) + Send + 'static,
) {
    let (mut requests, responses) = rings(layout, map);
    // The engine's doorbell: its parked flag in the control page, and a
    // byte on the application's end of the bell pair.
    let bell = Bell::from_fd(fds[2].try_clone().expect("dup")).expect("the doorbell");
    let bell = Doorbell::new(map.clone(), ENGINE_PARKED, Arc::new(bell)).expect("doorbell");
    std::thread::spawn(move || loop {
        match requests.pop() {
            Some(d) => {
                on(&d, &responses);
                bell.notify();
            }
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    });
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
    let mut keep = Vec::new();
    match scenario.as_str() {
        "truncate" => {
            let (_sock, _, fds) = raw_attach(&path, hostile_services());
            // The shared file (control page, rings, this side's half): cut
            // to nothing, then to one page.
            // The other descriptors (the engine's half, the doorbell) stay
            // open: the application stays attached and is sent requests.
            let mut fds = fds.into_iter();
            let shared = std::fs::File::from(fds.next().expect("the shared file"));
            let _attached: Vec<_> = fds.collect();
            let cut = [0, 4096].map(|len| shared.set_len(len).map_err(|e| e.to_string()));
            report(&format!("truncate {cut:?}"));
            wait_next();
        }
        "doorbell" => {
            let (_sock, _, fds) = raw_attach(&path, hostile_services());
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
        "twice" => {
            let mut twice = hostile_services();
            twice.push(twice[0].clone());
            keep.push(raw_attach(&path, twice));
        }
        "twice-free" => keep.push(raw_attach(&path, hostile_services())),
        "attach" => {
            // As often as the engine lets it, holding every attachment.
            let mut refused = String::new();
            for _ in 0..10 {
                match try_attach(&path, hostile_services()) {
                    Ok(a) => keep.push(a),
                    Err(why) => {
                        refused = why;
                        break;
                    }
                }
            }
            report(&format!("attached {} times, then: {refused}", keep.len()));
        }
        "hoard" => {
            // Answers every call (OK, no message) and never releases the
            // requests' memory.
            let (sock, layout, fds) = raw_attach(&path, hostile_services());
            serve_ring(&layout, &app_map(&layout, &fds), &fds, |d, out| {
                if d.has(desc::OPEN) {
                    let a = Descriptor {
                        call: d.call,
                        flags: desc::STATUS | desc::END,
                        ..Descriptor::default()
                    };
                    let _ = out.push(&a);
                }
            });
            keep.push((sock, layout, fds));
        }
        "scribble-seq" => {
            // Takes nothing; on the test's `next`, with requests posted,
            // writes every sequence word of its request ring (as if it had
            // taken them all, and more), then posts nothing more.
            let (sock, layout, fds) = raw_attach(&path, hostile_services());
            wait_next();
            let map = app_map(&layout, &fds);
            for i in 0..layout.ring_slots as usize {
                if let Some(seq) = map.atomic_u64(layout.request_ring() + 64 * i) {
                    seq.store(0xdead_beef, std::sync::atomic::Ordering::Relaxed);
                }
            }
            report("scribbled");
            keep.push((sock, layout, fds));
        }
        "still" => {
            // Attaches and then never takes a request from its ring.
            keep.push(raw_attach(&path, hostile_services()));
        }
        "blackhole" => {
            // Takes every call, releases its memory at once, never answers.
            let (sock, layout, fds) = raw_attach(&path, hostile_services());
            serve_ring(&layout, &app_map(&layout, &fds), &fds, |d, out| {
                if d.chunk != 0 {
                    let _ = out.push(&Descriptor::releases(&[d.chunk]));
                }
            });
            keep.push((sock, layout, fds));
        }
        "flood" => {
            // Descriptors that do nothing: answers to a call the engine
            // never opened.
            let (sock, layout, fds) = raw_attach(&path, hostile_services());
            let (_, out) = rings(&layout, &app_map(&layout, &fds));
            let idle = Descriptor {
                call: 1 << 40,
                flags: desc::STATUS | desc::END,
                ..Descriptor::default()
            };
            let mut pushed = 0;
            while pushed < 1000 && out.push(&idle).is_ok() {
                pushed += 1;
            }
            report(&format!("pushed {pushed}"));
            keep.push((sock, layout, fds));
        }
        "scribble" => {
            // Answers every call with a block in one of its chunks, and
            // rewrites every one of those chunks with changing bytes from
            // another thread the whole time, also while the engine reads
            // them.
            let (sock, layout, fds) = raw_attach(&path, hostile_services());
            let parts =
                [Part::whole(&fds[0], Access::Shared), Part::whole(&fds[1], Access::Trusted)];
            let map = Arc::new(Mapping::map_parts(&parts).expect("map"));
            let first = layout.app_half() as u32;
            let size = layout.classes[0].size;
            let chunks: Vec<u32> = (0..layout.classes[0].count).map(|i| first + i * size).collect();
            let scribbled = chunks.clone();
            let m = map.clone();
            std::thread::spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64;
                loop {
                    for &c in &scribbled {
                        for w in 0..16u32 {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            m.write((c + 8 * w) as usize, &x.to_le_bytes());
                        }
                    }
                }
            });
            let mut free = chunks;
            serve_ring(&layout, &map, &fds, move |d, out| {
                free.extend(d.released());
                if d.chunk != 0 {
                    let _ = out.push(&Descriptor::releases(&[d.chunk]));
                }
                if !d.has(desc::OPEN) {
                    return;
                }
                let Some(c) = free.pop() else { return };
                let a = Descriptor {
                    call: d.call,
                    flags: desc::MESSAGE | desc::STATUS | desc::END,
                    block: desc::Span { offset: c, len: 128 },
                    chunk: c,
                    ..Descriptor::default()
                };
                let _ = out.push(&a);
            });
            keep.push((sock, layout, fds));
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
    f.registered(HOSTILE);
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
    f.registered(HOSTILE);
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
    let app = protoplane_app::attach(&f.running.attach).service(honest(&f.hanging));
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

#[test]
fn a_ring_scribbled_after_requests_were_posted_fails_them_at_once() {
    // The stall watchdog would catch a still application only after a
    // minute: what ends these calls is the scribbled ring itself.
    let f = Fixture::start("scribble-seq", |c| c.stall_timeout = Duration::from_secs(60));
    let mut h = f.hostile("scribble-seq");
    assert_eq!(h.line(), "attached");
    f.registered(HOSTILE);
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let ch = f.ch.clone();
            f.client.spawn(async move {
                let opts = CallOptions {
                    timeout: Some(Duration::from_secs(20)),
                    ..CallOptions::default()
                };
                let started = Instant::now();
                let mut c = match ch.start(HOSTILE_CALL, opts).await {
                    Ok(c) => c,
                    Err(st) => return (st, started.elapsed()),
                };
                if c.send(&[]).await.is_ok() {
                    c.close_send();
                    while let Ok(Some(_)) = c.recv().await {}
                }
                (c.finish_status().await, started.elapsed())
            })
        })
        .collect();
    // The requests are in the ring before the application scribbles it.
    let att = f.running.registry.pick(HOSTILE).expect("attached");
    let until = Instant::now() + Duration::from_secs(10);
    while att.progress(0).0 < 4 {
        assert!(Instant::now() < until, "the requests never reached the ring");
        std::thread::sleep(Duration::from_millis(5));
    }
    h.next();
    assert_eq!(h.line(), "scribbled");
    for c in calls {
        let (st, took) = f.client.block_on(c).expect("the call's task");
        assert_eq!(st.code, Code::Unavailable, "{st:?}");
        assert!(st.message.contains("corrupted its request ring"), "{st:?}");
        assert!(took < Duration::from_secs(10), "ended after {took:?}");
    }
    let why = f.detached(h.pid()).expect("detached");
    assert!(why.contains("corrupted its request ring"), "{why}");
    f.honest_calls(20);
    h.end();
}

#[test]
fn a_full_request_ring_holds_a_call_a_bounded_time_then_refuses_it() {
    let f = Fixture::start("still", |c| {
        c.limits.queue_timeout = Duration::from_millis(100);
        c.stall_timeout = Duration::from_secs(60);
    });
    let mut h = f.hostile("still");
    assert_eq!(h.line(), "attached");
    f.registered(HOSTILE);
    // 64 slots and nobody taking: the first calls fill the ring (or the
    // engine's half of the region, whichever is full first) and wait for
    // their deadline; the rest wait for room for the queue timeout (not
    // their deadline) and are refused, saying why.
    let calls: Vec<_> = (0..80)
        .map(|_| {
            let ch = f.ch.clone();
            f.client.spawn(async move {
                let opts =
                    CallOptions { timeout: Some(Duration::from_secs(3)), ..CallOptions::default() };
                let started = Instant::now();
                let mut c = match ch.start(HOSTILE_CALL, opts).await {
                    Ok(c) => c,
                    Err(st) => return (st, started.elapsed()),
                };
                if c.send(&[]).await.is_ok() {
                    c.close_send();
                    while let Ok(Some(_)) = c.recv().await {}
                }
                (c.finish_status().await, started.elapsed())
            })
        })
        .collect();
    let done: Vec<(Status, Duration)> =
        calls.into_iter().map(|c| f.client.block_on(c).expect("the call's task")).collect();
    let refused: Vec<&(Status, Duration)> =
        done.iter().filter(|(st, _)| st.code == Code::ResourceExhausted).collect();
    let held = done.iter().filter(|(st, _)| st.code == Code::DeadlineExceeded).count();
    assert!(refused.len() >= 80 - 64, "{done:?}");
    assert_eq!(refused.len() + held, 80, "{done:?}");
    for (st, took) in &refused {
        let full = ["request ring is full", "region is full"];
        assert!(full.iter().any(|f| st.message.contains(f)), "{st:?}");
        // It waited for room (the queue timeout), not for its deadline.
        let waited = Duration::from_millis(90)..Duration::from_secs(2);
        assert!(waited.contains(took), "refused after {took:?}: {st:?}");
    }
    // The honest application is served meanwhile and after.
    f.honest_calls(20);
    h.next();
    h.end();
}

#[test]
fn a_service_listed_twice_is_refused() {
    let f = Fixture::start("twice", |_| {});
    let mut h = f.hostile("twice");
    let what = h.line();
    assert!(what.starts_with("refused") && what.contains("listed twice"), "{what}");
    assert_eq!(f.attached(HOSTILE), 0);
    f.honest_calls(5);
    h.next();
    h.end();
}

#[test]
fn attachments_are_capped() {
    let f = Fixture::start("cap", |c| c.admission.max_applications = 3);
    let mut h = f.hostile("attach");
    let what = h.line();
    // The honest application holds one seat.
    assert!(
        what.starts_with("attached 2 times, then: ") && what.contains("maximum of 3"),
        "{what}"
    );
    f.honest_calls(5);
    h.next();
    h.end();
    f.wait_for(|| f.running.registry.applications() == 1, "its seats come back");
    let mut again = f.hostile("attach");
    assert!(again.line().starts_with("attached 2 times"));
    again.next();
    again.end();
}

#[test]
fn only_the_peers_the_config_names_may_serve_a_service() {
    // Our own uid may serve the honest service; the others only uid
    // 4294967294, which is nobody's.
    let me = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m));
    let me = me.expect("our uid");
    let f = Fixture::start("allow", |c| {
        let toml = format!(
            "[attach.allow]\n\"{SOCIAL}\" = [\"uid:{me}\"]\n\"*\" = [\"uid:4294967294\"]\n"
        );
        c.apply_toml(&toml, Path::new("/")).expect("config");
    });
    let mut h = f.hostile("twice-free");
    let what = h.line();
    assert!(what.contains(&format!("uid {me}")) && what.contains("may not serve"), "{what}");
    f.honest_calls(5);
    h.next();
    h.end();
}

#[test]
fn idle_connections_to_the_attach_socket_starve_nobody() {
    let f = Fixture::start("idle", |c| {
        c.admission.max_pending = 32;
        c.admission.handshake_timeout = Duration::from_millis(500);
    });
    let fds = open_fds();
    // 3,000 connections that never say a word.
    let idle: Vec<UnixStream> =
        (0..3000).map(|_| UnixStream::connect(&f.running.attach).expect("connect")).collect();
    // An honest application attaches beside them at once.
    let app = protoplane_app::attach(&f.running.attach).service(honest(&f.hanging));
    let second = f.client.spawn(app.run());
    f.wait_for(|| f.attached(SOCIAL) == 2, "an honest application attaches among 3,000 idle");
    f.honest_calls(10);
    second.abort();
    drop(idle);
    f.wait_for(|| f.attached(SOCIAL) == 1, "it leaves");
    let evicted = f.running.admission.evicted.load(std::sync::atomic::Ordering::Relaxed);
    assert!(evicted >= 3000 - 32, "evicted {evicted}");
    f.wait_for(|| open_fds() <= fds, "the idle connections' descriptors are closed");
}

/// The budgets' timeouts, short for the tests.
fn short_budgets(c: &mut Config) {
    c.budgets.release_timeout = Duration::from_millis(200);
    c.budgets.answer_timeout = Duration::from_millis(200);
    c.budgets.max_unanswered = 8;
}

/// Calls to the hostile application until it is detached: why it was.
fn feed_until_detached(f: &Fixture, pid: u32) -> String {
    let until = Instant::now() + BOUND;
    loop {
        if let Some(why) = f.detached(pid) {
            return why;
        }
        assert!(Instant::now() < until, "the hostile application was never detached");
        let _ = f.call(HOSTILE_CALL, &[], Duration::from_millis(20));
        f.honest_calls(1);
    }
}

/// The hostile application of `scenario`, fed calls until a budget
/// detaches it for `reason`; honest calls pass after, descriptors come back.
fn detached_by_a_budget(scenario: &str, reason: &str) {
    let f = Fixture::start(scenario, short_budgets);
    let fds = open_fds();
    let mut h = f.hostile(scenario);
    assert_eq!(h.line(), "attached");
    let why = feed_until_detached(&f, h.pid());
    assert!(why.contains(reason), "{why}");
    f.honest_calls(20);
    h.next();
    h.end();
    f.wait_for(|| open_fds() <= fds, "the engine's descriptors come back");
}

#[test]
fn an_application_that_hoards_request_memory_is_detached() {
    detached_by_a_budget("hoard", "kept request memory");
}

#[test]
fn an_application_that_black_holes_calls_is_detached() {
    detached_by_a_budget("blackhole", "ended unanswered");
}

#[test]
fn descriptors_for_calls_never_opened_detach_at_once() {
    let f = Fixture::start("flood", |_| {});
    let mut h = f.hostile("flood");
    assert_eq!(h.line(), "attached");
    assert!(h.line().starts_with("pushed "));
    let pid = h.pid();
    f.wait_for(|| f.detached(pid).is_some(), "it is detached");
    let why = f.detached(pid).unwrap_or_default();
    assert!(why.contains("never opened"), "{why}");
    f.honest_calls(10);
    h.next();
    h.end();
}

#[test]
fn a_client_that_closes_its_connection_cancels_its_calls() {
    let f = Fixture::start("eof", |_| {});
    // A raw HTTP/2 client: preface, SETTINGS, one ComposePost request
    // (HPACK literals, no Huffman), then the socket is closed with the call
    // open. No RST_STREAM: only the connection's end says the client left.
    let mut req = Vec::new();
    let mut field = |name: &str, value: &str| {
        req.push(0);
        req.push(name.len() as u8);
        req.extend_from_slice(name.as_bytes());
        req.push(value.len() as u8);
        req.extend_from_slice(value.as_bytes());
    };
    field(":method", "POST");
    field(":scheme", "http");
    field(":path", "/socialnetwork.SocialNetwork/ComposePost");
    field(":authority", "engine");
    field("content-type", "application/grpc");
    field("te", "trailers");
    let frame = |ty: u8, flags: u8, stream: u32, payload: &[u8]| {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[ty, flags]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    };
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(4, 0, 0, &[]));
    out.extend(frame(1, 4, 1, &req));
    out.extend(frame(0, 1, 1, &[0, 0, 0, 0, 0]));
    let addr = f.running.grpc.expect("grpc");
    let mut conn = std::net::TcpStream::connect(addr).expect("connect");
    conn.write_all(&out).expect("send");
    let ord = std::sync::atomic::Ordering::SeqCst;
    f.wait_for(|| f.hanging.started.load(ord) == 1, "the handler runs");
    drop(conn);
    f.wait_for(|| f.hanging.cancelled.load(ord) == 1, "the application's handler is cancelled");
    let att = f.running.registry.pick(SOCIAL).expect("attached");
    f.wait_for(|| att.in_flight() == 0, "no call left open with the application");
    f.honest_calls(5);
}

#[test]
fn an_engine_refuses_a_live_attach_path_and_replaces_a_stale_one() {
    let f = Fixture::start("path", |_| {});
    let config = |attach: PathBuf| Config { attach, schemas: vec![social()], ..Config::default() };
    let err = f
        .client
        .block_on(protoplane_engine::start(config(f.running.attach.clone())))
        .expect_err("refused");
    assert!(
        matches!(&err, protoplane_engine::Error::SocketPath { reason, .. } if reason.contains("another process is listening")),
        "{err}"
    );
    // The first engine still takes applications.
    let app = protoplane_app::attach(&f.running.attach).service(honest(&f.hanging));
    let task = f.client.spawn(app.run());
    f.wait_for(|| f.attached(SOCIAL) == 2, "the first engine still takes applications");
    task.abort();
    // A socket file nobody listens on (an engine that died) is replaced.
    let stale = f.dir.join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).expect("bind"));
    assert!(stale.exists());
    let running =
        f.client.block_on(protoplane_engine::start(config(stale.clone()))).expect("stale taken");
    assert_eq!(running.attach, stale);
    // Anything else at the path is left alone.
    let file = f.dir.join("plain-file");
    std::fs::write(&file, b"keep me").expect("write");
    let err = f.client.block_on(protoplane_engine::start(config(file.clone()))).expect_err("file");
    assert!(
        matches!(&err, protoplane_engine::Error::SocketPath { reason, .. } if reason.contains("not a socket")),
        "{err}"
    );
    assert_eq!(std::fs::read(&file).expect("read"), b"keep me");
}

#[test]
fn every_listener_outlives_running_out_of_descriptors() {
    let f = Fixture::start("emfile", |c| c.lean_tcp = Some("127.0.0.1:0".parse().expect("addr")));
    let (grpc, lean) = (f.running.grpc.expect("grpc"), f.running.lean.expect("lean"));
    // Take every free descriptor of the process, then free three for
    // clients of the three listeners: each accept then fails with EMFILE.
    let mut hog = Vec::new();
    while let Ok(file) = std::fs::File::open("/dev/null") {
        hog.push(file);
    }
    hog.truncate(hog.len() - 3);
    // Another thread of the process (the runtimes, the harness) may take a
    // freed descriptor first: then one more is freed for the client.
    let mut room = |open: &mut dyn FnMut() -> std::io::Result<()>| loop {
        match open() {
            Ok(()) => return,
            Err(e) if e.raw_os_error() == Some(24) && hog.pop().is_some() => {}
            Err(e) => panic!("connect: {e}"),
        }
    };
    let mut pending = (None, None, None);
    room(&mut || std::net::TcpStream::connect(grpc).map(|s| pending.0 = Some(s)));
    room(&mut || std::net::TcpStream::connect(lean).map(|s| pending.1 = Some(s)));
    room(&mut || UnixStream::connect(&f.running.attach).map(|s| pending.2 = Some(s)));
    // The listeners run into EMFILE (each backs off and retries).
    let before = protoplane_rpc::accept::process_errors();
    f.wait_for(|| protoplane_rpc::accept::process_errors() >= before + 3, "accepts fail");
    drop(hog);
    // Every port still serves. gRPC: a new channel, a call.
    let st = f.client.block_on(async {
        let ch = timeout(BOUND, Channel::connect(&grpc.to_string())).await.expect("in time")?;
        let opts = CallOptions { timeout: Some(BOUND), ..CallOptions::default() };
        let mut c = ch.start(REGISTER, opts).await?;
        c.send(&register(1)).await?;
        c.close_send();
        while let Ok(Some(_)) = c.recv().await {}
        Ok::<Status, Status>(c.finish_status().await)
    });
    assert_eq!(st.map(|s| s.code), Ok(Code::Ok));
    // Lean: the server answers a new connection's preface.
    let mut conn = std::net::TcpStream::connect(lean).expect("lean connect");
    conn.set_read_timeout(Some(BOUND)).expect("timeout");
    conn.write_all(protoplane_grpc::lean::PREFACE).expect("preface");
    let mut back = [0u8; 8];
    std::io::Read::read_exact(&mut conn, &mut back).expect("the server's preface");
    assert_eq!(&back, protoplane_grpc::lean::PREFACE);
    // Attach: a new application attaches.
    let app = protoplane_app::attach(&f.running.attach).service(honest(&f.hanging));
    let task = f.client.spawn(app.run());
    f.wait_for(|| f.attached(SOCIAL) == 2, "an application attaches after EMFILE");
    task.abort();
    drop(pending);
}

#[test]
fn bytes_rewritten_while_the_engine_reads_them_break_no_check() {
    let f = Fixture::start("scribble", |_| {});
    let mut h = f.hostile("scribble");
    assert_eq!(h.line(), "attached");
    f.registered(HOSTILE);
    let att = f.running.registry.pick(HOSTILE).expect("attached");
    let mut codes = std::collections::BTreeMap::new();
    for _ in 0..200 {
        let st = f.call(HOSTILE_CALL, &[], Duration::from_millis(200));
        *codes.entry(format!("{:?}", st.code)).or_insert(0) += 1;
        f.honest_calls(1);
    }
    // Its answers reached the engine and were judged on private copies:
    // each call ended (with whatever the bytes said, or an error), none
    // hung, and the engine serves on.
    let copied = att.stats.responses_copied_out.load(std::sync::atomic::Ordering::Relaxed);
    let detached = f.detached(h.pid());
    eprintln!("scribbled answers: {codes:?}; detached: {detached:?}");
    assert!(copied >= 100, "{copied} responses copied out; codes {codes:?}; {detached:?}");
    assert!(!codes.contains_key("DeadlineExceeded") || codes["DeadlineExceeded"] < 20, "{codes:?}");
    f.honest_calls(20);
    h.next();
    h.end();
}
