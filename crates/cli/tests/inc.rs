//! `protoplane inc run` end to end: controller, switch, server and
//! clients as real processes on loopback UDP, with faults injected on the
//! switch's ports (or, with no switch, by the agents), every result
//! checked against a plain computation.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_protoplane");

fn inc_run(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(["inc", "run", "--timeout-s", "90"])
        .args(args)
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let last = stdout.lines().last().unwrap_or_default().to_string();
    assert!(
        out.status.success() && last == "exact: yes",
        "inc run {args:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

const FAULTS: [&str; 6] = ["--loss", "0.1", "--dup", "0.1", "--reorder", "0.1"];

#[test]
fn every_application_is_exact_under_loss_duplication_and_reordering() {
    for app in ["sync-agg", "async-agg", "key-value", "agreement"] {
        let mut args = vec!["--app", app, "--clients", "4"];
        args.extend(FAULTS);
        inc_run(&args);
    }
}

#[test]
fn every_application_is_exact_without_a_data_plane() {
    for app in ["sync-agg", "async-agg", "key-value", "agreement"] {
        let mut args = vec!["--app", app, "--clients", "3", "--no-switch"];
        args.extend(FAULTS);
        let out = inc_run(&args);
        assert!(!out.contains("switch stats"), "no switch process: {out}");
    }
}

#[test]
fn aggregation_is_exact_over_a_chain_of_two_switches() {
    let mut args = vec!["--app", "sync-agg", "--clients", "4", "--switches", "2"];
    args.extend(FAULTS);
    let out = inc_run(&args);
    assert!(out.contains("switch 1:"), "two switches ran: {out}");
}

#[test]
fn bad_arguments_are_usage_errors() {
    for args in [
        &["--app", "nope"][..],
        &["--app", "sync-agg", "--loss", "1.5"],
        &["--app", "sync-agg", "--clients", "40"],
        &["--app", "sync-agg", "--member-loss", "skip"],
    ] {
        let out = Command::new(BIN).args(["inc", "run"]).args(args).output().expect("runs");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}

#[test]
fn a_controller_killed_mid_run_is_replaced_and_nothing_it_handed_out_is_reused() {
    for app in ["key-value", "sync-agg"] {
        let mut args = vec!["--app", app, "--clients", "4", "--scale", "2"];
        args.extend(["--restart-controller-ms", "150"]);
        args.extend(FAULTS);
        let out = inc_run(&args);
        assert!(out.contains("controller (restarted)"), "{out}");
        assert!(out.contains("reattached"), "the server agent reattached: {out}");
        assert!(out.contains("second instance:"), "{out}");
    }
}

#[test]
fn a_member_that_restarts_counts_exactly_once() {
    for app in ["key-value", "async-agg"] {
        let mut args = vec!["--app", app, "--clients", "4", "--restart-client", "2"];
        args.extend(FAULTS);
        let out = inc_run(&args);
        assert!(out.contains("client 2 (first process): verdict exact=yes"), "{out}");
        assert!(out.contains("(incarnation 2)"), "the second process is a new incarnation: {out}");
    }
}

#[test]
fn forged_datagrams_reach_nothing_and_are_counted() {
    for app in ["sync-agg", "key-value"] {
        let out = inc_run(&["--app", app, "--clients", "3", "--attack"]);
        let line = out.lines().find(|l| l.contains("attack:")).expect("an attack line");
        assert!(line.contains(" 0 reached the bystander port"), "{line}");
    }
}

/// The counters `inc gen` says `clients` members report, recomputed here
/// from its inputs alone: a report is a map (the last value of a repeated
/// key counts).
fn kv_totals_from_gen(clients: &str, scale: &str) -> Vec<i64> {
    let gen = Command::new(BIN)
        .args(["inc", "gen", "--app", "key-value", "--clients", clients, "--scale", scale])
        .output()
        .expect("runs");
    assert!(gen.status.success());
    let mut totals = vec![0i64; 4096];
    for line in String::from_utf8_lossy(&gen.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let mut map = std::collections::HashMap::new();
        for d in v["deltas"].as_array().expect("deltas") {
            map.insert(d[0].as_i64().expect("key"), d[1].as_i64().expect("value"));
        }
        for (k, v) in map {
            totals[k as usize] += v;
        }
    }
    totals
}

/// Checks client 0's counters in `dir` against `totals`.
fn check_counters(dir: &std::path::Path, totals: &[i64]) {
    let text = std::fs::read_to_string(dir.join("client-0.jsonl")).expect("client 0's results");
    assert_eq!(text.lines().count(), 4096, "one line per counter");
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let k = v["key"].as_i64().expect("key") as usize;
        assert_eq!(v["value"].as_i64(), Some(totals[k]), "counter {k}");
    }
}

#[test]
fn results_are_written_as_json_lines_and_inputs_can_be_generated() {
    let dir = std::env::temp_dir().join(format!("pp-inc-results-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_string_lossy().into_owned();
    inc_run(&["--app", "key-value", "--clients", "2", "--results", &d]);
    check_counters(&dir, &kv_totals_from_gen("2", "1"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_switch_killed_mid_run_leaves_every_application_exact_on_the_server_path() {
    for app in ["sync-agg", "agreement"] {
        let mut args = vec!["--app", app, "--clients", "4", "--scale", "16"];
        args.extend(["--kill-switch-ms", "150", "--loss", "0.05"]);
        let out = inc_run(&args);
        assert!(out.contains("switch killed 150 ms into the run"), "{out}");
    }
    // key-value and word count keep values in the switch's registers: they
    // die with it, and the server agent rebuilds them from its own part and
    // the members' accounts. The counters are checked against `inc gen`'s
    // inputs, not only by the run's own check.
    inc_run(&["--app", "async-agg", "--clients", "3", "--scale", "4", "--kill-switch-ms", "100"]);
    let dir = std::env::temp_dir().join(format!("pp-inc-killed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_string_lossy().into_owned();
    let out = inc_run(&[
        "--app",
        "key-value",
        "--clients",
        "3",
        "--scale",
        "16",
        "--kill-switch-ms",
        "100",
        "--results",
        &d,
    ]);
    assert!(out.contains("switch killed 100 ms into the run"), "{out}");
    check_counters(&dir, &kv_totals_from_gen("3", "16"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_member_that_dies_fails_the_others_aggregation_at_once_with_the_reason() {
    let t = std::time::Instant::now();
    let out = Command::new(BIN)
        .args(["inc", "run", "--timeout-s", "60", "--app", "sync-agg", "--clients", "4"])
        .args(["--scale", "16", "--kill-client", "3", "--kill-client-ms", "150"])
        .output()
        .expect("runs");
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stdout.ends_with("exact: no\n"), "{stdout}");
    let reason = "member 3 of the application stopped (no heartbeat within its lease)";
    assert_eq!(stderr.matches(reason).count(), 3, "each other member says why: {stderr}");
    // A 1.5 s lease, not the 120 s call timeout.
    assert!(t.elapsed() < std::time::Duration::from_secs(20), "it failed at once");
}

/// `--member-loss continue`: a member killed mid-run, the others go on.
/// Every survivor's result of every step is checked here against `inc
/// gen`'s gradients, summed over the members the step names (quantized as
/// the NetFilter's `Precision` 6 says), and the survivors must name the
/// same members for each step: all four until some step, the other three
/// from then on.
#[test]
fn with_member_loss_continue_the_others_finish_exactly_without_a_killed_member() {
    let dir = std::env::temp_dir().join(format!("pp-inc-continue-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_string_lossy().into_owned();
    let out = inc_run(&[
        "--app",
        "sync-agg",
        "--clients",
        "4",
        "--scale",
        "16",
        "--loss",
        "0.05",
        "--kill-client",
        "3",
        "--kill-client-ms",
        "150",
        "--member-loss",
        "continue",
        "--results",
        &d,
    ]);
    assert!(out.contains("steps summed without the killed member"), "{out}");
    let gen = Command::new(BIN)
        .args(["inc", "gen", "--app", "sync-agg", "--clients", "4", "--scale", "16"])
        .output()
        .expect("runs");
    assert!(gen.status.success());
    // gradients[member][step]
    let mut gradients: Vec<Vec<Vec<f64>>> = vec![Vec::new(); 4];
    for line in String::from_utf8_lossy(&gen.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let m = v["member"].as_u64().expect("member") as usize;
        let g = v["gradient"].as_array().expect("gradient");
        gradients[m].push(g.iter().map(|x| x.as_f64().expect("a number")).collect());
    }
    let mut named: Option<Vec<u64>> = None;
    for m in 0..3 {
        let text = std::fs::read_to_string(dir.join(format!("client-{m}.jsonl"))).expect("results");
        let mut members = Vec::new();
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            let step = v["step"].as_u64().expect("step") as usize;
            let over = v["members"].as_u64().expect("members");
            assert!(over == 0 || over == 0b0111, "step {step} over {over:#b}");
            let sums = v["sums"].as_array().expect("sums");
            for (i, s) in sums.iter().enumerate() {
                let q: i64 = (0..4)
                    .filter(|j| over == 0 || over & (1 << j) != 0)
                    .map(|j| (gradients[j][step][i] * 1e6).round() as i64)
                    .sum();
                assert_eq!(s.as_f64(), Some(q as f64 / 1e6), "client {m} step {step} [{i}]");
            }
            members.push(over);
        }
        assert_eq!(members.len(), 64, "client {m} finished every step");
        match &named {
            None => named = Some(members),
            Some(first) => assert_eq!(first, &members, "client {m} names other members"),
        }
    }
    let named = named.expect("three survivors");
    let cut = named.iter().position(|m| *m != 0).expect("some step without member 3");
    assert!(cut > 0 && named[cut..].iter().all(|m| *m == 0b0111), "{named:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
