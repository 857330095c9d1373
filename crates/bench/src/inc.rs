//! `protoplane bench inc`: the in-network computation layer measured with
//! real processes on this machine — every run is `inc run`'s deployment
//! (controller, switch, server agent and client agents as processes on
//! loopback UDP), and every run's results are checked exactly.
//!
//! Experiments (NetRPC's evaluation, in software):
//! - `apps`: each application with the data plane vs. server agents only
//!   (no switch process; the clients talk to the server agent): goodput,
//!   bytes and packets reaching the server, server CPU, latency for
//!   key-value (a query) and agreement (a commit, one instance at a time).
//! - `clear`: synchronous aggregation with the three `Map.clear` policies
//!   at the same memory: step latency, memory, window, throughput
//!   (NetRPC Table 6).
//! - `cache`: key-value with a skewed key distribution and little memory:
//!   periodic counting vs. FCFS vs. hashing, by hit ratio and goodput.
//! - `share`: two synchronous aggregations on one data plane, the second
//!   starting later: goodput over time (NetRPC Fig. 10), an SVG.
//! - `overflow`: synchronous aggregation with a growing share of values
//!   whose sums leave 32 bits: goodput against the overflow ratio (NetRPC
//!   Fig. 13), an SVG.
//! - `mac`: what authenticating packets costs the data plane — the
//!   switch's time per packet (`Switch::process`, in this process) and,
//!   on the same datagrams, the MAC work alone (verifying what comes in,
//!   sealing what goes out), for each packet kind.
//!
//! Schemes of one experiment alternate within a round, rounds repeat, and
//! the tables show medians; absolute numbers drift on a shared machine,
//! the ratios are the result.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use protoplane_inc_examples::harness::{code_lines, App};
use protoplane_inc_examples::runner::{AppRun, AppSpec, Bins, Infra, RunReport};
use protoplane_plot::{grid, Panel, Series};

/// `protoplane bench inc`.
#[derive(clap::Args, Debug)]
pub(crate) struct IncArgs {
    /// One round, less work per run (a minute).
    #[arg(long)]
    quick: bool,
    /// Rounds (default 3, 1 with --quick).
    #[arg(long)]
    rounds: Option<u32>,
    /// Write every measurement here: experiment,app,scheme,round,metric,value.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Directory for the plots (inc-share.svg, inc-overflow.svg).
    #[arg(long, default_value = "target/bench-inc")]
    out: PathBuf,
    /// Clients per application.
    #[arg(long, default_value_t = 4)]
    clients: u16,
    /// Only these experiments (apps, clear, cache, share, overflow, mac).
    #[arg(long, value_delimiter = ',')]
    experiments: Vec<String>,
}

/// One measurement.
struct Row {
    experiment: &'static str,
    app: String,
    scheme: String,
    round: u32,
    metric: &'static str,
    value: f64,
}

struct Bench {
    rows: Vec<Row>,
    clients: u16,
    exact: bool,
    log: String,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The number after `key` in a `Stats { … }` line.
fn stat(lines: &[String], who: &str, key: &str) -> f64 {
    lines
        .iter()
        .filter(|l| l.starts_with(who))
        .filter_map(|l| {
            let i = l.find(&format!("{key}: "))?;
            l[i + key.len() + 2..].split(|c: char| !c.is_ascii_digit()).next()?.parse::<f64>().ok()
        })
        .sum()
}

impl Bench {
    fn push(
        &mut self,
        experiment: &'static str,
        app: &str,
        scheme: &str,
        round: u32,
        metric: &'static str,
        value: f64,
    ) {
        self.rows.push(Row {
            experiment,
            app: app.into(),
            scheme: scheme.into(),
            round,
            metric,
            value,
        });
    }

    fn med(&self, experiment: &str, app: &str, scheme: &str, metric: &str) -> f64 {
        median(
            self.rows
                .iter()
                .filter(|r| {
                    r.experiment == experiment
                        && r.app == app
                        && r.scheme == scheme
                        && r.metric == metric
                })
                .map(|r| r.value)
                .collect(),
        )
    }

