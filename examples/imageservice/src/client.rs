//! The client side: encrypted requests, reply verification, the load
//! driver, and the automatic field-update experiment.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message as _;
use protoplane_grpc::{Code, Status};
use protoplane_rpc::{CallOptions, Channel, ChannelOptions};

use crate::crypto::{self, NONCE_LEN};
use crate::pb;
use crate::server::{RunningServer, Scheme, ServerConfig};
use crate::{COMPRESS_PATH, STATS_PATH};

/// Per-call deadline of the driver.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// One request ready to send, with the image it carries.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// The plaintext image (what a verified reply inflates to).
    pub image: Arc<Vec<u8>>,
    /// The encoded `CompressRequest`.
    pub request: Bytes,
}

/// Client nonces: a random 4-byte prefix per process, then a counter.
#[derive(Debug)]
pub struct Nonces {
    prefix: [u8; 4],
    next: AtomicU64,
}

impl Nonces {
    /// A fresh source.
    pub fn new() -> Result<Nonces, String> {
        let mut prefix = [0u8; 4];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut prefix)
            .map_err(|_| "no system randomness".to_string())?;
        Ok(Nonces { prefix, next: AtomicU64::new(0) })
    }

    /// The next nonce.
    pub fn next(&self) -> [u8; NONCE_LEN] {
        let mut n = [0u8; NONCE_LEN];
        n[..4].copy_from_slice(&self.prefix);
        n[4..].copy_from_slice(&self.next.fetch_add(1, Relaxed).to_be_bytes());
        n
    }
}

/// The request for `image` from `user` (with `token`), encrypted under the
/// user's request key with `nonce`.
pub fn request(
    user: &str,
    token: &str,
    image: &[u8],
    nonce: [u8; NONCE_LEN],
    level: u32,
) -> pb::CompressRequest {
    let sealed = crypto::seal(&crypto::request_key(user), &nonce, image).unwrap_or_default();
    pb::CompressRequest {
        user: user.to_string(),
        token: token.to_string(),
        nonce: nonce.to_vec(),
        image: sealed,
        level,
    }
}

/// `count` requests with distinct test images (seeds 0..count) of `size`
/// bytes each.
pub fn prepare(
    user: &str,
    token: &str,
    size: usize,
    count: usize,
    level: u32,
    nonces: &Nonces,
) -> Vec<Prepared> {
    (0..count.max(1))
        .map(|seed| {
            let image = crypto::test_image(size, seed as u64);
            let req = request(user, token, &image, nonces.next(), level);
            Prepared { image: Arc::new(image), request: Bytes::from(req.encode_to_vec()) }
        })
        .collect()
}

/// Checks a reply: the result decrypts under the user's reply key and
/// inflates to `original`, and the sizes are right.
pub fn verify(user: &str, original: &[u8], reply: &pb::CompressReply) -> Result<(), String> {
    let packed = crypto::open(&crypto::reply_key(user), &reply.nonce, &reply.result)
        .map_err(|e| format!("reply result: {e}"))?;
    let image = crypto::inflate(&packed, original.len()).map_err(|e| format!("reply: {e}"))?;
    if image != original {
        return Err("the reply inflates to another image".into());
    }
    if reply.original_size != original.len() as u64 || reply.compressed_size != packed.len() as u64
    {
        return Err(format!(
            "sizes {} / {} reported, {} / {} found",
            reply.original_size,
            reply.compressed_size,
            original.len(),
            packed.len()
        ));
    }
    Ok(())
}

/// Connects with limits fit for images.
pub async fn connect(target: &str) -> Result<Channel, Status> {
    let opts = ChannelOptions {
        max_recv_message: 64 << 20,
        max_send_message: 64 << 20,
        ..ChannelOptions::default()
    };
    Channel::connect_with(target, opts).await
}

async fn unary(channel: &Channel, path: &str, request: &[u8]) -> Result<Bytes, Status> {
    let opts = CallOptions { timeout: Some(CALL_TIMEOUT), ..CallOptions::default() };
    let mut call = channel.start(path, opts).await?;
    call.send_last(request).await?;
    let reply = call
        .recv()
        .await?
        .ok_or_else(|| Status::new(Code::Internal, "a unary call ended without a reply"))?;
    match call.recv().await? {
        None => Ok(reply),
        Some(_) => Err(Status::new(Code::Internal, "two replies to a unary call")),
    }
}

