//! Writes seed inputs for the fuzz targets; `scripts/fuzz.sh` runs it:
//!
//! ```text
//! cargo run --example seed -- CORPUS [SHARED] [CONFORMANCE_OUT]
//! ```
//!
//! * `CORPUS/decode`: every message of `SHARED/datasets/socialnetwork`
//!   prefixed with the selector byte of its type, small valid messages of the
//!   test schema, and the messages `tests/conformance/crosscheck.py --out-dir`
//!   wrote. Their types are not fuzzed, so they are seeded as `hostile.P2`
//!   (proto2 types) or `hostile3.S3` (proto3) inputs: realistic wire shapes,
//!   most fields arriving unknown or with a mismatched wire type.
//! * `CORPUS/decode_gen`: the `decode` seeds again, each prefixed with the
//!   selector byte of its type among the generated decoders
//!   (`protoplane_fuzz::generated`).
//! * `CORPUS/json`: the JSON form of every `decode` seed that decodes, and
//!   the conformance JSON lines (seeded like their wire messages).
//! * `CORPUS/text`: the text format of every `decode` seed that decodes.
//! * `CORPUS/block`: the owned-mode block of every `decode` seed that decodes
//!   (selector byte, then the block's bytes).
//! * `CORPUS/lean`: lean transport frames (one control byte, then frames;
//!   see `fuzz_targets/lean.rs`).
//! * `CORPUS/grpc`: framed gRPC streams (two control bytes, then the
//!   stream; see `fuzz_targets/grpc.rs`) and header values.
//! * `CORPUS/http2_frame`: a client's bytes to an HTTP/2 server connection
//!   (one control byte, then the bytes; see `fuzz_targets/http2_frame.rs`):
//!   gRPC requests as frames (HPACK-coded headers, a message in DATA),
//!   after the harness's preface or with the client's own, then every other
//!   frame type, and a connection error followed by more frames.
//! * `CORPUS/hpack`: the header blocks of RFC 7541 Appendix C.3 to C.6 as
//!   raw decoder input, and their fields as encoder programs (one control
//!   byte, then the body; see `fuzz_targets/hpack.rs`).
//! * `CORPUS/tables`: the serialized table sets of the fuzzed schemas, of the
//!   dataset's descriptor set and of every dataset `.proto`.
//! * `CORPUS/ring`: op sequences (see `protoplane_fuzz::ring`): well-formed
//!   traffic (unary and streaming calls, cancels, a full ring, chunk
//!   releases), each checked here to run without a detach, and the hostile
//!   applications of the split-mode tests, each checked to be detached.
//! * `CORPUS/inc`: record sequences (see `protoplane_fuzz::inc`): client
//!   calls of every kind with time passing under each clear and cache
//!   policy, A's packets of every kind straight to the switch, to the
//!   agents and replayed with a byte flipped; each checked here to run.
//! * `CORPUS/inc_control`: JSON lines (see `protoplane_fuzz::inc_control`):
//!   every switch control request and reply and every controller message,
//!   written by their `to_json`, one per seed and all in one; and the
//!   example NetFilters (`examples/inc/netfilter`), each checked here to
//!   parse against the target's service.
//!
//! A directory that is not there is skipped; each part prints what it wrote.

use std::fs;
use std::path::{Path, PathBuf};

use protoplane_fuzz::{generated, hostile, selector, social, targets, wkt};
use protoplane_schema::TableSet;
use protoplane_wire::{decode, json, text, DecodeOptions, MessageView, Source};

/// Valid messages of the test schema: (type, hex).
const HOSTILE_SEEDS: &[(&str, &str)] = &[
    ("hostile.R", "0a 02 10 01 10 02 1a 00 23 28 03 24"),
    ("hostile.R", "10 07 53 5b 08 01 5c 11 00 00 00 00 00 00 00 00 54"),
    ("hostile.Chain", "0b 12 02 0b 0c 0c"),
    ("hostile.P2", "0a 01 ff 18 01 20 02 2a 04 01 00 00 00 3a 02 01 02 52 02 00 01 62 01 78"),
    ("hostile.P2", "18 01 4a 02 18 02 6a 02 10 01 50 07"),
    (
        "hostile.S2",
        "09 00 00 00 00 00 00 f8 3f 15 00 00 c0 3f 18 01 20 01 \
         28 ff ff ff ff ff ff ff ff ff 01 40 01 4a 01 61 62 01 00 70 02 \
         88 01 03 90 01 04",
    ),
    (
        "hostile3.S3",
        "28 05 4a 02 68 69 5a 02 28 01 a2 01 04 01 00 00 00 ba 01 05 0a 01 6b 12 00 c0 01 00",
    ),
];

/// Writes numbered seed files into one target's corpus directory.
struct Dir {
    path: PathBuf,
    written: usize,
}

impl Dir {
    fn new(corpus: &Path, target: &str) -> Dir {
        let path = corpus.join(target);
        fs::create_dir_all(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Dir { path, written: 0 }
    }

    fn put(&mut self, name: &str, bytes: &[u8]) {
        let path = self.path.join(format!("seed-{name}-{}", self.written));
        fs::write(&path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        self.written += 1;
    }

    /// A selector byte followed by `body`.
    fn put_selected(&mut self, name: &str, sel: u8, body: &[u8]) {
        let mut input = Vec::with_capacity(body.len() + 1);
        input.push(sel);
        input.extend_from_slice(body);
        self.put(name, &input);
    }
}

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap_or("?"), 16).expect("hex"))
        .collect()
}

/// Splits a stream of varint-length-prefixed messages (stops at damage).
fn delimited(bytes: &[u8]) -> Vec<&[u8]> {
    let (mut out, mut pos) = (Vec::new(), 0);
    while pos < bytes.len() {
        let (mut len, mut shift) = (0usize, 0);
        loop {
            let Some(&b) = bytes.get(pos) else { return out };
            pos += 1;
            len |= usize::from(b & 0x7f) << shift;
            shift += 7;
            if b < 0x80 || shift > 35 {
                break;
            }
        }
        let Some(msg) = bytes.get(pos..pos + len) else { return out };
        out.push(msg);
        pos += len;
    }
    out
}

/// Writes a `decode` seed (`sel`, then `msg`) to `wire`, and to `gen` (the
/// `decode_gen` corpus) with the selector byte of the same type there.
fn put_wire(wire: &mut Dir, gen: &mut Dir, name: &str, sel: u8, msg: &[u8]) {
    wire.put_selected(name, sel, msg);
    if let Some(g) = generated::selector(targets()[sel as usize].name) {
        gen.put_selected(name, g, msg);
    }
}

/// The JSON form of `wire` as type `sel`, if it decodes.
fn to_json(sel: u8, wire: &[u8]) -> Option<String> {
    let t = &targets()[sel as usize];
    let block = decode(t.tables, t.type_index, wire, &DecodeOptions::view()).ok()?;
    let view =
        MessageView::new(t.tables, Source::viewing(block.as_bytes(), wire), t.type_index).ok()?;
    let mut text = String::new();
    json::to_json(&view, &mut text).ok()?;
    Some(text)
}

/// The text form of `wire` as type `sel`, if it decodes.
fn to_text(sel: u8, wire: &[u8]) -> Option<String> {
    let t = &targets()[sel as usize];
    let block = decode(t.tables, t.type_index, wire, &DecodeOptions::view()).ok()?;
    let view =
        MessageView::new(t.tables, Source::viewing(block.as_bytes(), wire), t.type_index).ok()?;
    let mut out = String::new();
    text::to_text(&view, &mut out).ok()?;
    Some(out)
}

/// The owned-mode block of `wire` as type `sel`, if it decodes.
fn block_of(sel: u8, wire: &[u8]) -> Option<Vec<u8>> {
    let t = &targets()[sel as usize];
    let block = decode(t.tables, t.type_index, wire, &DecodeOptions::default()).ok()?;
    Some(block.into_bytes())
}