    /// One deployment, one application instance; returns its report and
    /// the infrastructure's lines.
    fn run(&mut self, switches: u8, spec: &AppSpec) -> Result<(RunReport, Vec<String>), String> {
        let infra = Infra::start(Bins::find()?, switches, None)?;
        let run = AppRun::start(&infra, spec);
        let report = match run {
            Ok(r) => r.finish(Instant::now() + Duration::from_secs(300)),
            Err(e) => {
                infra.finish();
                return Err(e);
            }
        };
        let (lines, clean) = infra.finish();
        let mut report = report;
        report.exact &= clean;
        if !report.exact {
            self.exact = false;
            let _ = writeln!(
                self.log,
                "NOT EXACT: {} {:?}\n  {}",
                spec.app,
                spec.extra,
                report.lines.join("\n  ")
            );
        }
        Ok((report, lines))
    }
}

fn spec(app: &str, clients: u16, scale: u32, extra: &[&str]) -> AppSpec {
    AppSpec {
        app: app.into(),
        clients,
        scale,
        seed: 7,
        extra: extra.iter().map(|s| s.to_string()).collect(),
        ..AppSpec::default()
    }
}

/// The schemes of the `apps` experiment: (name, switches, flags).
/// `server-only` keeps the network path (the switch process forwards the
/// application's packets without computing: it has no data-plane memory),
/// so the only difference from `inc` is whether the data plane computes;
/// `direct` has no switch process at all (clients talk to the server agent).
const SCHEMES: [(&str, u8, &[&str]); 3] =
    [("inc", 1, &[]), ("server-only", 1, &["--memory=0"]), ("direct", 0, &[])];

fn apps(b: &mut Bench, rounds: u32, scale: u32) -> Result<(), String> {
    let n = b.clients;
    for round in 0..rounds {
        for app in ["sync-agg", "async-agg", "key-value", "agreement"] {
            // Rotate which scheme goes first.
            let mut schemes = SCHEMES;
            schemes.rotate_left(round as usize % SCHEMES.len());
            for (scheme, switches, extra) in schemes {
                let (r, _) = b.run(switches, &spec(app, n, scale, extra))?;
                let seconds = if app == "agreement" { r.leader_seconds } else { r.seconds };
                let items =
                    if app == "agreement" { 200.0 * f64::from(scale) } else { r.items as f64 };
                b.push("apps", app, scheme, round, "goodput_items_per_s", items / seconds);
                b.push("apps", app, scheme, round, "server_bytes", r.bytes_to_server() as f64);
                b.push("apps", app, scheme, round, "rpc_bytes", r.rpc_wire_bytes as f64);
                b.push("apps", app, scheme, round, "rpc_message_bytes", r.rpc_bytes as f64);
                b.push("apps", app, scheme, round, "server_packets", r.server_packets as f64);
                b.push("apps", app, scheme, round, "server_cpu_s", r.server_cpu);
                b.push("apps", app, scheme, round, "seconds", seconds);
                if app == "key-value" {
                    let ms = r.details.iter().find_map(|d| {
                        let i = d.find("read in ")?;
                        d[i + 8..].split(' ').next()?.parse::<f64>().ok()
                    });
                    b.push("apps", app, scheme, round, "query_latency_ms", ms.unwrap_or(f64::NAN));
                }
                if app == "agreement" {
                    let mut seq = vec!["--sequential"];
                    seq.extend_from_slice(extra);
                    let (l, _) = b.run(switches, &spec(app, n, 1, &seq))?;
                    b.push("apps", app, scheme, round, "commit_latency_us", l.commit_latency_us);
                }
            }
        }
    }
    Ok(())
}

fn clear(b: &mut Bench, rounds: u32, scale: u32) -> Result<(), String> {
    let n = b.clients;
    for round in 0..rounds {
        for policy in ["copy", "shadow", "lazy"] {
            let clear = format!("--clear={policy}");
            let (r, _) = b.run(1, &spec("sync-agg", n, scale, &[&clear, "--memory=16"]))?;
            // 4 steps per scale unit of 4,096 values in 128 chunks each.
            let steps = 4.0 * f64::from(scale);
            b.push("clear", "sync-agg", policy, round, "step_latency_ms", r.seconds / steps * 1e3);
            b.push(
                "clear",
                "sync-agg",
                policy,
                round,
                "throughput_values_per_s",
                r.items as f64 / r.seconds,
            );
            b.push("clear", "sync-agg", policy, round, "server_packets", r.server_packets as f64);
            // 16 indices of 32 groups; the window (chunks in flight) follows.
            let (cells, window) = match policy {
                "copy" => (16.0 * 32.0, 16.0),
                "shadow" => (16.0 * 32.0, 8.0),
                _ => (16.0 * 32.0, 8.0),
            };
            b.push("clear", "sync-agg", policy, round, "memory_cells", cells);
            b.push("clear", "sync-agg", policy, round, "window_chunks", window);
        }
    }
    Ok(())
}

fn cache(b: &mut Bench, rounds: u32, scale: u32) -> Result<(), String> {
    let n = b.clients;
    for round in 0..rounds {
        for policy in ["periodic-counting", "fcfs", "hashing"] {
            let cache = format!("--cache={policy}");
            // 4 indices × 32 groups = 128 cells for 4,096 skewed keys.
            let (r, lines) = b.run(1, &spec("key-value", n, scale, &[&cache, "--memory=4"]))?;
            let applied = stat(&lines, "switch", "applied");
            let host = r.server_packets as f64;
            let _ = host;
            let sent = r.items as f64;
            b.push("cache", "key-value", policy, round, "hit_ratio", applied / sent);
            b.push("cache", "key-value", policy, round, "goodput_items_per_s", sent / r.seconds);
            b.push("cache", "key-value", policy, round, "server_bytes", r.bytes_to_server() as f64);
        }
    }
    Ok(())
}

/// Goodput per `bin_us` bin, from progress points, between `t0` and `t1`.
fn binned(points: &[(u64, u64)], t0: u64, t1: u64, bin_us: u64) -> Vec<f64> {
    let bins = ((t1 - t0) / bin_us + 1) as usize;
    let mut v = vec![0.0; bins];
    for (t, items) in points {
        if *t >= t0 && *t <= t1 {
            v[((t - t0) / bin_us) as usize] += *items as f64;
        }
    }
    v.iter().map(|x| x * 1e6 / bin_us as f64).collect()
}

fn share(b: &mut Bench, scale: u32, out: &std::path::Path) -> Result<String, String> {
    let n = b.clients;
    let infra = Infra::start(Bins::find()?, 1, None)?;
    // The first runs long enough for the second to arrive, run beside it
    // and finish first.
    let mut first = spec("sync-agg", n, 8 * scale, &[]);
    first.progress = true;
    let mut second = first.clone();
    second.scale = 3 * scale;
    let t0 = protoplane_inc_net::now_us();
    let a = AppRun::start(&infra, &first)?;
    std::thread::sleep(Duration::from_millis(100 * u64::from(scale)));
    let b2 = AppRun::start(&infra, &second)?;
    let deadline = Instant::now() + Duration::from_secs(300);
    let ra = a.finish(deadline);
    let rb = b2.finish(deadline);
    let (_, clean) = infra.finish();
    b.exact &= ra.exact && rb.exact && clean;
    let t1 = ra.progress.iter().chain(&rb.progress).map(|p| p.0).max().unwrap_or(t0 + 1);
    let bin = ((t1 - t0) / 40).max(10_000);
    let ga = binned(&ra.progress, t0, t1, bin);
    let gb = binned(&rb.progress, t0, t1, bin);
    for (i, (x, y)) in ga.iter().zip(&gb).enumerate() {
        b.push("share", "sync-agg", "first", i as u32, "goodput_values_per_s", *x);
        b.push("share", "sync-agg", "second", i as u32, "goodput_values_per_s", *y);
    }
    // A label on every fifth bin.
    let xs: Vec<String> = (0..ga.len())
        .map(|i| {
            if i % 5 == 0 {
                format!("{:.1}", (i as u64 * bin) as f64 / 1e6)
            } else {
                String::new()
            }
        })
        .collect();
    let total: Vec<f64> = ga.iter().zip(&gb).map(|(x, y)| x + y).collect();
    let svg = grid(
        "Two synchronous aggregations sharing the data plane (goodput over time)",
        "seconds",
        &xs,
        &[Panel {
            title: format!("{n} workers each; the second starts later"),
            y_label: "values aggregated per second".into(),
            series: vec![
                Series { name: "first".into(), color: "#1f77b4", ys: ga },
                Series { name: "second".into(), color: "#d62728", ys: gb },
                Series { name: "total".into(), color: "#7f7f7f", ys: total },
            ],
        }],
        1,
    );
    let path = out.join("inc-share.svg");
    std::fs::write(&path, svg).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path.display().to_string())
}

