//! The command line's contract: exit 0 on success, 1 with one stderr line
//! (message index, type, field, byte offset) on malformed input, 2 on usage
//! errors; never a panic, never a hang.

use std::io::Write;
use std::process::{Command, Stdio};

const PROTO: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../protos/socialnetwork/social_network.proto");

fn run(args: &[&str], stdin: &[u8]) -> (i32, Vec<u8>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_protoplane"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn protoplane");
    let mut input = child.stdin.take().expect("stdin");
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().expect("wait");
    let _ = writer.join();
    (out.status.code().unwrap_or(-1), out.stdout, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn login(req_id: u8, user: &str) -> Vec<u8> {
    let mut m = vec![0x08, req_id, 0x12, user.len() as u8];
    m.extend_from_slice(user.as_bytes());
    m
}

fn delimit(msgs: &[Vec<u8>]) -> Vec<u8> {
    msgs.iter().flat_map(|m| std::iter::once(m.len() as u8).chain(m.iter().copied())).collect()
}

#[test]
fn roundtrip_decode_encode_succeed() {
    let stream = delimit(&[login(1, "ada"), login(2, "bob")]);
    let base = ["--proto", PROTO, "--type", "socialnetwork.LoginRequest", "--delimited"];
    let (code, out, err) = run(&[&["roundtrip"], &base[..], &["--view"]].concat(), &stream);
    assert_eq!((code, out.as_slice(), err.as_str()), (0, stream.as_slice(), ""));
    let (code, json, _) = run(&[&["decode"], &base[..]].concat(), &stream);
    assert_eq!(code, 0);
    let text = String::from_utf8(json).unwrap_or_default();
    assert_eq!(
        text,
        "{\"reqId\":\"1\",\"username\":\"ada\"}\n{\"reqId\":\"2\",\"username\":\"bob\"}\n"
    );
    let (code, wire, _) = run(&[&["encode"], &base[..]].concat(), text.as_bytes());
    assert_eq!((code, wire), (0, stream));
}

#[test]
fn the_text_format_both_ways() {
    let one = ["--proto", PROTO, "--type", "socialnetwork.LoginRequest"];
    let (code, wire, err) = run(
        &[&["encode"], &one[..], &["--format", "text"]].concat(),
        b"# a login\nreq_id: 1\nusername: 'ada'\n",
    );
    assert_eq!((code, err.as_str()), (0, ""));
    assert_eq!(wire, login(1, "ada"));
    let (code, text, _) = run(&[&["decode"], &one[..], &["--format", "text"]].concat(), &wire);
    assert_eq!(code, 0);
    assert_eq!(String::from_utf8(text).unwrap_or_default(), "req_id: 1\nusername: \"ada\"\n");
    // A stream: each message after a comment line that numbers it.
    let stream = delimit(&[login(1, "ada"), login(2, "bob")]);
    let (code, text, _) =
        run(&[&["decode"], &one[..], &["--delimited", "--format", "text"]].concat(), &stream);
    assert_eq!(code, 0);
    assert_eq!(
        String::from_utf8(text).unwrap_or_default(),
        "# message 0\nreq_id: 1\nusername: \"ada\"\n# message 1\nreq_id: 2\nusername: \"bob\"\n"
    );
    // Text that does not fit: exit 1, the line and column named.
    let (code, _, err) =
        run(&[&["encode"], &one[..], &["--format", "text"]].concat(), b"req_id: 1\nuser: 'x'");
    assert_eq!(code, 1);
    assert!(err.contains("2:1: socialnetwork.LoginRequest has no field named \"user\""), "{err}");
}

#[test]
fn malformed_input_exits_1_with_one_located_line() {
    // Second message: field 2 declares 9 bytes but has 3.
    let bad = vec![0x08, 0x02, 0x12, 0x09, b'b', b'o', b'b'];
    let stream = delimit(&[login(1, "ada"), bad]);
    let (code, out, err) = run(
        &["roundtrip", "--proto", PROTO, "--type", "socialnetwork.LoginRequest", "--delimited"],
        &stream,
    );
    assert_eq!(code, 1);
    assert!(out.is_empty());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("message 1"), "{err}");
    assert!(err.contains("socialnetwork.LoginRequest"), "{err}");
    assert!(err.contains("field 2"), "{err}");
    assert!(err.contains("at byte 2"), "{err}");
    // A broken length prefix in the stream.
    let (code, _, err) = run(
        &["decode", "--proto", PROTO, "--type", "socialnetwork.LoginRequest", "--delimited"],
        &[0x05, 0x08],
    );
    assert_eq!(code, 1);
    assert!(err.contains("message 0"), "{err}");
    // Invalid UTF-8 in a proto3 string, single-message framing.
    let (code, _, err) = run(
        &["decode", "--proto", PROTO, "--type", "socialnetwork.LoginRequest"],
        &[0x12, 0x01, 0xff],
    );
    assert_eq!(code, 1);
    assert!(err.contains("UTF-8"), "{err}");
    // JSON that does not fit the schema.
    let (code, _, err) =
        run(&["encode", "--proto", PROTO, "--type", "socialnetwork.LoginRequest"], b"{\"nope\":1}");
    assert_eq!(code, 1);
    assert!(err.contains("nope"), "{err}");
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(run(&["roundtrip"], b"").0, 2, "missing flags");
    assert_eq!(run(&["frobnicate"], b"").0, 2, "unknown command");
    let (code, _, err) = run(&["roundtrip", "--proto", PROTO, "--type", "socialnetwork.Nope"], b"");
    assert_eq!(code, 2);
    assert!(err.contains("socialnetwork.Nope"));
    assert_eq!(run(&["compile", "--proto", "/nonexistent.proto"], b"").0, 2);
}

#[test]
fn compile_prints_a_summary_and_writes_tables() {
    let dir = std::env::temp_dir().join(format!("pp-cli-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let tables = dir.join("sn.tables");
    let tables_arg = tables.to_string_lossy().into_owned();
    let (code, out, _) = run(&["compile", "--proto", PROTO, "--tables-out", &tables_arg], b"");
    assert_eq!(code, 0);
    let text = String::from_utf8(out).unwrap_or_default();
    assert!(text.contains("socialnetwork.StorePostRequest"), "{text}");
    // The written table set works as a schema source.
    let msg = delimit(&[login(7, "eve")]);
    let (code, out, _) = run(
        &[
            "roundtrip",
            "--tables",
            &tables_arg,
            "--type",
            "socialnetwork.LoginRequest",
            "--delimited",
        ],
        &msg,
    );
    assert_eq!((code, out), (0, msg));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn demo_runs_from_the_repository_alone() {
    let (code, out, err) =
        run(&["demo", "--per-type", "50", "--seconds", "0.3", "--generated"], b"");
    assert_eq!(code, 0, "{err}");
    let text = String::from_utf8(out).unwrap_or_default();
    assert!(text.contains("requests: 250, 50 generated requests per method"), "{text}");
    assert!(text.contains("every request decoded (owned and zero-copy view)"), "{text}");
    assert!(text.contains("answered token \"t42-ada\""), "{text}");
    // Four load phases, each with calls and without errors.
    let phases: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("gRPC / HTTP2") || l.starts_with("lean / TCP"))
        .collect();
    assert_eq!(phases.len(), 4, "{text}");
    for line in phases {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let qps: f64 = cols[4].parse().unwrap_or(0.0);
        assert!(qps > 0.0, "no calls: {line}");
        assert_eq!(cols.last().copied(), Some("0"), "errors: {line}");
    }
}