fn sel(name: &str) -> u8 {
    selector(name).unwrap_or_else(|| panic!("{name} is not a fuzzed type"))
}

fn main() {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let Some(corpus) = args.first() else {
        eprintln!("usage: seed CORPUS [SHARED] [CONFORMANCE_OUT]");
        std::process::exit(2);
    };
    let shared = args.get(1).filter(|p| p.join("datasets").is_dir());
    let conformance = args.get(2).filter(|p| p.is_dir());
    let (mut wire, mut text, mut tables) =
        (Dir::new(corpus, "decode"), Dir::new(corpus, "json"), Dir::new(corpus, "tables"));
    let mut blocks = Dir::new(corpus, "block");
    let mut texts = Dir::new(corpus, "text");
    let mut gen_wire = Dir::new(corpus, "decode_gen");
    let mut grpc = Dir::new(corpus, "grpc");
    for (name, stream) in [
        ("empty", Vec::new()),
        ("one", [&[0u8, 0, 0, 0, 3][..], b"abc"].concat()),
        ("two", [&[0u8, 0, 0, 0, 0][..], &[1, 0, 0, 0, 2], b"zz"].concat()),
        ("big", [&[0u8, 0, 0, 1, 0][..], &[9; 256]].concat()),
        ("flag", vec![2, 0, 0, 0, 0]),
        ("timeout", b"100m".to_vec()),
        ("message", b"%09%0Atest%E2%98%BA".to_vec()),
        ("bin", b"q6ur".to_vec()),
    ] {
        grpc.put(name, &[&[64u8, 3][..], &stream].concat());
    }

    for &(name, h) in HOSTILE_SEEDS {
        let (s, msg) = (sel(name), hex(h));
        let t = &targets()[s as usize];
        if let Err(e) = decode(t.tables, t.type_index, &msg, &DecodeOptions::default()) {
            panic!("seed {name} {h}: {e}");
        }
        put_wire(&mut wire, &mut gen_wire, name, s, &msg);
        text.put_selected(name, s, to_json(s, &msg).unwrap_or_default().as_bytes());
        texts.put_selected(name, s, to_text(s, &msg).unwrap_or_default().as_bytes());
        blocks.put_selected(name, s, &block_of(s, &msg).unwrap_or_default());
    }
    tables.put("social", &social().to_bytes());
    tables.put("hostile", &hostile().to_bytes());
    // The well-known types' JSON forms, each and all at once.
    let w = sel("fuzzwkt.W");
    for (name, json) in [
        ("wkt-time", r#"{"at":"1970-01-01T00:00:00.5+01:00","took":"-1.000000001s"}"#),
        ("wkt-mask", r#"{"mask":"fooBar,baz.quxQuux"}"#),
        ("wkt-struct", r#"{"doc":{"a":[1,null,"x",{"b":true}],"c":{}},"value":null}"#),
        ("wkt-list", r#"{"list":[1.5,"y",[],{}],"values":[null,2],"byName":{"k":{"z":1}}}"#),
        ("wkt-wrappers", r#"{"count":"-5","blob":"AAE-_w","ratio":"NaN","nothing":null}"#),
        (
            "wkt-any",
            r#"{"any":{"@type":"type.googleapis.com/google.protobuf.Duration","value":"2s"},"anys":[{"@type":"type.googleapis.com/fuzzwkt.W","at":"9999-12-31T23:59:59Z"},{}]}"#,
        ),
        ("wkt-nested", r#"{"child":{"child":{"doc":{"k":{"k":{"k":[[[]]]}}}}}}"#),
    ] {
        text.put_selected(name, w, json.as_bytes());
    }
    tables.put("wkt", &wkt().to_bytes());

    if let Some(shared) = shared {
        let sn = shared.join("datasets/socialnetwork");
        let manifest = fs::read_to_string(sn.join("manifest.tsv")).unwrap_or_default();
        for line in manifest.lines().skip(1) {
            let cols: Vec<&str> = line.split('\t').collect();
            let (Some(&ty), Some(&path)) = (cols.first(), cols.last()) else { continue };
            let (Some(s), Ok(bytes)) = (selector(ty), fs::read(sn.join(path))) else { continue };
            for msg in delimited(&bytes) {
                put_wire(&mut wire, &mut gen_wire, ty, s, msg);
                if let Some(j) = to_json(s, msg) {
                    text.put_selected(ty, s, j.as_bytes());
                }
                if let Some(t) = to_text(s, msg) {
                    texts.put_selected(ty, s, t.as_bytes());
                }
                if let Some(b) = block_of(s, msg) {
                    blocks.put_selected(ty, s, &b);
                }
            }
        }
        if let Ok(set) = fs::read(sn.join("social_network.descriptor_set.pb")) {
            if let Ok(ts) = TableSet::from_descriptor_set(&set) {
                tables.put("social-descriptor-set", &ts.to_bytes());
            }
        }
        let hpb = shared.join("datasets/hyperprotobench");
        let mut benches: Vec<PathBuf> = fs::read_dir(&hpb)
            .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default();
        benches.sort();
        for bench in benches.iter().filter(|b| b.join("benchmark.proto").is_file()) {
            if let Ok(ts) = TableSet::from_proto_files(&[bench.join("benchmark.proto")], &[bench]) {
                tables.put("hyperprotobench", &ts.to_bytes());
            }
        }
    }

    if let Some(out) = conformance {
        let mut types: Vec<PathBuf> = fs::read_dir(out)
            .map(|d| d.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.is_dir()).collect())
            .unwrap_or_default();
        types.sort();
        for dir in types {
            let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
            let s = sel(if name.contains("test2") { "hostile.P2" } else { "hostile3.S3" });
            for file in ["canonical", "mutated", "rejected"] {
                let bytes = fs::read(dir.join(format!("{file}.delimited"))).unwrap_or_default();
                for msg in delimited(&bytes).into_iter().take(200) {
                    put_wire(&mut wire, &mut gen_wire, &format!("{name}-{file}"), s, msg);
                    if let Some(b) = block_of(s, msg).filter(|_| file == "canonical") {
                        blocks.put_selected(&format!("{name}-{file}"), s, &b);
                    }
                }
            }
            let lines = fs::read_to_string(dir.join("encode.jsonl")).unwrap_or_default();
            for line in lines.lines().take(200) {
                text.put_selected(&name, s, line.as_bytes());
            }
        }
    }

    // Lean frames: one control byte (the limit), then frames.
    let mut lean = Dir::new(corpus, "lean");
    {
        use protoplane_grpc::lean::{write, Outgoing};
        use protoplane_grpc::{Code, Metadata, Status};
        let mut md = Metadata::new();
        let _ = md.insert("k", "v");
        let _ = md.insert_bin("b-bin", &[0, 1, 2]);
        let mut st = Status::new(Code::NotFound, "gone");
        let _ = st.metadata.insert("t", "x");
        let frames: [(&str, Outgoing<'_>); 4] = [
            (
                "unary-req",
                Outgoing {
                    open: Some((Some(std::time::Duration::from_millis(5)), &md)),
                    message: Some(b"\x08\x01"),
                    end: true,
                    ..Outgoing::default()
                },
            ),
            (
                "unary-resp",
                Outgoing {
                    headers: Some(&md),
                    message: Some(b"abc"),
                    status: Some(&st),
                    ..Outgoing::default()
                },
            ),
            ("cancel", Outgoing { cancel: true, ..Outgoing::default() }),
            ("stream-end", Outgoing { end: true, ..Outgoing::default() }),
        ];
        let mut all = vec![255u8];
        for (name, f) in &frames {
            let mut one = vec![255u8];
            let _ = write(&mut one, 3, 1, f);
            lean.put(name, &one);
            all.extend_from_slice(&one[1..]);
        }
        lean.put("all", &all);
    }

    let ring = ring_seeds(corpus);
    let http2 = http2_seeds(corpus);
    let hpack = hpack_seeds(corpus);
    let inc = inc_seeds(corpus);
    let inc_control = inc_control_seeds(corpus);
    let inc_face = inc_face_seeds(corpus);
    let attach = attach_seeds(corpus);
    let versions = versions_seeds(corpus);
    let metrics_http = metrics_http_seeds(corpus);
    let orca = orca_seeds(corpus);
    let service_config = service_config_seeds(corpus);
    let dns = dns_seeds(corpus);
    let xds = xds_seeds(corpus);

    for dir in [
        &attach,
        &metrics_http,
        &orca,
        &service_config,
        &dns,
        &xds,
        &versions,
        &wire,
        &gen_wire,
        &blocks,
        &grpc,
        &text,
        &tables,
        &lean,
        &ring,
        &http2,
        &hpack,
        &inc,
        &inc_control,
        &inc_face,
    ] {
        println!("seed: {} inputs in {}", dir.written, dir.path.display());
    }
}

/// Seeds of the `orca` target: reports as `serve --orca` and grpc-go's
/// recorders send them (CPU, rates, named metrics), and an older server's
/// whole-number rps.
fn orca_seeds(corpus: &Path) -> Dir {
    use protoplane_grpc_services::orca::LoadReport;
    let mut dir = Dir::new(corpus, "orca");
    let full = LoadReport {
        cpu_utilization: 0.42,
        mem_utilization: 0.3,
        rps_fractional: 1234.5,
        eps: 1.5,
        application_utilization: 0.25,
        request_cost: vec![("db".into(), 2.0)],
        utilization: vec![("disk".into(), 0.1)],
        named_metrics: vec![("queue".into(), 7.0)],
    };
    dir.put("full", &full.encode());
    dir.put("cpu-only", &LoadReport { cpu_utilization: 0.9, ..LoadReport::default() }.encode());
    dir.put("old-rps", &[0x18, 0xe8, 0x07]);
    dir
}

/// Seeds of the `xds` target (a selector byte: 0 listener, 1 route
/// configuration, 2 cluster, 3 endpoints; then the resource), laid out
/// with the generated builders as a management server would send them.
fn xds_seeds(corpus: &Path) -> Dir {
    use protoplane_wire::{EncodeOptions, Encoder, Source};
    use protoplane_xds::pb::envoy::config::cluster::v3::{Cluster, ClusterBuilder};
    use protoplane_xds::pb::envoy::config::endpoint::v3::{
        ClusterLoadAssignment, ClusterLoadAssignmentBuilder,
    };
    use protoplane_xds::pb::envoy::config::listener::v3::{Listener, ListenerBuilder};
    use protoplane_xds::pb::envoy::config::route::v3::{
        RouteConfiguration, RouteConfigurationBuilder,
    };
    use protoplane_xds::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        HttpConnectionManager, HttpConnectionManagerBuilder,
    };
    let mut dir = Dir::new(corpus, "xds");
    let opts = EncodeOptions::default();
    let mut enc = Encoder::new();

    let mut b = RouteConfiguration::builder();
    {
        let mut rc = RouteConfigurationBuilder::root(&mut b);
        rc.set_name("sn-routes").expect("name");
        let mut vh = rc.add_virtual_hosts().expect("vhost");
        vh.push_domains("*").expect("domain");
        let mut r = vh.add_routes().expect("route");
        r.r#match().expect("match").set_prefix("/socialnetwork.").expect("prefix");
        let mut a = r.route().expect("action");
        let mut w = a.weighted_clusters().expect("weighted");
        for (name, weight) in [("c1", 70), ("c2", 30)] {
            let mut c = w.add_clusters().expect("cluster");
            c.set_name(name).expect("name");
            c.weight().expect("weight").set_value(weight);
        }
        let mut retry = a.retry_policy().expect("retry");
        retry.set_retry_on("unavailable,cancelled").expect("retry_on");
        retry.num_retries().expect("n").set_value(2);
    }
    let block = b.finish();
    let rc = RouteConfiguration::encode(&mut enc, Source::owned(block.as_bytes()), &opts)
        .expect("encodes")
        .to_vec();
    dir.put_selected("route", 1, &rc);

    let mut b = HttpConnectionManager::builder();
    {
        let mut h = HttpConnectionManagerBuilder::root(&mut b);
        let mut rds = h.rds().expect("rds");
        rds.config_source().expect("source").ads().expect("ads");
        rds.set_route_config_name("sn-routes").expect("name");
        let mut f = h.add_http_filters().expect("filter");
        f.set_name("envoy.filters.http.router").expect("name");
        f.typed_config()
            .expect("any")
            .set_type_url("type.googleapis.com/envoy.extensions.filters.http.router.v3.Router")
            .expect("type");
    }
    let block = b.finish();
    let hcm = HttpConnectionManager::encode(&mut enc, Source::owned(block.as_bytes()), &opts)
        .expect("encodes")
        .to_vec();
    let mut b = Listener::builder();
    {
        let mut l = ListenerBuilder::root(&mut b);
        l.set_name("sn").expect("name");
        let mut api = l.api_listener().expect("api");
        let mut any = api.api_listener().expect("any");
        any.set_type_url(
            "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        )
        .expect("type");
        any.set_value(&hcm).expect("value");
    }
    let block = b.finish();
    let listener = Listener::encode(&mut enc, Source::owned(block.as_bytes()), &opts)
        .expect("encodes")
        .to_vec();
    dir.put_selected("listener", 0, &listener);

    let mut b = Cluster::builder();
    {
        let mut c = ClusterBuilder::root(&mut b);
        c.set_name("c1").expect("name");
        c.set_type(3);
        let mut eds = c.eds_cluster_config().expect("eds");
        eds.eds_config().expect("source").ads().expect("ads");
        eds.set_service_name("c1-eds").expect("service");
    }
    let block = b.finish();
    let cluster = Cluster::encode(&mut enc, Source::owned(block.as_bytes()), &opts)
        .expect("encodes")
        .to_vec();
    dir.put_selected("cluster", 2, &cluster);

    let mut b = ClusterLoadAssignment::builder();
    {
        let mut cla = ClusterLoadAssignmentBuilder::root(&mut b);
        cla.set_cluster_name("c1-eds").expect("name");
        for (zone, weight, priority) in [("a", 3, 0), ("b", 1, 1)] {
            let mut l = cla.add_endpoints().expect("locality");
            l.locality().expect("loc").set_zone(zone).expect("zone");
            l.load_balancing_weight().expect("w").set_value(weight);
            l.set_priority(priority);
            let mut e = l.add_lb_endpoints().expect("endpoint");
            e.load_balancing_weight().expect("w").set_value(2);
            let mut ep = e.endpoint().expect("ep");
            let mut a = ep.address().expect("address");
            a.socket_address()
                .expect("sa")
                .set_address("127.0.0.1")
                .expect("ip")
                .set_port_value(50051);
        }
    }
    let block = b.finish();
    let cla = ClusterLoadAssignment::encode(&mut enc, Source::owned(block.as_bytes()), &opts)
        .expect("encodes")
        .to_vec();
    dir.put_selected("endpoints", 3, &cla);
    dir
}

/// Seeds of the `service_config` target: gRPC's documented examples
/// (retry, hedging, throttling, a policy list) and protoplane's own.
fn service_config_seeds(corpus: &Path) -> Dir {
    let mut dir = Dir::new(corpus, "service_config");
    for (name, json) in [
        (
            "retry",
            r#"{"methodConfig":[{"name":[{"service":"pkg.Svc","method":"M"}],"timeout":"1.5s","waitForReady":true,"retryPolicy":{"maxAttempts":3,"initialBackoff":"0.1s","maxBackoff":"1s","backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE",10]}}],"retryThrottling":{"maxTokens":10,"tokenRatio":0.1}}"#,
        ),
        (
            "hedging",
            r#"{"methodConfig":[{"name":[{}],"hedgingPolicy":{"maxAttempts":4,"hedgingDelay":"0.5s","nonFatalStatusCodes":["UNAVAILABLE"]}}]}"#,
        ),
        (
            "lb",
            r#"{"loadBalancingConfig":[{"grpclb":{}},{"weighted_round_robin":{"blackoutPeriod":"1s","weightUpdatePeriod":"0.2s","errorUtilizationPenalty":1.5}},{"round_robin":{}}]}"#,
        ),
        ("old-lb", r#"{"loadBalancingPolicy":"ROUND_ROBIN"}"#),
    ] {
        dir.put(name, json.as_bytes());
    }
    dir
}

/// Seeds of the `dns` target (a record-type byte, then an answer): answers
/// with A, AAAA and TXT records (the last a gRFC A2 service config, split
/// over two character-strings), an NXDOMAIN, and one with a CNAME first.
fn dns_seeds(corpus: &Path) -> Dir {
    let mut dir = Dir::new(corpus, "dns");
    // The header of an answer to query 0x1234 with one question, `n`
    // answers, and the question for svc.test of type `t`.
    let head = |t: u8, n: u8, rcode: u8| {
        let mut a = vec![0x12, 0x34, 0x81, 0x80 | rcode, 0, 1, 0, n, 0, 0, 0, 0];
        a.extend_from_slice(b"\x03svc\x04test\x00");
        a.extend_from_slice(&[0, t, 0, 1]);
        a
    };
    let record = |a: &mut Vec<u8>, t: u8, data: &[u8]| {
        a.extend_from_slice(&[0xc0, 12, 0, t, 0, 1, 0, 0, 0, 60, 0, data.len() as u8]);
        a.extend_from_slice(data);
    };
    let mut a = head(1, 2, 0);
    record(&mut a, 1, &[127, 0, 0, 1]);
    record(&mut a, 1, &[10, 0, 0, 2]);
    dir.put("a", &[[0u8].as_slice(), &a].concat());
    let mut aaaa = head(28, 1, 0);
    record(&mut aaaa, 28, &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    dir.put("aaaa", &[[1u8].as_slice(), &aaaa].concat());
    let config = br#"grpc_config=[{"clientLanguage":["rust"],"percentage":50,"serviceConfig":{"loadBalancingConfig":[{"round_robin":{}}]}}]"#;
    let (first, rest) = config.split_at(40);
    let mut txt_data = vec![first.len() as u8];
    txt_data.extend_from_slice(first);
    txt_data.push(rest.len() as u8);
    txt_data.extend_from_slice(rest);
    let mut txt = head(16, 1, 0);
    record(&mut txt, 16, &txt_data);
    dir.put("txt", &[[2u8].as_slice(), &txt].concat());
    dir.put("nxdomain", &[[2u8].as_slice(), &head(16, 0, 3)].concat());
    let mut cname = head(1, 2, 0);
    record(&mut cname, 5, b"\x03www\xc0\x0c");
    record(&mut cname, 1, &[192, 0, 2, 7]);
    dir.put("cname", &[[0u8].as_slice(), &cname].concat());
    dir
}

/// Seeds of the `metrics_http` target (a cut byte, then what a client
/// sends): Prometheus's scrape, curl's, HTTP/1.0 with bare line ends, a
/// POST, a query string, a head split by a cut.
fn metrics_http_seeds(corpus: &Path) -> Dir {
    let mut dir = Dir::new(corpus, "metrics_http");
    let heads: [(&str, &[u8]); 5] = [
        ("prometheus", b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nUser-Agent: Prometheus/2.42.0\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\nAccept-Encoding: gzip\r\nX-Prometheus-Scrape-Timeout-Seconds: 0.9\r\n\r\n"),
        ("curl", b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n"),
        ("bare-lf", b"GET /metrics HTTP/1.0\n\n"),
        ("post", b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"),
        ("query", b"HEAD /metrics?name[]=up HTTP/1.1\r\n\r\n"),
    ];
    for (name, head) in heads {
        for cut in [255u8, 100, 7] {
            dir.put_selected(name, cut, head);
        }
    }
    dir
}

/// Seeds of the `versions` target: descriptor sets an application could
/// send — the target's own engine schema, one with a field added, one
/// with a field number reused, one with a method's streaming changed, the
/// same schema declared in edition 2023.
fn versions_seeds(corpus: &Path) -> Dir {
    use prost::Message as _;
    let mut dir = Dir::new(corpus, "versions");
    let base = protoplane_engine::fuzzing::VERSIONS_PROTO;
    for (name, text) in [
        ("same", base.to_string()),
        ("added", base.replace("int64 version = 2;", "int64 version = 2; string author = 9;")),
        ("reused", base.replace("int64 version = 2;", "string version = 2;")),
        ("streaming", base.replace("rpc Get(Key)", "rpc Get(stream Key)")),
        // The same service in edition 2023 (features in the options bytes).
        (
            "editions",
            base.replace(
                "syntax = \"proto3\";",
                "edition = \"2023\";\noption features.field_presence = IMPLICIT;",
            )
            .replace("Meta meta = 3;", "Meta meta = 3 [features.message_encoding = DELIMITED];"),
        ),
    ] {
        let src = [protoplane_schema::ProtoSource { name: "kv.proto", text: &text }];
        let set = protoplane_schema::compile_proto_sources(&src, &["kv.proto"]).expect("compiles");
        dir.put(name, &set.encode_to_vec());
    }
    dir
}

/// Seeds of the `attach` target: credentials (uid, gid) then one
/// handshake message — a HELLO for two services, one listing a service
/// twice, one of an older version, and an ACCEPT.
fn attach_seeds(corpus: &Path) -> Dir {
    use protoplane_shm::attach::{Answer, Hello, VERSION};
    use protoplane_shm::layout::{Class, Layout};

    let mut dir = Dir::new(corpus, "attach");
    let creds = |uid: u32, gid: u32| {
        let mut b = uid.to_le_bytes().to_vec();
        b.extend(gid.to_le_bytes());
        b
    };
    let services = |names: &[&str]| names.iter().map(|n| (n.to_string(), 7u64)).collect();
    let none = Vec::new;
    let out = || {
        vec![protoplane_shm::attach::ChannelDecl {
            target: "dns:///kv:50051".into(),
            service: "b.T".into(),
            digest: 9,
        }]
    };
    let hellos = [
        (
            "hello",
            Hello {
                version: VERSION,
                pid: 1,
                services: services(&["a.S", "b.T"]),
                schemas: false,
                channels: none(),
                lanes: false,
            },
        ),
        (
            "twice",
            Hello {
                version: VERSION,
                pid: 1,
                services: services(&["b.T", "b.T"]),
                schemas: false,
                channels: none(),
                lanes: false,
            },
        ),
        (
            "old",
            Hello {
                version: VERSION - 1,
                pid: 1,
                services: services(&["b.T"]),
                schemas: false,
                channels: none(),
                lanes: false,
            },
        ),
        (
            "schemas",
            Hello {
                version: VERSION,
                pid: 1,
                services: services(&["a.S"]),
                schemas: true,
                channels: none(),
                lanes: false,
            },
        ),
        (
            "channels",
            Hello {
                version: VERSION,
                pid: 1,
                services: services(&["a.S"]),
                schemas: true,
                channels: out(),
                lanes: false,
            },
        ),
        (
            "caller",
            Hello {
                version: VERSION,
                pid: 1,
                services: services(&[]),
                schemas: false,
                channels: out(),
                lanes: false,
            },
        ),
        (
            "lanes",
            Hello {
                version: VERSION,
                pid: 1,
                services: services(&["a.S"]),
                schemas: false,
                channels: none(),
                lanes: true,
            },
        ),
    ];
    for (name, h) in hellos {
        for (uid, gid) in [(0, 0), (1000, 7)] {
            let mut input = creds(uid, gid);
            input.extend(h.encode());
            dir.put(name, &input);
        }
    }
    let layout = Layout { ring_slots: 64, classes: vec![Class { size: 4096, count: 4 }] };
    let mut input = creds(0, 0);
    input.extend(Answer::Accept { version: VERSION, id: 3, lanes: 0, layout }.encode());
    dir.put("accept", &input);
    dir
}

/// Seeds of the `inc_face` target: a mask byte (fields dropped) and a
/// response's bytes — the shapes the examples' replies take, a group, and
/// a truncation.
fn inc_face_seeds(corpus: &Path) -> Dir {
    let mut dir = Dir::new(corpus, "inc_face");
    // GradientReply { step = 1; gradient = 2 { values = [0.5] } }
    let gradient = [0x08, 0x07, 0x12, 0x0a, 0x0a, 0x08, 0, 0, 0, 0, 0, 0, 0xe0, 0x3f];
    // QueryReply { counters = 1 { entries = 1 { 1: 3, 2: 150 } } }
    let counters = [0x0a, 0x07, 0x0a, 0x05, 0x08, 0x03, 0x10, 0x96, 0x01];
    // An unknown group beside a string field.
    let group = [0x12, 0x02, b'h', b'i', 0x1b, 0x08, 0x01, 0x1c, 0x0d, 1, 2, 3, 4];
    for (name, mask, wire) in [
        ("gradient", 0b10u8, &gradient[..]),
        ("counters", 0b1, &counters[..]),
        ("group", 0b100, &group[..]),
        ("truncated", 0b1, &counters[..5]),
    ] {
        let mut input = vec![mask];
        input.extend_from_slice(wire);
        dir.put(name, &input);
    }
    dir
}

/// Seeds of the `ring` target. Calls 0, 1, 2 are the prologue's (unary,
/// client streaming, unary), in the engine's and the application's lists.
fn ring_seeds(corpus: &Path) -> Dir {
    use protoplane_fuzz::ring::{
        encode, layout, run, Op, COMPRESS, ENCODED, HEADERS, MESSAGE, RELEASE, STATUS, TWICE,
    };
    use protoplane_shm::desc::{self, Descriptor};

    let respond =
        |call, parts, code, len| Op::Respond { call, parts, code, len, tweak: 0, value: 0 };
    let hostile =
        |call, parts, tweak, value| Op::Respond { call, parts, code: 0, len: 16, tweak, value };
    let all = HEADERS | MESSAGE | STATUS;
    let l = layout();
    let unary = vec![
        respond(0, all | RELEASE, 0, 100),
        Op::Drain,
        Op::Drop { held: 0 },
        Op::Drain,
        Op::Poll,
        Op::Release { n: 9 },
        Op::Drain,
        Op::Watch,
    ];
    let streaming = vec![
        Op::Send { call: 1, len: 16 },
        Op::End { call: 1 },
        Op::Poll,
        respond(1, HEADERS, 0, 0),
        respond(1, MESSAGE, 0, 40),
        respond(1, MESSAGE | ENCODED | COMPRESS, 0, 20),
        Op::Drain,
        Op::Drop { held: 0 },
        Op::Drop { held: 0 },
        respond(1, STATUS, 0, 0),
        Op::Drain,
        Op::Poll,
        Op::Release { n: 9 },
        Op::Drain,
    ];
    let cancel = vec![
        Op::Close { call: 2, cancel: true },
        Op::Flush,
        Op::Poll,
        // Late answer to the cancelled call: dropped, its chunk handed back.
        respond(2, MESSAGE | STATUS, 1, 10),
        Op::Drain,
        Op::Poll,
        Op::Close { call: 0, cancel: false },
        respond(1, STATUS, 0, 0),
        Op::Drain,
    ];
    let errors = vec![
        respond(0, STATUS, 5, 0),
        respond(1, HEADERS | STATUS, 14, 0),
        respond(2, MESSAGE | STATUS, 13, 4000),
        Op::Drain,
        Op::Drop { held: 0 },
        Op::Drain,
        Op::Poll,
    ];
    // More calls than the engine's half holds: the proxy is refused for
    // room (and cancels); then every call is answered, with no more chunks
    // of the application's half than it has, and the ring fills again.
    let mut busy: Vec<Op> =
        (0..10).map(|i| Op::Open { streaming: false, timeout: i % 2 == 0, len: 3000 }).collect();
    busy.extend([Op::Poll, Op::Release { n: 9 }, Op::Drain, Op::Poll]);
    busy.extend((0..5).map(|c| respond(c, MESSAGE | STATUS, 0, 8)));
    busy.extend([Op::Drain, Op::Watch]);
    busy.extend((0..5).map(|_| Op::Drop { held: 0 }));
    busy.extend([Op::Drain, Op::Poll]);
    busy.extend((0..9).map(|_| Op::Open { streaming: true, timeout: false, len: 0 }));
    busy.extend([Op::Poll, Op::Watch, Op::Release { n: 9 }, Op::Drain, Op::Poll]);
    busy.extend((5..10).map(|c| respond(c, HEADERS | STATUS, 0, 0)));
    busy.extend([Op::Drain, Op::Poll]);

    let garbage = vec![Op::Raw { mode: 1, seq: 0, words: [u64::MAX; desc::WORDS] }, Op::Drain];
    let bogus = l.engine_half() as u32 + 1;
    let bad_release = vec![
        Op::Raw { mode: 0, seq: 0, words: Descriptor::releases(&[bogus]).to_words() },
        Op::Drain,
    ];
    let replay = vec![hostile(0, MESSAGE | TWICE, 0, 0), Op::Drain];
    let outside = vec![hostile(0, MESSAGE, 4, 5000), Op::Drain];
    let side = vec![hostile(0, HEADERS | STATUS, 11, 0x0100_0000), Op::Drain];
    let corrupt_requests: Vec<Op> = (0..l.ring_slots as u8)
        .map(|slot| Op::Seq { ring: 0, slot, value: 0xdead_beef })
        .chain([Op::Open { streaming: false, timeout: false, len: 8 }])
        .collect();
    let scribbled = vec![
        Op::Scribble { area: 2, offset: 0, bytes: vec![1, 0, 0, 0, 0, 0, 0, 0] },
        Op::Scribble { area: 2, offset: 8, bytes: vec![0xff; 56] },
        Op::Drain,
    ];

    let mut dir = Dir::new(corpus, "ring");
    dir.put("prologue", &[]);
    let well_formed = [
        ("unary", unary),
        ("streaming", streaming),
        ("cancel", cancel),
        ("errors", errors),
        ("busy", busy),
    ];
    let mut everything = Vec::new();
    for (name, ops) in well_formed {
        let input = encode(&ops);
        let out = run(&input);
        assert!(out.detached.is_none(), "ring seed {name} detached: {:?}", out.detached);
        assert!(out.statuses > 0, "ring seed {name}: no call ended with a status");
        dir.put(name, &input);
        everything.extend(input);
    }
    let _ = run(&everything);
    dir.put("all", &everything);
    for (name, ops) in [
        ("garbage", garbage),
        ("bad-release", bad_release),
        ("replay", replay),
        ("outside", outside),
        ("side", side),
        ("corrupt-requests", corrupt_requests),
        ("scribbled", scribbled),
    ] {
        let input = encode(&ops);
        let out = run(&input);
        assert!(out.detached.is_some(), "hostile ring seed {name} was not detached");
        dir.put(name, &input);
    }
    dir
}

/// Seeds of the `http2_frame` target. Control bits: 1 the harness's
/// preface, 2 small limits, 4 the harness answers requests, bits 3..=7 the
/// read size.
fn http2_seeds(corpus: &Path) -> Dir {
    use protoplane_http2::frame::{self, flag, kind, setting, Reason, PREFACE};
    use protoplane_http2::hpack::{Encoder, Index};

    const PREFIX: u8 = 1;
    const SMALL: u8 = 2;
    const SERVE: u8 = 4;

    let mut enc = Encoder::new();
    let mut block = |path: &[u8], timeout: &[u8]| {
        let mut b = Vec::new();
        enc.begin(&mut b);
        for (name, value, index) in [
            (&b":method"[..], &b"POST"[..], Index::Yes),
            (b":scheme", b"http", Index::Yes),
            (b":path", path, Index::Yes),
            (b":authority", b"localhost:50051", Index::Yes),
            (b"content-type", b"application/grpc", Index::Yes),
            (b"te", b"trailers", Index::Yes),
            (b"user-agent", b"grpc-seed/1.0", Index::Yes),
            (b"grpc-timeout", timeout, Index::No),
            (b"authorization", b"Bearer token", Index::Never),
        ] {
            enc.encode(name, value, index, &mut b);
        }
        b
    };
    let message = |body: &[u8]| {
        let mut m = vec![0];
        m.extend_from_slice(&(body.len() as u32).to_be_bytes());
        m.extend_from_slice(body);
        m
    };
    let put = |out: &mut Vec<u8>, k: u8, flags: u8, stream: u32, payload: &[u8]| {
        frame::write_head(out, payload.len(), k, flags, stream);
        out.extend_from_slice(payload);
    };

    // A unary call: one HEADERS, one DATA ending the stream.
    let mut unary = Vec::new();
    let b1 = block(b"/helloworld.Greeter/SayHello", b"1S");
    put(&mut unary, kind::HEADERS, flag::END_HEADERS, 1, &b1);
    put(&mut unary, kind::DATA, flag::END_STREAM, 1, &message(b"\x0a\x05world"));

    // A second call on the same connection: the dynamic table in use, the
    // block split over CONTINUATION, a padded DATA.
    let mut second = Vec::new();
    let b3 = block(b"/helloworld.Greeter/SayHello", b"250m");
    let (first, rest) = b3.split_at(b3.len() / 2);
    put(&mut second, kind::HEADERS, 0, 3, first);
    put(&mut second, kind::CONTINUATION, flag::END_HEADERS, 3, rest);
    let mut padded = vec![4];
    padded.extend_from_slice(&message(b"\x0a\x03two"));
    padded.extend_from_slice(&[0; 4]);
    put(&mut second, kind::DATA, flag::PADDED | flag::END_STREAM, 3, &padded);

    // Every other frame type, around a client-streaming call.
    let mut others = Vec::new();
    let values = [
        (setting::INITIAL_WINDOW_SIZE, 1 << 20),
        (setting::MAX_FRAME_SIZE, 1 << 15),
        (setting::HEADER_TABLE_SIZE, 256),
    ];
    frame::write_settings(&mut others, &values);
    frame::write_settings_ack(&mut others);
    frame::write_window_update(&mut others, 0, 1 << 20);
    frame::write_ping(&mut others, *b"pingpong", false);
    let b5 = block(b"/routeguide.RouteGuide/RecordRoute", b"10S");
    put(
        &mut others,
        kind::HEADERS,
        flag::END_HEADERS | flag::PRIORITY,
        5,
        &[&[0, 0, 0, 0, 16][..], &b5].concat(),
    );
    put(&mut others, kind::PRIORITY, 0, 5, &[0, 0, 0, 0, 32]);
    put(&mut others, kind::DATA, 0, 5, &message(b"\x08\x01"));
    frame::write_window_update(&mut others, 5, 1000);
    put(&mut others, kind::DATA, 0, 5, &[]);
    put(&mut others, kind::DATA, flag::END_STREAM, 5, &message(b"\x08\x02"));
    let b7 = block(b"/routeguide.RouteGuide/RouteChat", b"1M");
    put(&mut others, kind::HEADERS, flag::END_HEADERS, 7, &b7);
    frame::write_rst(&mut others, 7, Reason::CANCEL);
    put(&mut others, 0xfa, 0xff, 0, b"unknown type");
    frame::write_goaway(&mut others, 0, Reason::NO_ERROR, b"bye");

    // A connection error (PING of 9 bytes), then frames that must not be
    // taken any more.
    let mut broken = unary.clone();
    put(&mut broken, kind::PING, 0, 0, b"123456789");
    frame::write_ping(&mut broken, *b"afterall", false);

    let mut hello = PREFACE.to_vec();
    frame::write_settings(&mut hello, &[(setting::ENABLE_PUSH, 0)]);

    let mut dir = Dir::new(corpus, "http2_frame");
    // `others` refers to table entries the earlier blocks added.
    let all = [unary.clone(), second.clone(), others].concat();
    for (name, control, body) in [
        ("grpc-request", PREFIX | SERVE, unary.clone()),
        ("grpc-request-own-preface", SERVE, [hello.clone(), unary.clone()].concat()),
        ("grpc-request-small", PREFIX | SMALL | SERVE, unary.clone()),
        ("grpc-request-cut-7", PREFIX | SERVE | 7 << 3, unary.clone()),
        ("two-calls", PREFIX | SERVE, [unary.clone(), second].concat()),
        ("every-frame", PREFIX | SERVE, all.clone()),
        ("every-frame-small-cut-3", PREFIX | SMALL | SERVE | 3 << 3, all.clone()),
        ("every-frame-unanswered", PREFIX, all.clone()),
        ("error-then-more", PREFIX | SERVE, broken),
        ("preface-only", 0, hello),
    ] {
        dir.put(name, &[&[control][..], &body].concat());
    }
    dir
}

/// Seeds of the `hpack` target: RFC 7541 Appendix C. Control: bit 0 the
/// encoded mode, bits 1..=7 the advertised table size in 64-byte units.
fn hpack_seeds(corpus: &Path) -> Dir {
    use protoplane_fuzz::hpack::{encode, Indexing, Op, Program};

    const TABLE_4096: u8 = 64 << 1;
    const TABLE_256: u8 = 4 << 1;
    const ENCODED: u8 = 1;

    // C.3 (raw) and C.4 (Huffman): three requests on one connection.
    let c3 = [
        "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
        "8286 84be 5808 6e6f 2d63 6163 6865",
        "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
    ];
    let c4 = [
        "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
        "8286 84be 5886 a8eb 1064 9cbf",
        "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
    ];
    // C.5 (raw) and C.6 (Huffman): three responses with a 256-byte table,
    // signalled as HTTP/2 requires by a size update in the first block.
    let c5 = [
        "3fe101 4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 \
         3133 2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 \
         7861 6d70 6c65 2e63 6f6d",
        "4803 3330 37c1 c0bf",
        "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 \
         474d 54c0 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 \
         454f 5049 5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b 2076 \
         6572 7369 6f6e 3d31",
    ];
    let c6 = [
        "3fe101 4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 \
         82a6 2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
        "4883 640e ffc1 c0bf",
        "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b \
         d9ab 77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 \
         0fb5 291f 9587 3160 65c0 03ed 4ee5 b106 3d50 07",
    ];
    let raw = |control: u8, blocks: &[&str]| {
        let mut out = vec![control];
        for b in blocks {
            let b = hex(b);
            out.extend_from_slice(&(b.len() as u16).to_be_bytes());
            out.extend_from_slice(&b);
        }
        out
    };

    let field = |name: &str, value: &str| Op::Field {
        name: name.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        index: Indexing::Yes,
    };
    let requests: [&[(&str, &str)]; 3] = [
        &[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ],
        &[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
            ("cache-control", "no-cache"),
        ],
        &[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ],
    ];
    let date1 = "Mon, 21 Oct 2013 20:13:21 GMT";
    let cookie = "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1";
    let location = "https://www.example.com";
    let responses: [&[(&str, &str)]; 3] = [
        &[
            (":status", "302"),
            ("cache-control", "private"),
            ("date", date1),
            ("location", location),
        ],
        &[
            (":status", "307"),
            ("cache-control", "private"),
            ("date", date1),
            ("location", location),
        ],
        &[
            (":status", "200"),
            ("cache-control", "private"),
            ("date", "Mon, 21 Oct 2013 20:13:22 GMT"),
            ("location", location),
            ("content-encoding", "gzip"),
            ("set-cookie", cookie),
        ],
    ];
    let program = |size: Option<u16>, blocks: &[&[(&str, &str)]]| {
        let mut ops: Vec<Op> = size.map(Op::TableSize).into_iter().collect();
        for b in blocks {
            ops.extend(b.iter().map(|(n, v)| field(n, v)));
            ops.push(Op::End);
        }
        let bytes = encode(&ops);
        assert_eq!(Program(&bytes).collect::<Vec<_>>(), ops, "an hpack seed does not read back");
        bytes
    };
    // A field of every representation, a size change mid-connection.
    let mixed = [
        Op::Field { name: b"x-token".to_vec(), value: b"abc".to_vec(), index: Indexing::Yes },
        Op::Field { name: b"x-token".to_vec(), value: b"abc".to_vec(), index: Indexing::No },
        Op::Field { name: b"x-token".to_vec(), value: b"abd".to_vec(), index: Indexing::Never },
        Op::Field { name: b":method".to_vec(), value: b"GET".to_vec(), index: Indexing::Never },
        Op::End,
        Op::TableSize(0),
        Op::TableSize(100),
        Op::End,
        Op::Field { name: b"x-token".to_vec(), value: b"abc".to_vec(), index: Indexing::Yes },
        Op::End,
    ];

    let mut dir = Dir::new(corpus, "hpack");
    dir.put("c3-raw", &raw(TABLE_4096, &c3));
    dir.put("c4-raw", &raw(TABLE_4096, &c4));
    dir.put("c5-raw", &raw(TABLE_256, &c5));
    dir.put("c6-raw", &raw(TABLE_256, &c6));
    dir.put("c3-c4-program", &[&[TABLE_4096 | ENCODED][..], &program(None, &requests)].concat());
    dir.put(
        "c5-c6-program",
        &[&[TABLE_256 | ENCODED][..], &program(Some(256), &responses)].concat(),
    );
    dir.put("mixed-program", &[&[TABLE_4096 | ENCODED][..], &encode(&mixed)].concat());
    dir
}

/// Seeds of the `inc` target: a config byte, then records.
fn inc_seeds(corpus: &Path) -> Dir {
    use protoplane_fuzz::inc::{record, run, Op, A, CLIENT, SERVER};
    use protoplane_inc::packet::{Addr, Header, Kind, Packet, Pair, Wide, WideOp};

    let op = |o: Op| o as u8;
    // Client calls (`protoplane_fuzz::inc::client_call`): add of keys
    // 0..6, get, aggregate of 20 values, a vote, clear.
    let add: Vec<u8> = [vec![0u8, 6], (0..6).flat_map(|k| [k, 0, 5 + k]).collect()].concat();
    let get = vec![1u8, 3, 0, 1, 2];
    let clear = vec![2u8];
    let agg: Vec<u8> = [vec![3u8, 20], (0..20).flat_map(|i| [0, i]).collect()].concat();
    let vote = vec![4u8, 0, 0, 0, 1, 0, 0, 0, 9, 0];
    let wait = |us: u16| (us / 16).to_be_bytes().to_vec();
    let traffic: Vec<u8> = [
        record(op(Op::Call), &add),
        record(op(Op::Wait), &wait(30_000)),
        record(op(Op::Call), &add),
        record(op(Op::Wait), &wait(30_000)),
        record(op(Op::Call), &get),
        record(op(Op::Call), &agg),
        record(op(Op::Wait), &wait(5_000)),
        record(op(Op::Propose), &[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 9]),
        record(op(Op::Call), &vote),
        record(op(Op::Wait), &wait(30_000)),
        record(op(Op::Call), &clear),
        record(op(Op::Wait), &wait(30_000)),
        record(op(Op::Replay), &[3, 0, 9, 1]),
        record(op(Op::Replay), &[7, 0, 40, 0x80]),
    ]
    .concat();

    // A's packets as the fuzzer sends them (member 1, flow 1).
    let header = |kind: Kind, seq: u32, aux: u32| {
        let mut h = Header::new(kind, A, 2, SERVER);
        h.flow = 1;
        h.ext = Header::SEQUENCED;
        h.seq = seq;
        h.aux = aux;
        h
    };
    let pairs = |n: u8, index: u16| -> Vec<Pair> {
        (0..n).map(|g| Pair { key: u32::from(g), addr: Addr::new(0, g, index), value: 7 }).collect()
    };
    let a_add = Packet::pairs(header(Kind::Add, 0, 0), pairs(3, 4)).to_bytes();
    let a_agg = Packet::pairs(header(Kind::Agg, 0, 0), pairs(8, 0)).to_bytes();
    let a_vote = Packet::pairs(header(Kind::Vote, 1, 1), pairs(1, 3)).to_bytes();
    let wide = |op: WideOp, key: &[u8], value: i64| Wide { op, key: key.to_vec(), value };
    let a_wide = Packet::wide(
        header(Kind::Wide, 2, 0),
        vec![
            wide(WideOp::Add, &[0, 0, 0, 0, 0, 0, 0, 1], i64::MAX),
            wide(WideOp::Add, &[0, 0, 0, 0, 0, 0, 0, 1], 1),
            wide(WideOp::Get, &[0, 0, 0, 0, 0, 0, 0, 1], 0),
            wide(WideOp::Vote, &[0, 0, 0, 1], 3),
            wide(WideOp::AggPart, &[0, 0, 0, 0], 5),
            wide(WideOp::Release, &[0, 0, 0, 0], 0),
        ],
    )
    .to_bytes();
    let mut result = Header::new(Kind::Result, A, 900, CLIENT);
    result.aux = 0;
    let a_result = Packet::pairs(result, pairs(8, 0)).to_bytes();
    let mut ack = Header::new(Kind::Ack, A, SERVER, CLIENT);
    ack.seq = 0;
    let a_ack = Packet::pairs(ack, pairs(2, 9)).to_bytes();
    let packets: Vec<u8> = [
        record(op(Op::Switch), &a_add),
        record(op(Op::Switch) | 8, &a_add),
        record(op(Op::Switch) | 0xf0, &a_agg),
        record(op(Op::Switch), &a_vote),
        record(op(Op::Server), &a_add),
        record(op(Op::Server), &a_agg),
        record(op(Op::Server), &a_vote),
        record(op(Op::Server), &a_wide),
        record(op(Op::Client), &a_result),
        record(op(Op::Client), &a_ack),
        record(op(Op::Replay), &[1, 0, 7, 0xff]),
        record(op(Op::Wait), &wait(60_000)),
    ]
    .concat();

    let mut dir = Dir::new(corpus, "inc");
    // Config: clear policy (bits 0-1), cache (2-3), 4-bit keys (4),
    // modify (5-6), results to the server too (7).
    for config in [0x02u8, 0x00, 0x01, 0x04, 0x08, 0x12, 0x22, 0x46, 0x61, 0x82] {
        let input = [&[config][..], &traffic].concat();
        run(&input);
        dir.put(&format!("traffic-{config:02x}"), &input);
    }
    for config in [0x02u8, 0x9a] {
        let input = [&[config][..], &packets].concat();
        run(&input);
        dir.put(&format!("packets-{config:02x}"), &input);
    }
    let input = [&[0x02u8][..], &traffic, &packets].concat();
    run(&input);
    dir.put("traffic-packets", &input);

    // `MemberLoss: continue` (clear bits 3): member 0 aggregates, member 1
    // is never heard from and is lost two leases on, the server agent
    // regroups (fence, slot reads, notices); then a notice as the fuzzer
    // forges it, and a heartbeat of the lost member.
    let second = 60_000u16.to_be_bytes().to_vec();
    let notice = protoplane_inc::membership::Notice {
        index: 0,
        lost: 0b10,
        shift: 256,
        blocks: 1,
        first: 0,
        bits: 0b1011,
    };
    let forged =
        Packet::wide(Header::new(Kind::Wide, A, SERVER, CLIENT), vec![notice.to_wide()]).to_bytes();
    let mut alive = header(Kind::Wide, 0, 0);
    alive.ext = 0;
    let lost_alive =
        Packet::wide(alive, vec![wide(WideOp::Alive, &[], 0), wide(WideOp::Fallback, &[], 0)])
            .to_bytes();
    let regroup: Vec<u8> = [
        record(op(Op::Call), &agg),
        record(op(Op::Wait), &second),
        record(op(Op::Wait), &second),
        record(op(Op::Wait), &second),
        record(op(Op::Wait), &second),
        record(op(Op::Call), &agg),
        record(op(Op::Server), &lost_alive),
        record(op(Op::Client), &forged),
        record(op(Op::Wait), &second),
    ]
    .concat();
    for config in [0x03u8, 0x83] {
        let input = [&[config][..], &regroup].concat();
        run(&input);
        dir.put(&format!("regroup-{config:02x}"), &input);
    }
    dir
}

/// Seeds of the `inc_control` target: JSON lines of control messages, and
/// NetFilter documents.
fn inc_control_seeds(corpus: &Path) -> Dir {
    use protoplane_fuzz::inc_control::{run, service};
    use protoplane_inc::controller::Registration;
    use protoplane_inc::messages::{Reply, Request};
    use protoplane_inc::netfilter::NetFilter;
    use protoplane_inc::packet::Addr;
    use protoplane_inc::plan::{AppPlan, CachePolicy, ClearPolicy, MemberLoss};
    use protoplane_inc::switch::{
        AppEntry, Control, ControlReply, CountMode, Destinations, ModifyOp,
    };

    let entry = AppEntry {
        app: 3,
        server: 41000,
        members: vec![41001, 41002],
        forward: Destinations::Both,
        flow_base: 8,
        flows: 4,
        mem_base: 64,
        mem_len: 32,
        threshold: 2,
        count: CountMode::Accumulate,
        modify: Some((ModifyOp::Shr, 3)),
        key: protoplane_inc::mac::Key([0x5a; 16]),
    };
    let controls = [
        Control::Install(entry.clone()),
        Control::Install(AppEntry {
            forward: Destinations::Members,
            count: CountMode::TestAndSet,
            modify: None,
            ..entry.clone()
        }),
        Control::Remove { app: 3 },
        Control::Members { app: 3, members: vec![1, 2] },
        Control::Swap { app: 3, addr: Addr::new(1, 2, 3), tag: 9, value: -4 },
        Control::Read { app: 3, addrs: vec![Addr::new(0, 1, 2), Addr::new(0, 7, 95)] },
        Control::ReadMeta { app: 3, indices: vec![64, 65] },
        Control::ResetMeta { app: 3, slots: vec![(64, 7), (65, 0)] },
        Control::LastSeen,
        Control::Describe,
        Control::Apps,
        Control::Flows { app: 3, flows: vec![8, 9], incarnation: 4 },
    ];
    let control_replies = [
        ControlReply::Done,
        ControlReply::Swapped { tag: 1, value: i32::MIN },
        ControlReply::Cells(vec![(1, -1), (0, i32::MAX)]),
        ControlReply::Meta(vec![(1, 2, 3, u64::MAX)]),
        ControlReply::LastSeen(vec![(3, 1_700_000_000_000_000)]),
        ControlReply::Apps(vec![(entry.clone(), vec![1, 0, 2, 0])]),
        ControlReply::Described {
            node: 900,
            chain_index: 0,
            groups: 8,
            registers: 1024,
            flows: 64,
            window: 64,
        },
        ControlReply::Refused("no such application".into()),
    ];
    let registration = Registration {
        name: "wordcount-0".into(),
        server: 40000,
        members: 4,
        flows_per_member: 2,
        memory: 256,
        clear: ClearPolicy::Lazy,
        cache: CachePolicy::Hashing,
        threshold: 4,
        forward: Destinations::Both,
        count: CountMode::TestAndSet,
        modify: Some((ModifyOp::Max, -3)),
        key_bits: 32,
        member_loss: MemberLoss::Continue,
    };
    let requests = [
        Request::Register(registration.clone()),
        Request::Register(Registration { modify: None, key_bits: 4, ..registration }),
        Request::Join { name: "wordcount-0".into(), member: 3, node: 41003 },
        Request::Lookup { name: "wordcount-0".into() },
        Request::Heartbeat { app: 2 },
        Request::Deregister { app: 2 },
    ];
    let plan = AppPlan {
        app: 1,
        server: 40000,
        switch: Some(900),
        members: 4,
        flows_per_member: 2,
        flow_base: 0,
        switches: 1,
        groups: 8,
        window: 64,
        memory: Some((0, 64)),
        clear: ClearPolicy::Shadow,
        cache: CachePolicy::PeriodicCounting,
        threshold: 4,
        key_bits: 32,
        key: protoplane_inc::mac::Key([0x5a; 16]),
        incarnation: 2,
        member_loss: MemberLoss::Continue,
    };
    let replies = [
        Reply::Plan(plan.clone(), vec![Some(41001), None]),
        Reply::Plan(AppPlan { switch: None, memory: None, ..plan }, Vec::new()),
        Reply::Ok,
        Reply::Error("unknown application".into()),
        Reply::Probe(7),
    ];
    let lines: Vec<(&str, String)> = controls
        .iter()
        .map(|c| ("control", c.to_json().to_string()))
        .chain(control_replies.iter().map(|r| ("control-reply", r.to_json().to_string())))
        .chain(requests.iter().map(|r| ("request", r.to_json().to_string())))
        .chain(replies.iter().map(|r| ("reply", r.to_json().to_string())))
        .collect();

    let mut dir = Dir::new(corpus, "inc_control");
    let mut all = String::new();
    for (name, line) in &lines {
        let input = format!("{line}\n");
        run(input.as_bytes());
        dir.put(name, input.as_bytes());
        all.push_str(&input);
    }
    run(all.as_bytes());
    dir.put("all", all.as_bytes());

    let (tables, service) = service();
    for (name, text) in [
        ("netfilter-agreement", include_str!("../../examples/inc/netfilter/agreement.json")),
        ("netfilter-async-agg", include_str!("../../examples/inc/netfilter/async_agg.json")),
        ("netfilter-key-value", include_str!("../../examples/inc/netfilter/key_value.json")),
        ("netfilter-sync-agg", include_str!("../../examples/inc/netfilter/sync_agg.json")),
    ] {
        if let Err(e) = NetFilter::parse(text, service, tables) {
            panic!("seed {name}: {e}");
        }
        run(text.as_bytes());
        dir.put(name, text.as_bytes());
    }
    dir
}