fn overflow(
    b: &mut Bench,
    rounds: u32,
    scale: u32,
    out: &std::path::Path,
) -> Result<String, String> {
    let n = b.clients;
    let ratios = [0u32, 10, 50, 100, 200, 500];
    for round in 0..rounds {
        for permille in ratios {
            let flag = format!("--overflow-permille={permille}");
            let (r, _) = b.run(1, &spec("sync-agg", n, scale, &[&flag]))?;
            let scheme = format!("{:.1}%", f64::from(permille) / 10.0);
            b.push(
                "overflow",
                "sync-agg",
                &scheme,
                round,
                "goodput_values_per_s",
                r.items as f64 / r.seconds,
            );
            b.push(
                "overflow",
                "sync-agg",
                &scheme,
                round,
                "server_packets",
                r.server_packets as f64,
            );
        }
    }
    let xs: Vec<String> = ratios.iter().map(|p| format!("{:.1}%", f64::from(*p) / 10.0)).collect();
    let ys: Vec<f64> =
        xs.iter().map(|x| b.med("overflow", "sync-agg", x, "goodput_values_per_s")).collect();
    let pk: Vec<f64> =
        xs.iter().map(|x| b.med("overflow", "sync-agg", x, "server_packets")).collect();
    let svg = grid(
        "Synchronous aggregation: goodput vs. overflow ratio",
        "values whose sum leaves 32 bits",
        &xs,
        &[
            Panel {
                title: "goodput".into(),
                y_label: "values aggregated per second".into(),
                series: vec![Series { name: "in-network".into(), color: "#1f77b4", ys }],
            },
            Panel {
                title: "packets reaching the server agent".into(),
                y_label: "packets".into(),
                series: vec![Series { name: "in-network".into(), color: "#d62728", ys: pk }],
            },
        ],
        2,
    );
    let path = out.join("inc-overflow.svg");
    std::fs::write(&path, svg).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path.display().to_string())
}

