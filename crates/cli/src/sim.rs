//! `protoplane sim`: replays a dataset through the engine's decode and
//! encode with transaction counting on and prints, per interconnect,
//! field-by-field vs one-shot decode, CPU-only vs device-only vs
//! co-serialized encode, and the nested-message penalty (RPCAcc Figs. 2,
//! 6, 10), with a CSV of every figure and an SVG plot. The work is
//! `protoplane-sim`'s; this file parses flags, aggregates and prints.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use protoplane_sim::dataset::{builtin, default_dataset, load, Workload};
use protoplane_sim::model::Interconnect;
use protoplane_sim::replay::{
    decode_rows, encode_rows, nested, DecodeRow, Effort, EncodeRow, NestedRow, LARGE,
};

use protoplane_plot::{grid, Panel, Series};

/// `protoplane sim` flags.
#[derive(clap::Args, Debug)]
pub(crate) struct SimArgs {
    /// A dataset directory with a manifest.tsv (HyperProtoBench, or
    /// length-delimited recordings with their descriptor set). Default:
    /// ../shared/datasets/hyperprotobench if present, else a built-in workload.
    #[arg(long, value_name = "DIR")]
    dataset: Option<PathBuf>,
    /// Interconnects to model (repeatable; default all three).
    #[arg(long, value_parser = ["pcie", "cxl", "onchip"])]
    interconnect: Vec<String>,
    /// Write every figure here (experiment,group,message,interconnect,scheme,metric,value).
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// Directory for the SVG plot.
    #[arg(long, value_name = "DIR", default_value = "target/sim")]
    out: PathBuf,
    /// Temp buffer of the one-shot commit, bytes.
    #[arg(long, default_value_t = 4096)]
    temp: usize,
    /// Fewer and shorter timing rounds.
    #[arg(long)]
    quick: bool,
}

struct Csv(String);

impl Csv {
    #[allow(clippy::too_many_arguments)] // one CSV row
    fn row(
        &mut self,
        exp: &str,
        group: &str,
        msg: &str,
        ic: &str,
        scheme: &str,
        metric: &str,
        v: f64,
    ) {
        let _ = writeln!(self.0, "{exp},{group},{msg},{ic},{scheme},{metric},{v}");
    }
}

/// Sums of a bench's decode rows.
#[derive(Default)]
struct DecodeSum {
    messages: usize,
    wire: f64,
    fbf_writes: f64,
    os_writes: f64,
    decode_ns: f64,
    one_shot_ns: f64,
    rows: Vec<DecodeRow>,
}