/// One `Compress` call with an encoded request.
pub async fn compress(channel: &Channel, request: &[u8]) -> Result<pb::CompressReply, Status> {
    let bytes = unary(channel, COMPRESS_PATH, request).await?;
    pb::CompressReply::decode(bytes)
        .map_err(|e| Status::new(Code::Internal, format!("undecodable reply: {e}")))
}

/// The server's counters.
pub async fn stats(channel: &Channel) -> Result<pb::StatsReply, Status> {
    let bytes = unary(channel, STATS_PATH, &pb::StatsRequest {}.encode_to_vec()).await?;
    pb::StatsReply::decode(bytes)
        .map_err(|e| Status::new(Code::Internal, format!("undecodable stats: {e}")))
}

/// What the load driver runs.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// `host:port`.
    pub target: String,
    /// User name.
    pub user: String,
    /// Token.
    pub token: String,
    /// Image size in bytes.
    pub size: usize,
    /// Distinct images (requests cycle through them).
    pub distinct: usize,
    /// Calls to make.
    pub requests: u64,
    /// Calls in flight.
    pub concurrency: usize,
    /// Deflate level (0: the server's default).
    pub level: u32,
    /// Calls before measuring (not counted).
    pub warmup: u64,
}

/// What a load run measured.
#[derive(Clone, Debug)]
pub struct LoadReport {
    /// Replies that verified.
    pub ok: u64,
    /// Calls that failed or replies that did not verify.
    pub failed: u64,
    /// The first few failures.
    pub errors: Vec<String>,
    /// Wall time of the measured calls.
    pub wall: Duration,
    /// Latencies of the verified calls, sorted.
    pub latencies: Vec<Duration>,
    /// The server's counters before and after the measured calls.
    pub before: pb::StatsReply,
    /// After.
    pub after: pb::StatsReply,
    /// Paths the replies report, with counts.
    pub paths: Vec<(String, u64)>,
    /// Total bytes of plaintext images and of compressed results.
    pub bytes_in: u64,
    /// Compressed bytes.
    pub bytes_out: u64,
}

impl LoadReport {
    /// The latency at quantile `q` (0..=1).
    pub fn quantile(&self, q: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let i = ((self.latencies.len() as f64 - 1.0) * q).round() as usize;
        self.latencies[i.min(self.latencies.len() - 1)]
    }