pub(crate) fn run(a: &IncArgs) -> Result<String, String> {
    let rounds = a.rounds.unwrap_or(if a.quick { 1 } else { 3 }).max(1);
    let scale = if a.quick { 2 } else { 8 };
    if a.clients < 2 || a.clients > 32 {
        return Err(format!("--clients {}: 2 to 32", a.clients));
    }
    let want = |e: &str| a.experiments.is_empty() || a.experiments.iter().any(|x| x == e);
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let mut b = Bench { rows: Vec::new(), clients: a.clients, exact: true, log: String::new() };
    let mut plots = Vec::new();
    if want("apps") {
        apps(&mut b, rounds, scale)?;
    }
    if want("clear") {
        clear(&mut b, rounds, scale)?;
    }
    if want("cache") {
        cache(&mut b, rounds, scale)?;
    }
    if want("share") {
        plots.push(share(&mut b, scale, &a.out)?);
    }
    if want("overflow") {
        plots.push(overflow(&mut b, rounds, scale.min(4), &a.out)?);
    }
    if want("mac") {
        mac(&mut b, rounds.max(3))?;
    }
    if let Some(path) = &a.csv {
        let mut csv = String::from("experiment,app,scheme,round,metric,value\n");
        for r in &b.rows {
            let _ = writeln!(
                csv,
                "{},{},{},{},{},{}",
                r.experiment, r.app, r.scheme, r.round, r.metric, r.value
            );
        }
        std::fs::write(path, csv).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(report(&b, rounds, scale, &plots))
}

fn report(b: &Bench, rounds: u32, scale: u32, plots: &[String]) -> String {
    let mut s = String::new();
    let n = b.clients;
    let _ = writeln!(s, "bench inc: {n} clients per application, scale {scale}, {rounds} round(s), medians; every run checked exactly\n");
    let has = |e: &str| b.rows.iter().any(|r| r.experiment == e);
    let _ = writeln!(s, "## What each application takes to write\n");
    let _ = writeln!(
        s,
        "Lines that are not blank and not only a comment: the user code (`examples/inc/src/<app>.rs`: \
         the server trait implementation and the client functions, written against the generated \
         code), the NetFilter and the `.proto`.\n"
    );
    let _ = writeln!(s, "| application | user code | NetFilter | .proto |");
    let _ = writeln!(s, "|---|---:|---:|---:|");
    for app in App::ALL {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            app.name(),
            code_lines(app.user_code()),
            code_lines(app.filter()),
            code_lines(app.proto())
        );
    }
    let _ = writeln!(s);
    if has("apps") {
        let _ = writeln!(s, "## Applications: in-network vs. server agents only\n");
        let _ = writeln!(s, "| application | scheme | goodput (items/s) | server bytes | of which ordinary calls | server packets | server CPU (s) | latency |");
        let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---|");
        let mut targets = Vec::new();
        for app in ["sync-agg", "async-agg", "key-value", "agreement"] {
            for scheme in ["inc", "server-only", "direct"] {
                let latency = match app {
                    "key-value" => {
                        format!("query {:.2} ms", b.med("apps", app, scheme, "query_latency_ms"))
                    }
                    "agreement" => {
                        format!("commit {:.0} µs", b.med("apps", app, scheme, "commit_latency_us"))
                    }
                    _ => "—".into(),
                };
                let _ = writeln!(
                    s,
                    "| {app} | {scheme} | {:.0} | {:.0} | {:.0} | {:.0} | {:.3} | {latency} |",
                    b.med("apps", app, scheme, "goodput_items_per_s"),
                    b.med("apps", app, scheme, "server_bytes"),
                    b.med("apps", app, scheme, "rpc_bytes"),
                    b.med("apps", app, scheme, "server_packets"),
                    b.med("apps", app, scheme, "server_cpu_s"),
                );
            }
            let g = b.med("apps", app, "inc", "goodput_items_per_s")
                / b.med("apps", app, "server-only", "goodput_items_per_s");
            let bytes = b.med("apps", app, "inc", "server_bytes")
                / b.med("apps", app, "server-only", "server_bytes");
            let d = b.med("apps", app, "inc", "goodput_items_per_s")
                / b.med("apps", app, "direct", "goodput_items_per_s");
            targets.push((app, g, bytes, d));
        }
        let _ = writeln!(
            s,
            "\n`server-only`: the same processes and network path, the switch forwarding without computing; `direct`: no switch process. Every client calls through the service's generated in-network stub: server bytes are the INC datagrams reaching the server agent (UDP payload) plus the ordinary calls' bytes on the wire to the server (TCP payload: HTTP/2 and gRPC framing included, counted by a relay in front of the server; their request messages alone, IEDT fields cut out, are `rpc_message_bytes` in the CSV), and server packets are the datagrams.\n"
        );
        let _ = writeln!(
            s,
            "| application | goodput in-network / server-only (target ≥ 1.3) | server bytes in-network / server-only | goodput in-network / direct |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|");
        for (app, g, bytes, d) in &targets {
            let mark = if *g >= 1.3 { "met" } else { "NOT met" };
            let bytes_note = if *app == "sync-agg" {
                let met = if *bytes <= 1.0 / f64::from(n) { "met" } else { "NOT met" };
                format!("{bytes:.3} (target ≤ 1/{n} = {:.3}: {met})", 1.0 / f64::from(n))
            } else {
                format!("{bytes:.3}")
            };
            let _ = writeln!(s, "| {app} | {g:.2} ({mark}) | {bytes_note} | {d:.2} |");
        }
        s.push('\n');
    }
    if has("clear") {
        let _ =
            writeln!(s, "## Map.clear policies (synchronous aggregation, 16 register indices)\n");
        let _ = writeln!(s, "| policy | step latency (ms) | memory (cells) | window (chunks) | throughput (values/s) | server packets |");
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|");
        for p in ["copy", "shadow", "lazy"] {
            let _ = writeln!(
                s,
                "| {p} | {:.2} | {:.0} | {:.0} | {:.0} | {:.0} |",
                b.med("clear", "sync-agg", p, "step_latency_ms"),
                b.med("clear", "sync-agg", p, "memory_cells"),
                b.med("clear", "sync-agg", p, "window_chunks"),
                b.med("clear", "sync-agg", p, "throughput_values_per_s"),
                b.med("clear", "sync-agg", p, "server_packets"),
            );
        }
        s.push('\n');
    }
    if has("cache") {
        let _ = writeln!(s, "## Cache policies (key-value, 4,096 skewed keys, 128 cells)\n");
        let _ = writeln!(s, "| policy | hit ratio | goodput (items/s) | server bytes |");
        let _ = writeln!(s, "|---|---:|---:|---:|");
        for p in ["periodic-counting", "fcfs", "hashing"] {
            let _ = writeln!(
                s,
                "| {p} | {:.3} | {:.0} | {:.0} |",
                b.med("cache", "key-value", p, "hit_ratio"),
                b.med("cache", "key-value", p, "goodput_items_per_s"),
                b.med("cache", "key-value", p, "server_bytes"),
            );
        }
        s.push('\n');
    }
    if has("overflow") {
        let _ = writeln!(s, "## Overflow (synchronous aggregation)\n");
        let _ = writeln!(s, "| values overflowing | goodput (values/s) | server packets |");
        let _ = writeln!(s, "|---|---:|---:|");
        let mut seen: BTreeMap<u32, String> = BTreeMap::new();
        for r in b.rows.iter().filter(|r| r.experiment == "overflow") {
            let key = (r.scheme.trim_end_matches('%').parse::<f64>().unwrap_or(0.0) * 10.0) as u32;
            seen.insert(key, r.scheme.clone());
        }
        for scheme in seen.values() {
            let _ = writeln!(
                s,
                "| {scheme} | {:.0} | {:.0} |",
                b.med("overflow", "sync-agg", scheme, "goodput_values_per_s"),
                b.med("overflow", "sync-agg", scheme, "server_packets"),
            );
        }
        s.push('\n');
    }
    if has("mac") {
        let _ = writeln!(
            s,
            "## The MAC on the data plane
"
        );
        let _ = writeln!(
            s,
            "Per packet, medians of rounds: the switch's whole pass (`Switch::process`: MAC check, \
             parse, registers, the answer built and sealed) and the MAC work alone on the same \
             datagrams (SipHash-2-4 over what comes in and what goes out).\n"
        );
        let _ = writeln!(s, "| packet | bytes in | pipeline ns/packet | MAC ns/packet | MAC share of the pipeline | MAC share of the switch process (target ≤ 10%) |");
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|");
        let process = b.med("mac", "process", "switch", "ns_per_packet");
        for kind in MAC_KINDS {
            let total = b.med("mac", kind, "switch", "ns_per_packet");
            let m = b.med("mac", kind, "mac", "ns_per_packet");
            let bytes = b.med("mac", kind, "switch", "bytes_in");
            let share = m / total;
            let of_process = m / process;
            let mark = if of_process <= 0.10 { "met" } else { "NOT met" };
            let _ = writeln!(
                s,
                "| {kind} | {bytes:.0} | {total:.0} | {m:.0} | {:.1}% | {:.1}% ({mark}) |",
                share * 100.0,
                of_process * 100.0
            );
        }
        let _ = writeln!(
            s,
            "\nThe switch process spent {process:.0} ns of CPU per datagram in a synchronous \
             aggregation (4 clients, scale 4: UDP receive and send, the pipeline, fault \
             injection); the pipeline alone is the in-process figure.\n"
        );
    }
    for p in plots {
        let _ = writeln!(s, "plot: {p}");
    }
    s.push_str(&b.log);
    let _ = writeln!(s, "exact: {}", if b.exact { "yes" } else { "no" });
    s
}