pub(crate) fn run(a: &SimArgs) -> Result<String, String> {
    let workload: Workload = match (&a.dataset, default_dataset()) {
        (Some(d), _) => load(d),
        (None, Some(d)) => load(&d),
        (None, None) => builtin(),
    }
    .map_err(|e| e.to_string())?;
    let names: Vec<String> = if a.interconnect.is_empty() {
        vec!["pcie".into(), "cxl".into(), "onchip".into()]
    } else {
        a.interconnect.clone()
    };
    let ics: Vec<Interconnect> = names
        .iter()
        .map(|n| Interconnect::by_name(n).ok_or_else(|| format!("--interconnect {n}")))
        .collect::<Result<_, _>>()?;
    let mut effort = if a.quick { Effort::quick() } else { Effort::full() };
    effort.temp = a.temp.max(64);
    let dec = decode_rows(&workload, effort).map_err(|e| e.to_string())?;
    let enc = encode_rows(&workload, effort).map_err(|e| e.to_string())?;
    let nest = nested(&[0, 1, 3, 7, 15], effort).map_err(|e| e.to_string())?;

    let mut csv = Csv(String::from("experiment,group,message,interconnect,scheme,metric,value\n"));
    let mut s = String::new();
    let _ = writeln!(
        s,
        "protoplane sim: {} ({} messages), one-shot temp buffer {} B{}\n",
        workload.source,
        dec.len(),
        effort.temp,
        if a.quick { ", quick" } else { "" }
    );
    let _ = writeln!(s, "## Interconnects\n");
    let _ =
        writeln!(s, "| interconnect | latency per transaction (ns) | bandwidth (GB/s) | figures |");
    let _ = writeln!(s, "|---|---:|---:|---|");
    for ic in &ics {
        let _ = writeln!(
            s,
            "| {} | {:.0} | {:.1} | {} |",
            ic.name,
            ic.latency_ns,
            ic.bandwidth_gbs,
            if ic.measured { "measured on this machine" } else { "from the literature (modelled)" }
        );
        csv.row("interconnect", "", "", &ic.name, "", "latency_ns", ic.latency_ns);
        csv.row("interconnect", "", "", &ic.name, "", "bandwidth_gbs", ic.bandwidth_gbs);
    }

    // Decode, per bench.
    let mut by_group: BTreeMap<String, DecodeSum> = BTreeMap::new();
    for r in &dec {
        let g = by_group.entry(r.group.clone()).or_default();
        g.messages += 1;
        g.wire += r.wire_bytes as f64;
        g.fbf_writes += r.field_by_field.writes as f64;
        g.os_writes += r.one_shot.writes as f64;
        g.decode_ns += r.decode_ns;
        g.one_shot_ns += r.one_shot_ns;
        g.rows.push(r.clone());
        for (scheme, st, ns) in [
            ("field-by-field", r.field_by_field, r.decode_ns),
            ("one-shot", r.one_shot, r.one_shot_ns),
        ] {
            csv.row("decode", &r.group, &r.name, "", scheme, "host_transactions", st.writes as f64);
            csv.row("decode", &r.group, &r.name, "", scheme, "host_bytes", st.bytes as f64);
            csv.row("decode", &r.group, &r.name, "", scheme, "cpu_ns_measured", ns);
            for ic in &ics {
                let t = ns + ic.cost_ns(st);
                csv.row("decode", &r.group, &r.name, &ic.name, scheme, "time_ns_modelled", t);
            }
        }
    }
    let _ = writeln!(s, "\n## Decode: field by field vs one-shot commit (RPCAcc Fig. 10)\n");
    let _ = writeln!(
        s,
        "Host-memory transactions are counted (the decoder's own stores, field by field; the commit's copies, one-shot); CPU times are measured here; interconnect time is modelled: time = CPU + transactions × latency + bytes / bandwidth.\n"
    );
    let mut head = String::from("| bench | messages | transactions field-by-field | one-shot | CPU µs/msg (fbf / one-shot) |");
    let mut rule = String::from("|---|---:|---:|---:|---:|");
    for ic in &ics {
        let _ = write!(head, " {} decode MB/s (fbf → one-shot) | {} speed-up |", ic.name, ic.name);
        rule.push_str("---:|---:|");
    }
    let _ = writeln!(s, "{head}\n{rule}");
    let mut speedups: Vec<(String, Vec<f64>)> = Vec::new();
    let mut all_fewer = true;
    for (group, g) in &by_group {
        let fewer = g.rows.iter().all(|r| r.one_shot.writes < r.field_by_field.writes);
        all_fewer &= fewer;
        let mut line = format!(
            "| {group} | {} | {:.0} | {:.0}{} | {:.2} / {:.2} |",
            g.messages,
            g.fbf_writes,
            g.os_writes,
            if fewer { "" } else { " (not fewer on every message)" },
            g.decode_ns / g.messages as f64 / 1e3,
            g.one_shot_ns / g.messages as f64 / 1e3
        );
        let mut ups = Vec::new();
        for ic in &ics {
            let fbf: f64 = g.rows.iter().map(|r| r.decode_ns + ic.cost_ns(r.field_by_field)).sum();
            let os: f64 = g.rows.iter().map(|r| r.one_shot_ns + ic.cost_ns(r.one_shot)).sum();
            let _ = write!(
                line,
                " {:.0} → {:.0} | {:.2}× |",
                g.wire / fbf * 1e3,
                g.wire / os * 1e3,
                fbf / os
            );
            ups.push(fbf / os);
            csv.row("decode", group, "", &ic.name, "one-shot", "speedup_modelled", fbf / os);
        }
        speedups.push((group.clone(), ups));
        let _ = writeln!(s, "{line}");
    }
    if let Some(i) = ics.iter().position(|ic| ic.name == "pcie") {
        let min = speedups.iter().map(|(_, u)| u[i]).fold(f64::INFINITY, f64::min);
        let _ = writeln!(
            s,
            "\nTargets: fewer host transactions one-shot on every message: {}; PCIe decode speed-up ≥ 2× on every bench (RPCAcc: 2.2×): lowest {:.2}× ({}).",
            if all_fewer { "met" } else { "NOT met" },
            min,
            if min >= 2.0 { "met" } else { "NOT met" }
        );
    }

    // Encode.
    let _ = writeln!(s, "\n## Encode: CPU-only vs device-only vs co-serialized (RPCAcc Fig. 6)\n");
    let _ = writeln!(
        s,
        "Application CPU per response (measured): CPU-only lays the response out and encodes it; co-serialized only lays it out (the engine encodes); with memcpy offload it also leaves values of ≥ {LARGE} B to the engine. End-to-end time (modelled): device-only encodes by reading the host block item by item across the interconnect, co-serialized pulls the block in one-shot copies.\n"
    );
    let mut head = String::from("| bench | app µs: CPU-only | co-serialized | + memcpy offload | co-ser / CPU-only | + memcpy / CPU-only |");
    let mut rule = String::from("|---|---:|---:|---:|---:|---:|");
    for ic in &ics {
        let _ = write!(head, " {} µs: CPU-only / device-only / co-ser |", ic.name);
        rule.push_str("---|");
    }
    let _ = writeln!(s, "{head}\n{rule}");
    let mut enc_groups: BTreeMap<String, Vec<&EncodeRow>> = BTreeMap::new();
    for r in &enc {
        enc_groups.entry(r.group.clone()).or_default().push(r);
        let cpu_only = r.lay_out_ns + r.encode_ns;
        csv.row("encode", &r.group, &r.name, "", "cpu-only", "app_cpu_ns", cpu_only);
        csv.row("encode", &r.group, &r.name, "", "co-serialized", "app_cpu_ns", r.lay_out_ns);
        csv.row(
            "encode",
            &r.group,
            &r.name,
            "",
            "memcpy-offload",
            "app_cpu_ns",
            r.lay_out_small_ns,
        );
        csv.row(
            "encode",
            &r.group,
            &r.name,
            "",
            "memcpy-offload",
            "engine_copy_ns",
            r.large_copy_ns,
        );
        csv.row("encode", &r.group, &r.name, "", "engine", "encode_ns", r.encode_ns);
        for ic in &ics {
            csv.row(
                "encode",
                &r.group,
                &r.name,
                &ic.name,
                "cpu-only",
                "time_ns_modelled",
                cpu_only,
            );
            let dev = r.lay_out_ns + ic.cost_ns(r.device_reads) + r.encode_ns;
            csv.row("encode", &r.group, &r.name, &ic.name, "device-only", "time_ns_modelled", dev);
            let co = r.lay_out_ns + ic.cost_ns(r.block_pull) + r.encode_ns;
            csv.row("encode", &r.group, &r.name, &ic.name, "co-serialized", "time_ns_modelled", co);
        }
    }
    let mut worst_co = 0f64;
    let mut worst_mem = 0f64;
    for (group, rows) in &enc_groups {
        let n = rows.len() as f64;
        let cpu: f64 = rows.iter().map(|r| r.lay_out_ns + r.encode_ns).sum::<f64>() / n;
        let co: f64 = rows.iter().map(|r| r.lay_out_ns).sum::<f64>() / n;
        let mem: f64 = rows.iter().map(|r| r.lay_out_small_ns).sum::<f64>() / n;
        worst_co = worst_co.max(co / cpu);
        worst_mem = worst_mem.max(mem / cpu);
        let mut line = format!(
            "| {group} | {:.2} | {:.2} | {:.2} | {:.0}% | {:.0}% |",
            cpu / 1e3,
            co / 1e3,
            mem / 1e3,
            100.0 * co / cpu,
            100.0 * mem / cpu
        );
        for ic in &ics {
            let dev: f64 = rows
                .iter()
                .map(|r| r.lay_out_ns + ic.cost_ns(r.device_reads) + r.encode_ns)
                .sum::<f64>()
                / n;
            let cos: f64 = rows
                .iter()
                .map(|r| r.lay_out_ns + ic.cost_ns(r.block_pull) + r.encode_ns)
                .sum::<f64>()
                / n;
            let _ = write!(line, " {:.2} / {:.2} / {:.2} |", cpu / 1e3, dev / 1e3, cos / 1e3);
        }
        let _ = writeln!(s, "{line}");
    }
    let _ = writeln!(
        s,
        "\nTarget: application CPU per response ≤ 30% of encoding on the application core (RPCAcc: 22%): co-serialized at most {:.0}% ({}), with memcpy offload at most {:.0}% ({}).",
        100.0 * worst_co,
        if worst_co <= 0.3 { "met" } else { "NOT met" },
        100.0 * worst_mem,
        if worst_mem <= 0.3 { "met" } else { "NOT met" }
    );

    // Nested.
    let _ = writeln!(s, "\n## The nested-message penalty (RPCAcc Fig. 2)\n");
    let _ = writeln!(
        s,
        "The same 16 units (eight integers and a 64-byte string each) in one message or spread over a chain of nested messages.\n"
    );
    let mut head = String::from("| nesting depth | wire bytes | transactions fbf | one-shot |");
    let mut rule = String::from("|---:|---:|---:|---:|");
    for ic in &ics {
        let _ = write!(head, " {} µs fbf / one-shot |", ic.name);
        rule.push_str("---|");
    }
    let _ = writeln!(s, "{head}\n{rule}");
    for r in &nest {
        let mut line = format!(
            "| {} | {} | {} | {} |",
            r.depth, r.wire_bytes, r.field_by_field.writes, r.one_shot.writes
        );
        for ic in &ics {
            let (f, o) = nested_times(r, ic);
            let _ = write!(line, " {:.2} / {:.2} |", f / 1e3, o / 1e3);
            let d = r.depth.to_string();
            csv.row("nested", "nested", &d, &ic.name, "field-by-field", "time_ns_modelled", f);
            csv.row("nested", "nested", &d, &ic.name, "one-shot", "time_ns_modelled", o);
        }
        let d = r.depth.to_string();
        csv.row(
            "nested",
            "nested",
            &d,
            "",
            "field-by-field",
            "host_transactions",
            r.field_by_field.writes as f64,
        );
        csv.row(
            "nested",
            "nested",
            &d,
            "",
            "one-shot",
            "host_transactions",
            r.one_shot.writes as f64,
        );
        let _ = writeln!(s, "{line}");
    }

    // Plot.
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let groups: Vec<String> = by_group.keys().cloned().collect();
    let mut panels = Vec::new();
    for (i, ic) in ics.iter().enumerate() {
        let mut fbf = Vec::new();
        let mut os = Vec::new();
        for g in by_group.values() {
            let f: f64 = g.rows.iter().map(|r| r.decode_ns + ic.cost_ns(r.field_by_field)).sum();
            let o: f64 = g.rows.iter().map(|r| r.one_shot_ns + ic.cost_ns(r.one_shot)).sum();
            fbf.push(g.wire / f * 1e3);
            os.push(g.wire / o * 1e3);
        }
        let _ = i;
        panels.push(Panel {
            title: format!("decode, {}", ic.name),
            y_label: "MB/s (modelled)".into(),
            series: vec![
                Series { name: "field-by-field".into(), color: "#d62728", ys: fbf },
                Series { name: "one-shot".into(), color: "#1f77b4", ys: os },
            ],
        });
    }
    let svg =
        grid("protoplane sim: decode throughput by interconnect", "bench", &groups, &panels, 3);
    let path = a.out.join("sim-decode.svg");
    std::fs::write(&path, svg).map_err(|e| format!("{}: {e}", path.display()))?;
    let depths: Vec<String> = nest.iter().map(|r| r.depth.to_string()).collect();
    let panels: Vec<Panel> = ics
        .iter()
        .map(|ic| Panel {
            title: format!("nesting, {}", ic.name),
            y_label: "µs per message (modelled)".into(),
            series: vec![
                Series {
                    name: "field-by-field".into(),
                    color: "#d62728",
                    ys: nest.iter().map(|r| nested_times(r, ic).0 / 1e3).collect(),
                },
                Series {
                    name: "one-shot".into(),
                    color: "#1f77b4",
                    ys: nest.iter().map(|r| nested_times(r, ic).1 / 1e3).collect(),
                },
            ],
        })
        .collect();
    let svg =
        grid("protoplane sim: the nested-message penalty", "nesting depth", &depths, &panels, 3);
    let nested_path = a.out.join("sim-nested.svg");
    std::fs::write(&nested_path, svg).map_err(|e| format!("{}: {e}", nested_path.display()))?;
    let _ = writeln!(s, "\nplot: {}\nplot: {}", path.display(), nested_path.display());
    if let Some(p) = &a.csv {
        std::fs::write(p, &csv.0).map_err(|e| format!("{}: {e}", p.display()))?;
        let _ = writeln!(s, "csv: {}", p.display());
    }
    Ok(s)
}

fn nested_times(r: &NestedRow, ic: &Interconnect) -> (f64, f64) {
    (r.decode_ns + ic.cost_ns(r.field_by_field), r.one_shot_ns + ic.cost_ns(r.one_shot))
}
