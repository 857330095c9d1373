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
    ] {
        let out = Command::new(BIN).args(["inc", "run"]).args(args).output().expect("runs");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}