/// The packet kinds the `mac` experiment times.
const MAC_KINDS: [&str; 3] = ["add-32-pairs", "agg-32-pairs", "vote"];

/// `mac`: the switch's time per packet and the MAC's share of it.
fn mac(b: &mut Bench, rounds: u32) -> Result<(), String> {
    use protoplane_inc::mac::Key;
    use protoplane_inc::packet::{seal, verify, Addr, Flags, Header, Kind, Packet, Pair};
    use protoplane_inc::switch::{
        AppEntry, Control, CountMode, Destinations, Emit, Switch, SwitchConfig,
    };
    const N: u32 = 200_000;
    let key = Key([7; 16]);
    let config = SwitchConfig { node: 900, ..SwitchConfig::default() };
    let members: Vec<u16> = (1..=32).collect();
    let entry = AppEntry {
        app: 1,
        server: 100,
        members: members.clone(),
        forward: Destinations::Members,
        flow_base: 0,
        flows: 32,
        mem_base: 0,
        mem_len: 1024,
        threshold: u32::MAX,
        count: CountMode::TestAndSet,
        modify: None,
        key,
    };
    // The packets of one kind, numbered `i`: every pair applied (adds to
    // cells whose tags match, contributions to an open slot, votes).
    let packet = |kind: &str, i: u32| -> Packet {
        let flow = (i % 32) as u16;
        let seq = i / 32;
        let mut h = Header::new(Kind::Add, 1, flow + 1, 100);
        h.flow = flow;
        h.ext = Header::SEQUENCED;
        h.seq = seq;
        if (seq / config.window) & 1 == 1 {
            h.flags = Flags(Flags::FLIP);
        }
        match kind {
            "add-32-pairs" => Packet::pairs(
                h,
                (0..32u32)
                    .map(|g| Pair { key: g, addr: Addr::new(0, g as u8, 0), value: 1 })
                    .collect(),
            ),
            "agg-32-pairs" => {
                h.kind = Kind::Agg;
                h.ext = 0;
                h.seq = 0;
                h.aux = seq % 512;
                Packet::pairs(
                    h,
                    (0..32u32)
                        .map(|g| Pair {
                            key: g,
                            addr: Addr::new(0, g as u8, (seq % 512) as u16),
                            value: 1,
                        })
                        .collect(),
                )
            }
            _ => {
                h.kind = Kind::Vote;
                h.aux = 7;
                Packet::pairs(h, vec![Pair { key: 7, addr: Addr::new(0, 0, 600), value: 1 }])
            }
        }
    };
    for round in 0..rounds {
        for kind in MAC_KINDS {
            let mut sw = match Switch::new(config.clone()) {
                Ok(s) => s,
                Err(e) => return Err(e.to_string()),
            };
            sw.control(Control::Install(entry.clone()));
            let cells = (0..32u8).map(|g| (Addr::new(0, g, 0), u32::from(g), 0)).collect();
            sw.control(Control::SwapMany { app: 1, cells });
            sw.control(Control::ResetMeta { app: 1, slots: vec![(600, 7)] });
            let datagrams: Vec<Vec<u8>> = (0..N).map(|i| packet(kind, i).seal(&key)).collect();
            let mut out: Vec<Emit> = Vec::new();
            let mut emitted: Vec<Vec<u8>> = Vec::new();
            let t = Instant::now();
            for d in &datagrams {
                sw.process(0, 0, d, &mut out);
                out.clear();
            }
            let total = t.elapsed().as_nanos() as f64 / f64::from(N);
            // The same datagrams again for what the switch sends back.
            for d in datagrams.iter().take(1024) {
                sw.process(0, 0, d, &mut out);
                emitted.extend(out.drain(..).map(|e| e.bytes));
            }
            let per_in = emitted.len().max(1) as f64 / 1024.0;
            let t = Instant::now();
            let mut ok = 0u32;
            let mut k = 0usize;
            for d in &datagrams {
                ok += u32::from(verify(std::hint::black_box(d), &key));
                // What the switch seals per packet, on average.
                let mut sealed_here = 0.0;
                while sealed_here < per_in && !emitted.is_empty() {
                    let n = emitted.len();
                    let e = &mut emitted[k % n];
                    seal(std::hint::black_box(e), &key);
                    k += 1;
                    sealed_here += 1.0;
                }
            }
            std::hint::black_box(ok);
            let m = t.elapsed().as_nanos() as f64 / f64::from(N);
            b.push("mac", kind, "switch", round, "ns_per_packet", total);
            b.push("mac", kind, "mac", round, "ns_per_packet", m);
            b.push("mac", kind, "switch", round, "bytes_in", datagrams[0].len() as f64);
        }
        // The switch as a process: its CPU time per datagram in a real
        // synchronous aggregation (UDP receive and send included).
        let (_, lines) = b.run(1, &spec("sync-agg", b.clients, 4, &[]))?;
        let cpu =
            lines.iter().find(|l| l.contains("switch cpu_s=")).map_or((f64::NAN, f64::NAN), |l| {
                let num = |k: &str| {
                    l.split(&format!("{k}="))
                        .nth(1)
                        .and_then(|r| r.split_whitespace().next())
                        .and_then(|v| v.parse::<f64>().ok())
                        .unwrap_or(f64::NAN)
                };
                (num("cpu_s"), num("packets"))
            });
        b.push("mac", "process", "switch", round, "ns_per_packet", cpu.0 * 1e9 / cpu.1);
    }
    Ok(())
}
