//! `protoplane bench intercept`: what a server interceptor chain adds to a
//! call, measured where it runs: a unary call of a trivial handler (it
//! lays out an empty response and sends it) driven the way the transports
//! drive one (a `Request`, a unary `Responder`, one poll of the handler's
//! future with a no-op waker), with no chain, with one trivial synchronous
//! interceptor (reads one metadata key in `before`, nothing in `after`),
//! and with four. Each measurement is a fresh process (this binary's
//! hidden `bench-intercept` worker); the variants are interleaved, their
//! order rotating every round; the table has the median over rounds of
//! each round's ns per call, and the difference to no chain.
//!
//! This measures the wrapper's cost alone: the transports' own work per
//! call (HTTP/2, decode, encode) is the same with or without a chain.

use std::process::Command;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use protoplane_grpc::intercept::{CallHead, Chain, Interceptor};
use protoplane_grpc::{
    BoxFuture, Message, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_schema::ProtoSource;
use protoplane_wire::Builder;

use crate::rpc::median;

#[derive(clap::Args, Debug)]
pub(crate) struct InterceptArgs {
    /// Rounds (fresh processes per variant per round).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Calls per measurement.
    #[arg(long, default_value_t = 2_000_000)]
    calls: u64,
}

#[derive(clap::Args, Debug)]
pub(crate) struct WorkerArgs {
    /// Interceptors in the chain (0: the service itself).
    #[arg(long)]
    interceptors: usize,
    /// Calls to make.
    #[arg(long)]
    calls: u64,
}

const PROTO: &str = r#"
syntax = "proto3";
package icpt.bench;
message Empty {}
service Svc { rpc Call(Empty) returns (Empty); }
"#;

struct Trivial {
    schema: Arc<Schema>,
}

impl Service for Trivial {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        "icpt.bench.Svc"
    }

    fn call(
        self: Arc<Self>,
        _method: u32,
        _req: Request<Streaming>,
        mut out: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(async move {
            let b = Builder::new(self.schema.tables(), out.output_type())?;
            out.send(b.finish()).await?;
            Ok(Metadata::new())
        })
    }
}

/// Reads one metadata key: the least an interceptor does.
struct Peek;

impl Interceptor for Peek {
    fn before(&self, call: &mut CallHead<'_>) -> Result<(), Status> {
        if call.metadata.get("authorization").is_some() {
            return Err(Status::new(protoplane_grpc::Code::Unauthenticated, "unexpected"));
        }
        Ok(())
    }
}

/// The worker: prints ns per call.
pub(crate) fn worker(args: &WorkerArgs) -> Result<(), String> {
    let src = [ProtoSource { name: "b.proto", text: PROTO }];
    let schema =
        Arc::new(Schema::from_proto_sources(&src, &["b.proto"]).map_err(|e| e.to_string())?);
    let method = schema.find("icpt.bench.Svc", "Call").ok_or("no method")?;
    let (input, output) = {
        let m = schema.method(method).ok_or("no method")?;
        (m.input, m.output)
    };
    let request = Builder::new(schema.tables(), input).map_err(|e| e.to_string())?.finish();
    let request = request.into_shared();
    let svc: Arc<dyn Service> = Arc::new(Trivial { schema: schema.clone() });
    let mut chain = Chain::new();
    for _ in 0..args.interceptors {
        chain = chain.with(Peek);
    }
    let svc = chain.wrap(svc);
    let mut cx = Context::from_waker(Waker::noop());
    let one = |cx: &mut Context<'_>| -> Result<(), String> {
        let message = Message::from_parts(request.clone(), Default::default(), input);
        let req = Request::new(Streaming::one(message));
        let (responder, mut slot) = Responder::for_unary(output);
        let mut fut = svc.clone().call(method, req, responder);
        match fut.as_mut().poll(cx) {
            Poll::Ready(Ok(_)) => {}
            other => return Err(format!("the call did not end at once: {:?}", other.is_ready())),
        }
        slot.try_recv().map_err(|e| e.to_string())?;
        Ok(())
    };
    for _ in 0..args.calls / 10 {
        one(&mut cx)?;
    }
    let t = Instant::now();
    for _ in 0..args.calls {
        one(&mut cx)?;
    }
    let ns = t.elapsed().as_nanos() as f64 / args.calls as f64;
    println!("{ns:.2}");
    Ok(())
}

/// The harness.
pub(crate) fn run(args: &InterceptArgs) -> Result<String, String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let variants = [0usize, 1, 4];
    let mut per: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for round in 0..args.rounds.max(1) {
        for k in 0..variants.len() {
            let v = (k + round) % variants.len();
            let out = Command::new(&me)
                .arg("bench-intercept")
                .args(["--interceptors", &variants[v].to_string()])
                .args(["--calls", &args.calls.to_string()])
                .output()
                .map_err(|e| format!("bench-intercept: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "bench-intercept failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            let ns: f64 = String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .map_err(|e| format!("bench-intercept output: {e}"))?;
            per[v].push(ns);
        }
    }
    let base = median(per[0].clone());
    let mut s = String::new();
    s.push_str(&format!(
        "Server interceptor chain, one unary call of a trivial handler driven in process; {} calls per measurement, fresh processes, variants interleaved, median of {} rounds.\n\n",
        args.calls,
        args.rounds.max(1)
    ));
    s.push_str("| interceptors | ns per call | added ns per call |\n|---:|---:|---:|\n");
    for (v, n) in variants.iter().enumerate() {
        let m = median(per[v].clone());
        s.push_str(&format!("| {n} | {m:.1} | {:.1} |\n", m - base));
    }
    let one = median(per[1].clone()) - base;
    s.push_str(&format!(
        "\nTarget: one trivial interceptor ≤ 50 ns per call: **{}** ({one:.1} ns)\n",
        if one <= 50.0 { "met" } else { "not met" }
    ));
    Ok(s)
}