    /// Verified calls per second of wall time.
    pub fn throughput(&self) -> f64 {
        self.ok as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// Application CPU seconds the server spent on the measured calls.
    pub fn app_cpu_s(&self) -> f64 {
        self.after.app_cpu_ns.saturating_sub(self.before.app_cpu_ns) as f64 / 1e9
    }

    /// Of which handler threads.
    pub fn handler_cpu_s(&self) -> f64 {
        self.after.app_handler_cpu_ns.saturating_sub(self.before.app_handler_cpu_ns) as f64 / 1e9
    }

    /// Engine (network thread) CPU seconds.
    pub fn engine_cpu_s(&self) -> f64 {
        self.after.engine_cpu_ns.saturating_sub(self.before.engine_cpu_ns) as f64 / 1e9
    }

    /// Compute-unit CPU seconds.
    pub fn cu_cpu_s(&self) -> f64 {
        self.after.cu_cpu_ns.saturating_sub(self.before.cu_cpu_ns) as f64 / 1e9
    }

    /// Requests per application-core second: verified calls / application
    /// CPU seconds.
    pub fn per_app_core(&self) -> f64 {
        self.ok as f64 / self.app_cpu_s().max(1e-9)
    }

    /// A human-readable summary.
    pub fn summary(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let n = self.ok.max(1) as f64;
        let paths: Vec<String> = self.paths.iter().map(|(p, c)| format!("{p}={c}")).collect();
        format!(
            "scheme {scheme}: {ok} ok, {failed} failed in {wall:.2} s\n\
             throughput      {tput:.1} req/s  ({mbps:.1} MB/s of images, ratio {ratio:.2})\n\
             latency         p50 {p50:.2} ms  p99 {p99:.2} ms\n\
             app CPU         {app_us:.1} us/req (handlers {h_us:.1} us + notify {n_us:.1} us)\n\
             per app core    {per_core:.1} req/s per application core\n\
             engine CPU      {eng_us:.1} us/req   compute-unit CPU {cu_us:.1} us/req\n\
             paths           {paths}",
            scheme = self.after.scheme,
            ok = self.ok,
            failed = self.failed,
            wall = self.wall.as_secs_f64(),
            tput = self.throughput(),
            mbps = self.bytes_in as f64 / self.wall.as_secs_f64().max(1e-9) / 1e6,
            ratio = self.bytes_in as f64 / self.bytes_out.max(1) as f64,
            p50 = ms(self.quantile(0.5)),
            p99 = ms(self.quantile(0.99)),
            app_us = self.app_cpu_s() * 1e6 / n,
            h_us = self.handler_cpu_s() * 1e6 / n,
            n_us = (self.app_cpu_s() - self.handler_cpu_s()) * 1e6 / n,
            per_core = self.per_app_core(),
            eng_us = self.engine_cpu_s() * 1e6 / n,
            cu_us = self.cu_cpu_s() * 1e6 / n,
            paths = paths.join(" "),
        )
    }
}

#[derive(Default)]
struct Tally {
    latencies: Vec<Duration>,
    errors: Vec<String>,
    failed: u64,
    paths: Vec<(String, u64)>,
    bytes_in: u64,
    bytes_out: u64,
}

/// Runs `calls` calls over `channel` with `concurrency` in flight, cycling
/// through `prepared`, verifying every reply.
async fn drive(
    channel: &Channel,
    user: &str,
    prepared: &Arc<Vec<Prepared>>,
    calls: u64,
    concurrency: usize,
) -> Tally {
    let next = Arc::new(AtomicU64::new(0));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let mut tasks = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (ch, next, tally, prepared) =
            (channel.clone(), Arc::clone(&next), Arc::clone(&tally), Arc::clone(prepared));
        let user = user.to_string();
        tasks.push(tokio::spawn(async move {
            let mut mine = Tally::default();
            loop {
                let i = next.fetch_add(1, Relaxed);
                if i >= calls {
                    break;
                }
                let p = &prepared[i as usize % prepared.len()];
                let t = Instant::now();
                let r = compress(&ch, &p.request).await;
                let took = t.elapsed();
                match r
                    .map_err(|s| format!("{:?}: {}", s.code, s.message))
                    .and_then(|reply| verify(&user, &p.image, &reply).map(|()| reply))
                {
                    Ok(reply) => {
                        mine.latencies.push(took);
                        mine.bytes_in += reply.original_size;
                        mine.bytes_out += reply.compressed_size;
                        match mine.paths.iter_mut().find(|(q, _)| *q == reply.path) {
                            Some((_, c)) => *c += 1,
                            None => mine.paths.push((reply.path, 1)),
                        }
                    }
                    Err(e) => {
                        mine.failed += 1;
                        if mine.errors.len() < 5 {
                            mine.errors.push(e);
                        }
                    }
                }
            }
            let mut t = tally.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            t.latencies.extend(mine.latencies);
            t.failed += mine.failed;
            t.bytes_in += mine.bytes_in;
            t.bytes_out += mine.bytes_out;
            for e in mine.errors {
                if t.errors.len() < 5 {
                    t.errors.push(e);
                }
            }
            for (p, c) in mine.paths {
                match t.paths.iter_mut().find(|(q, _)| *q == p) {
                    Some((_, n)) => *n += c,
                    None => t.paths.push((p, c)),
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let mut t = tally.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    std::mem::take(&mut *t)
}

/// Runs a load: warm-up calls, then the measured ones, with the server's
/// counters read before and after.
pub async fn run_load(cfg: &LoadConfig) -> Result<LoadReport, String> {
    let channel = connect(&cfg.target).await.map_err(|s| format!("connect: {}", s.message))?;
    let nonces = Nonces::new()?;
    let prepared =
        Arc::new(prepare(&cfg.user, &cfg.token, cfg.size, cfg.distinct, cfg.level, &nonces));
    if cfg.warmup > 0 {
        drive(&channel, &cfg.user, &prepared, cfg.warmup, cfg.concurrency).await;
    }
    let before = stats(&channel).await.map_err(|s| format!("stats: {}", s.message))?;
    let t0 = Instant::now();
    let mut tally = drive(&channel, &cfg.user, &prepared, cfg.requests, cfg.concurrency).await;
    let wall = t0.elapsed();
    let after = stats(&channel).await.map_err(|s| format!("stats: {}", s.message))?;
    tally.latencies.sort();
    Ok(LoadReport {
        ok: tally.latencies.len() as u64,
        failed: tally.failed,
        errors: tally.errors,
        wall,
        latencies: tally.latencies,
        before,
        after,
        paths: tally.paths,
        bytes_in: tally.bytes_in,
        bytes_out: tally.bytes_out,
    })
}

/// One request of the field-update experiment.
#[derive(Clone, Debug)]
pub struct Step {
    /// 1-based request number.
    pub n: usize,
    /// Whether the compute units were available when it was sent.
    pub units_available: bool,
    /// Its latency (to the reply or the error).
    pub latency: Duration,
    /// The reply's path (verified), or the error.
    pub outcome: Result<String, String>,
}

/// RPCAcc's automatic field-update experiment (Fig. 11), in process: an
/// `rpcacc` server, ten sequential requests of `size` bytes; the compute
/// units vanish after request 3 and come back after request 6. With
/// `auto_update`, the server moves the image field to the host while they
/// are away, so requests 4–6 run on the host; without, they fail.
pub fn field_update_experiment(auto_update: bool, size: usize) -> Result<Vec<Step>, String> {
    let cfg = ServerConfig { scheme: Scheme::Rpcacc, auto_update, ..ServerConfig::default() };
    let server = RunningServer::start(&cfg, ([127, 0, 0, 1], 0).into())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let user = crate::crypto::USERS[0];
    let nonces = Nonces::new()?;
    let prepared = prepare(user.name, user.token, size, 10, 0, &nonces);
    rt.block_on(async {
        let channel = connect(&server.addr().to_string()).await.map_err(|s| s.message)?;
        // Warm the connection and the units up first (not recorded).
        let _ = compress(&channel, &prepared[0].request).await;
        let mut steps = Vec::new();
        for (i, p) in prepared.iter().enumerate() {
            let n = i + 1;
            match n {
                4 => server.set_units_available(false)?,
                7 => server.set_units_available(true)?,
                _ => {}
            }
            let t = Instant::now();
            let r = compress(&channel, &p.request).await;
            let latency = t.elapsed();
            let outcome = r
                .map_err(|s| format!("{:?}: {}", s.code, s.message))
                .and_then(|reply| verify(user.name, &p.image, &reply).map(|()| reply.path));
            steps.push(Step { n, units_available: !(4..=6).contains(&n), latency, outcome });
        }
        Ok(steps)
    })
}

/// The experiment's table.
pub fn format_steps(auto_update: bool, steps: &[Step]) -> String {
    let mut s = format!(
        "automatic field updating {}\n  req  units  latency_ms  outcome\n",
        if auto_update { "ON" } else { "OFF" }
    );
    for st in steps {
        s.push_str(&format!(
            "  {:>3}  {:<5}  {:>10.3}  {}\n",
            st.n,
            if st.units_available { "up" } else { "down" },
            st.latency.as_secs_f64() * 1e3,
            match &st.outcome {
                Ok(path) => format!("ok ({path})"),
                Err(e) => format!("FAILED {e}"),
            }
        ));
    }
    s
}

/// Writes requests as `protoplane load --data` reads them: each encoded
/// message prefixed by its length as a varint.
pub fn delimited(prepared: &[Prepared]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in prepared {
        prost::encoding::encode_varint(p.request.len() as u64, &mut out);
        out.extend_from_slice(&p.request);
    }
    out
}
