//! The IEDT package and the NetFilter: `protos/protoplane/inc.proto`
//! compiles with the repository's loader, a valid filter resolves to the
//! expected rules, and every invalid filter fails with its exact message.

use std::path::PathBuf;

use protoplane_inc::netfilter::{
    iedt_of, load_protos, select_service, services_of, ClearRule, CntFwdRule, FieldRef, FieldRule,
    GetRule, Iedt, ModifyRule, NetFilter, ServiceSig, Threshold,
};
use protoplane_inc::plan::{CachePolicy, ClearPolicy, MemberLoss};
use protoplane_inc::switch::{CountMode, Destinations, ModifyOp};
use protoplane_schema::TableSet;

fn repo_protos() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../protos")
}

fn test_protos() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/protos")
}

/// The wordcount schema: its tables and the `wordcount.WordCount` service.
fn wordcount() -> (TableSet, ServiceSig) {
    let (tables, services) = load_protos(
        &[test_protos().join("wordcount/wordcount.proto")],
        &[test_protos(), repo_protos()],
    )
    .expect("wordcount.proto compiles");
    let service = services
        .into_iter()
        .find(|s| s.name == "wordcount.WordCount")
        .expect("wordcount.WordCount is declared");
    (tables, service)
}

fn field(tables: &TableSet, message: &str, name: &str, number: u32, iedt: Iedt) -> FieldRef {
    FieldRef {
        message: tables.message_by_name(message).expect("message exists"),
        name: name.to_owned(),
        number,
        iedt,
    }
}

#[test]
fn inc_proto_compiles_with_the_repository_loader() {
    let tables =
        TableSet::from_proto_files(&[repo_protos().join("protoplane/inc.proto")], &[repo_protos()])
            .expect("protos/protoplane/inc.proto compiles");
    for iedt in Iedt::ALL {
        let index = tables.message_by_name(iedt.message_name()).expect("IEDT message is declared");
        assert_eq!(Iedt::from_message_name(tables.message_name(index)), Some(iedt));
    }
    // Exactly the eight IEDTs (and their map entries), nothing else.
    let declared: Vec<&str> = (0..tables.messages().len() as u32)
        .map(|i| tables.message_name(i))
        .filter(|n| !n.ends_with("Entry"))
        .collect();
    assert_eq!(declared.len(), Iedt::ALL.len(), "{declared:?}");
    let keys = tables.message(tables.message_by_name("protoplane.inc.Keys").expect("Keys"));
    let ints = tables.field_by_name(keys, "ints").expect("Keys.ints");
    let strs = tables.field_by_name(keys, "strs").expect("Keys.strs");
    assert_eq!((ints.number, strs.number), (1, 2));
}

#[test]
fn iedt_of_resolves_fields_by_number() {
    let (tables, _) = wordcount();
    let req = tables.message_by_name("wordcount.CountRequest").expect("CountRequest");
    assert_eq!(iedt_of(&tables, req, 1), None, "document is a string");
    assert_eq!(iedt_of(&tables, req, 2), Some(Iedt::StrIntMap));
    assert_eq!(iedt_of(&tables, req, 4), Some(Iedt::IntMap), "the type, whatever the cardinality");
    assert_eq!(iedt_of(&tables, req, 5), Some(Iedt::IntArray));
    assert_eq!(iedt_of(&tables, req, 6), Some(Iedt::Keys));
    assert_eq!(iedt_of(&tables, req, 99), None);
    assert_eq!(iedt_of(&tables, u32::MAX - 1, 1), None);
    let grad = tables.message_by_name("wordcount.GradRequest").expect("GradRequest");
    assert_eq!(iedt_of(&tables, grad, 1), Some(Iedt::FloatArray));
    assert_eq!(iedt_of(&tables, grad, 2), Some(Iedt::StrFloatMap));
    assert_eq!(iedt_of(&tables, grad, 4), Some(Iedt::Int));
    assert!(Iedt::FloatArray.is_float() && Iedt::FloatArray.is_array());
    assert!(Iedt::StrIntMap.is_map() && !Iedt::StrIntMap.is_float());
    assert!(!Iedt::Keys.is_map() && !Iedt::Int.is_array());
}

const VALID: &str = r#"{
  "AppName": "wordcount",
  "Service": "wordcount.WordCount",
  "Precision": 3,
  "Memory": 1024,
  "Cache": "fcfs",
  "Map.addTo": [
    {"Method": "Count", "Field": "counts"},
    {"Method": "Count", "Field": "histogram"},
    {"Method": "Grad", "Field": "grads"}
  ],
  "Map.get": [{"Method": "Read", "Keys": "keys", "Result": "counts"}],
  "Map.clear": [{"Method": "Reset", "Policy": "shadow"}, {"Method": "Grad", "Policy": "shadow"}],
  "Stream.modify": [
    {"Method": "Count", "Field": "counts", "Op": "max", "Parameter": 0},
    {"Method": "Grad", "Field": "grads", "Op": "max", "Parameter": 0}
  ],
  "CntFwd": [
    {"Method": "Vote", "Keys": "ballot", "Threshold": 3, "Destinations": "both", "Count": "test-and-set"},
    {"Method": "Vote", "Keys": "candidates", "Threshold": 3, "Destinations": "both"}
  ]
}"#;

#[test]
fn a_valid_filter_resolves_every_rule() {
    let (tables, service) = wordcount();
    let f = NetFilter::parse(VALID, &service, &tables).expect("the filter is valid");
    assert_eq!(f.app_name, "wordcount");
    assert_eq!(f.service, "wordcount.WordCount");
    assert_eq!(f.precision, Some(3));
    assert_eq!(f.memory, 1024);
    assert_eq!(f.cache, CachePolicy::Fcfs);
    let t = &tables;
    assert_eq!(
        f.add_to,
        vec![
            FieldRule {
                method: "Count".into(),
                field: field(t, "wordcount.CountRequest", "counts", 2, Iedt::StrIntMap)
            },
            FieldRule {
                method: "Count".into(),
                field: field(t, "wordcount.CountRequest", "histogram", 5, Iedt::IntArray)
            },
            FieldRule {
                method: "Grad".into(),
                field: field(t, "wordcount.GradRequest", "grads", 1, Iedt::FloatArray)
            },
        ]
    );
    assert_eq!(
        f.get,
        vec![GetRule {
            method: "Read".into(),
            keys: field(t, "wordcount.ReadRequest", "keys", 1, Iedt::Keys),
            result: field(t, "wordcount.ReadReply", "counts", 1, Iedt::StrIntMap),
        }]
    );
    assert_eq!(
        f.clear,
        vec![
            ClearRule { method: "Reset".into(), policy: ClearPolicy::Shadow },
            ClearRule { method: "Grad".into(), policy: ClearPolicy::Shadow },
        ]
    );
    assert_eq!(
        f.modify,
        vec![
            ModifyRule {
                method: "Count".into(),
                field: field(t, "wordcount.CountRequest", "counts", 2, Iedt::StrIntMap),
                op: ModifyOp::Max,
                parameter: 0,
            },
            ModifyRule {
                method: "Grad".into(),
                field: field(t, "wordcount.GradRequest", "grads", 1, Iedt::FloatArray),
                op: ModifyOp::Max,
                parameter: 0,
            },
        ]
    );
    let vote = |name: &str, number: u32, iedt: Iedt| CntFwdRule {
        method: "Vote".into(),
        keys: field(t, "wordcount.VoteRequest", name, number, iedt),
        threshold: Threshold::Count(3),
        destinations: Destinations::Both,
        count: CountMode::TestAndSet,
    };
    assert_eq!(f.cnt_fwd, vec![vote("ballot", 1, Iedt::Int), vote("candidates", 2, Iedt::Keys)]);
    assert_eq!(f.clear_policy(), ClearPolicy::Shadow);
    assert_eq!(f.modify_op(), Some((ModifyOp::Max, 0)));
    assert_eq!(
        f.counting(),
        Some((Threshold::Count(3), Destinations::Both, CountMode::TestAndSet))
    );
    assert!(f.uses_floats());
    assert_eq!(f.quantizer().map(|q| q.quantize(1.2345)), Some(Ok(1235)));
}

#[test]
fn defaults_and_the_module_example() {
    let (tables, service) = wordcount();
    let f = NetFilter::parse(r#"{"AppName": "a"}"#, &service, &tables).expect("minimal filter");
    assert_eq!(f.precision, None);
    assert_eq!(f.memory, 256);
    assert_eq!(f.cache, CachePolicy::PeriodicCounting);
    assert!(f.add_to.is_empty() && f.get.is_empty() && f.clear.is_empty());
    assert!(f.modify.is_empty() && f.cnt_fwd.is_empty());
    assert_eq!(f.clear_policy(), ClearPolicy::Copy);
    assert_eq!(f.modify_op(), None);
    assert_eq!(f.counting(), None);
    assert!(!f.uses_floats() && f.quantizer().is_none());
    assert_eq!(f.member_loss, MemberLoss::Fail);
    assert_eq!(f.registration("a", 4, 1).member_loss, MemberLoss::Fail);
    let goes_on = r#"{"AppName": "a", "MemberLoss": "continue"}"#;
    let f = NetFilter::parse(goes_on, &service, &tables).expect("member loss");
    assert_eq!(f.registration("a", 4, 1).member_loss, MemberLoss::Continue);

    // The example at the top of `netfilter.rs`, with defaults spelled out
    // elsewhere: JSON names, the unqualified service name, "members".
    let doc = r#"{
      "AppName": "wordcount",
      "Service": "WordCount",
      "Precision": 3,
      "Memory": 256,
      "Cache": "periodic-counting",
      "Map.addTo": [
        {"Method": "Count", "Field": "counts"},
        {"Method": "Grad", "Field": "grads"}
      ],
      "Map.get": [{"Method": "Read", "Keys": "keys", "Result": "counts"}],
      "Map.clear": [{"Method": "Reset", "Policy": "copy"}],
      "Stream.modify": [{"Method": "Count", "Field": "counts", "Op": "max", "Parameter": 0}],
      "CntFwd": [
        {"Method": "Vote", "Keys": "ballot", "Threshold": 3,
         "Destinations": "server", "Count": "test-and-set"}
      ]
    }"#;
    let f = NetFilter::parse(doc, &service, &tables).expect("the module example is valid");
    assert_eq!(f.cnt_fwd[0].destinations, Destinations::Server);
    let members = r#"{"AppName": "a", "CntFwd": [{"Method": "Vote", "Keys": "candidates",
        "Threshold": "members", "Destinations": "clients", "Count": "accumulate"}]}"#;
    let f = NetFilter::parse(members, &service, &tables).expect("members threshold");
    assert_eq!(f.cnt_fwd[0].threshold, Threshold::Members);
    assert_eq!(f.cnt_fwd[0].threshold.resolve(5), 5);
    assert_eq!(f.cnt_fwd[0].destinations, Destinations::Members);
    assert_eq!(f.cnt_fwd[0].count, CountMode::Accumulate);
    let accumulate = r#"{"AppName": "a", "CntFwd": [{"Method": "Vote", "Keys": "ballot",
        "Threshold": 1000, "Count": "accumulate"}]}"#;
    let f = NetFilter::parse(accumulate, &service, &tables).expect("accumulate threshold");
    assert_eq!(
        f.counting(),
        Some((Threshold::Count(1000), Destinations::Server, CountMode::Accumulate))
    );
    let shift = r#"{"AppName": "a", "Stream.modify": [{"Method": "Count", "Field": "histogram",
        "Op": "shr", "Parameter": 31}]}"#;
    let f = NetFilter::parse(shift, &service, &tables).expect("shr 31");
    assert_eq!(f.modify_op(), Some((ModifyOp::Shr, 31)));
}

#[test]
fn services_are_read_from_descriptors_and_selected_by_the_filter() {
    let set = protoplane_schema::compile_protos(
        &[test_protos().join("wordcount/wordcount.proto")],
        &[test_protos(), repo_protos()],
    )
    .expect("wordcount.proto compiles");
    let services = services_of(&set);
    let names: Vec<&str> = services.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["wordcount.WordCount", "wordcount.Admin"]);
    let wc = &services[0];
    let methods: Vec<(&str, &str, &str)> =
        wc.methods.iter().map(|m| (m.name.as_str(), m.input.as_str(), m.output.as_str())).collect();
    assert_eq!(methods[0], ("Count", "wordcount.CountRequest", "wordcount.CountReply"));
    assert_eq!(methods.len(), 5);
    assert_eq!(wc.short_name(), "WordCount");
    assert!(wc.method("Vote").is_some() && wc.method("vote").is_none());

    let pick = |json: &str| select_service(&services, json).map(|s| s.name.clone());
    assert_eq!(pick(r#"{"Service": "wordcount.Admin"}"#), Ok("wordcount.Admin".into()));
    assert_eq!(pick(r#"{"Service": "WordCount"}"#), Ok("wordcount.WordCount".into()));
    let err =
        |json: &str| select_service(&services, json).map(|_| ()).expect_err("fails").to_string();
    assert_eq!(
        err(r#"{"AppName": "a"}"#),
        "Service: missing; the schema declares 2 services (wordcount.WordCount, wordcount.Admin): say which one this filter is for"
    );
    assert_eq!(
        err(r#"{"Service": "Nope"}"#),
        r#"Service: no service "Nope" in the schema (services: wordcount.WordCount, wordcount.Admin)"#
    );
    assert_eq!(err(r#"{"Service": 7}"#), "Service: expected a string, got a number (7)");
    assert_eq!(err("[]"), "a NetFilter is a JSON object, got an array");
    let one = &services[..1];
    assert_eq!(select_service(one, "{}").map(|s| s.name.as_str()), Ok("wordcount.WordCount"));
    assert_eq!(
        select_service(&[], "{}").map(|_| ()).expect_err("no services").to_string(),
        "the schema declares no services"
    );
    let bad = load_protos(&[test_protos().join("missing.proto")], &[test_protos()])
        .map(|_| ())
        .expect_err("missing file");
    assert!(bad.to_string().starts_with("schema: "), "{bad}");
}

#[test]
fn a_look_alike_of_an_iedt_is_refused() {
    let (tables, services) = load_protos(&[test_protos().join("fake_inc.proto")], &[test_protos()])
        .expect("fake_inc.proto compiles");
    let service = services.first().expect("service Fake");
    let req = tables.message_by_name("protoplane.inc.FakeRequest").expect("FakeRequest");
    assert_eq!(iedt_of(&tables, req, 1), None);
    let doc = r#"{"AppName": "a", "Map.addTo": [{"Method": "Push", "Field": "values"}]}"#;
    let err = NetFilter::parse(doc, service, &tables).expect_err("look-alike").to_string();
    assert_eq!(
        err,
        "\"Map.addTo\"[0].Field: values of protoplane.inc.FakeRequest (request of Push) is a protoplane.inc.IntArray whose fields differ from protos/protoplane/inc.proto; import that file rather than declaring the type"
    );
}

/// (filter, exact error).
const INVALID: &[(&str, &str)] = &[
    // The document.
    (r#"{"AppName": "a","#, "not valid JSON: EOF while parsing a value at line 1 column 16"),
    ("[1]", "a NetFilter is a JSON object, got an array"),
    (
        r#"{"AppName": "a", "Map.addto": []}"#,
        "\"Map.addto\": unknown key; a NetFilter takes AppName, Service, Precision, Memory, Cache, MemberLoss, Map.addTo, Map.get, Map.clear, Stream.modify, CntFwd",
    ),
    // AppName.
    ("{}", "AppName: missing (the application's name, 1 to 48 characters of [A-Za-z0-9_.-])"),
    (r#"{"AppName": ""}"#, "AppName: empty; give 1 to 48 characters of [A-Za-z0-9_.-]"),
    (
        r#"{"AppName": "word count"}"#,
        "AppName: \"word count\" has ' ' at byte 4; give 1 to 48 characters of [A-Za-z0-9_.-]",
    ),
    (
        r#"{"AppName": "abcdefghijabcdefghijabcdefghijabcdefghijabcdefghi"}"#,
        "AppName: \"abcdefghijabcdefghijabcdefghijabcdefghijabcdefghi\" is 49 characters long; give 1 to 48 characters of [A-Za-z0-9_.-]",
    ),
    (r#"{"AppName": 5}"#, "AppName: expected a string, got a number (5)"),
    // Service, Precision, Memory, Cache.
    (
        r#"{"AppName": "a", "Service": "wordcount.Admin"}"#,
        "Service: \"wordcount.Admin\" is not the service this filter is checked against (wordcount.WordCount)",
    ),
    (r#"{"AppName": "a", "Precision": 10}"#, "Precision: expected an integer from 0 to 9, got a number (10)"),
    (r#"{"AppName": "a", "Precision": "3"}"#, "Precision: expected an integer from 0 to 9, got a string (\"3\")"),
    (r#"{"AppName": "a", "Memory": 0}"#, "Memory: expected an integer from 1 to 4294967295, got a number (0)"),
    (
        r#"{"AppName": "a", "Cache": "lru"}"#,
        "Cache: unknown cache policy \"lru\"; one of periodic-counting, fcfs, hashing",
    ),
    (
        r#"{"AppName": "a", "MemberLoss": "skip"}"#,
        "MemberLoss: unknown member-loss policy \"skip\"; one of fail, continue",
    ),
    (r#"{"AppName": "a", "MemberLoss": true}"#, "MemberLoss: expected a string, got a boolean (true)"),
    // Entries and methods.
    (
        r#"{"AppName": "a", "Map.addTo": {"Method": "Count"}}"#,
        "\"Map.addTo\": expected an array of entries, got an object",
    ),
    (r#"{"AppName": "a", "CntFwd": ["Vote"]}"#, "CntFwd[0]: expected an object, got a string (\"Vote\")"),
    (
        r#"{"AppName": "a", "Map.addTo": [{"Method": "Count", "Feild": "counts"}]}"#,
        "\"Map.addTo\"[0].Feild: unknown key; Map.addTo entries take Method, Field",
    ),
    (
        r#"{"AppName": "a", "Map.addTo": [{"Field": "counts"}]}"#,
        "\"Map.addTo\"[0].Method: missing (the name of a method of the service)",
    ),
    (
        r#"{"AppName": "a", "Map.addTo": [{"Method": "Cnt", "Field": "counts"}]}"#,
        "\"Map.addTo\"[0].Method: the service wordcount.WordCount has no method \"Cnt\" (methods: Count, Read, Reset, Grad, Vote)",
    ),
    // Fields.
    (
        r#"{"AppName": "a", "Map.addTo": [{"Method": "Count"}]}"#,
        "\"Map.addTo\"[0].Field: missing (a field of wordcount.CountRequest, the request of Count)",
    ),
    (
        r#"{"AppName": "a", "Map.addTo": [{"Method": "Count", "Field": "cnts"}]}"#,
        "\"Map.addTo\"[0].Field: wordcount.CountRequest (request of Count) has no field \"cnts\"; its fields: document (string), counts (protoplane.inc.StrIntMap), shard (uint32), history (repeated protoplane.inc.IntMap), histogram (protoplane.inc.IntArray), seen (protoplane.inc.Keys)",
    ),
    (
        r#"{"AppName": "a", "Map.addTo": [{"Method": "Count", "Field": "document"}]}"#,
        "\"Map.addTo\"[0].Field: document of wordcount.CountRequest (request of Count) is a string, not an IEDT; Map.addTo's Field must be an array or map IEDT (protoplane.inc.IntArray, FloatArray, IntMap, StrIntMap, IntFloatMap or StrFloatMap)",
    ),
    (
        r#"{"AppName": "a", "Map.addTo": [{"Method": "Count", "Field": "history"}]}"#,
        "\"Map.addTo\"[0].Field: history of wordcount.CountRequest (request of Count) is a repeated protoplane.inc.IntMap; an IEDT field must be singular",
    ),
    (
        r#"{"AppName": "a", "Map.addTo": [{"Method": "Count", "Field": "seen"}]}"#,
        "\"Map.addTo\"[0].Field: seen of wordcount.CountRequest (request of Count) is a protoplane.inc.Keys; Map.addTo's Field must be an array or map IEDT (protoplane.inc.IntArray, FloatArray, IntMap, StrIntMap, IntFloatMap or StrFloatMap)",
    ),
    (
        r#"{"AppName": "a", "Map.addTo": [{"Method": "Grad", "Field": "grads"}]}"#,
        "\"Map.addTo\"[0].Field: grads of wordcount.GradRequest (request of Grad) is a protoplane.inc.FloatArray: floats need \"Precision\" (decimal digits kept, 0 to 9)",
    ),
    (
        r#"{"AppName": "a", "Map.addTo": [{"Method": "Count", "Field": "counts"}, {"Method": "Count", "Field": "counts"}]}"#,
        "\"Map.addTo\"[1].Field: Map.addTo of Count.counts is already given at \"Map.addTo\"[0]; one entry per method and field",
    ),
    // Map.get.
    (
        r#"{"AppName": "a", "Map.get": [{"Method": "Read", "Keys": "client", "Result": "counts"}]}"#,
        "\"Map.get\"[0].Keys: client of wordcount.ReadRequest (request of Read) is a string, not an IEDT; Map.get's Keys must be a protoplane.inc.Keys",
    ),
    (
        r#"{"AppName": "a", "Map.get": [{"Method": "Count", "Keys": "histogram", "Result": "ok"}]}"#,
        "\"Map.get\"[0].Keys: histogram of wordcount.CountRequest (request of Count) is a protoplane.inc.IntArray; Map.get's Keys must be a protoplane.inc.Keys",
    ),
    (
        r#"{"AppName": "a", "Map.get": [{"Method": "Read", "Keys": "keys", "Result": "histogram"}]}"#,
        "\"Map.get\"[0].Result: histogram of wordcount.ReadReply (response of Read) is a protoplane.inc.IntArray; Map.get's Result must be a map IEDT (protoplane.inc.IntMap, StrIntMap, IntFloatMap or StrFloatMap)",
    ),
    (
        r#"{"AppName": "a", "Map.get": [{"Method": "Read", "Keys": "keys", "Result": "weights"}]}"#,
        "\"Map.get\"[0].Result: weights of wordcount.ReadReply (response of Read) is a protoplane.inc.StrFloatMap: floats need \"Precision\" (decimal digits kept, 0 to 9)",
    ),
    (
        r#"{"AppName": "a", "Map.get": [{"Method": "Read", "Keys": "keys", "Result": "keys"}]}"#,
        "\"Map.get\"[0].Result: wordcount.ReadReply (response of Read) has no field \"keys\"; its fields: counts (protoplane.inc.StrIntMap), histogram (protoplane.inc.IntArray), weights (protoplane.inc.StrFloatMap)",
    ),
    (
        r#"{"AppName": "a", "Map.get": [{"Method": "Reset", "Keys": "reason", "Result": "x"}]}"#,
        "\"Map.get\"[0].Keys: reason of wordcount.ResetRequest (request of Reset) is a string, not an IEDT; Map.get's Keys must be a protoplane.inc.Keys",
    ),
    // Map.clear.
    (
        r#"{"AppName": "a", "Map.clear": [{"Method": "Reset", "Policy": "eager"}]}"#,
        "\"Map.clear\"[0].Policy: unknown clear policy \"eager\"; one of copy, shadow, lazy",
    ),
    (
        r#"{"AppName": "a", "Map.clear": [{"Method": "Reset", "Policy": "copy"}, {"Method": "Reset", "Policy": "copy"}]}"#,
        "\"Map.clear\"[1].Method: Reset already has a clear policy (at \"Map.clear\"[0]); at most one per method",
    ),
    (
        r#"{"AppName": "a", "Map.clear": [{"Method": "Reset", "Policy": "copy"}, {"Method": "Count", "Policy": "lazy"}]}"#,
        "\"Map.clear\"[1].Policy: lazy differs from copy at \"Map.clear\"[0]; the data plane clears all of an application's slots one way",
    ),
    // Stream.modify.
    (
        r#"{"AppName": "a", "Stream.modify": [{"Method": "Count", "Field": "seen", "Op": "add", "Parameter": 1}]}"#,
        "\"Stream.modify\"[0].Field: seen of wordcount.CountRequest (request of Count) is a protoplane.inc.Keys; Stream.modify's Field must be an integer IEDT (protoplane.inc.Int, IntArray, IntMap or StrIntMap) or, with Precision, a float one (FloatArray, IntFloatMap or StrFloatMap)",
    ),
    (
        r#"{"AppName": "a", "Stream.modify": [{"Method": "Grad", "Field": "weights", "Op": "add", "Parameter": 1}]}"#,
        "\"Stream.modify\"[0].Field: weights of wordcount.GradRequest (request of Grad) is a protoplane.inc.StrFloatMap: floats need \"Precision\" (decimal digits kept, 0 to 9)",
    ),
    (
        r#"{"AppName": "a", "Stream.modify": [{"Method": "Count", "Field": "counts", "Op": "mul", "Parameter": 2}]}"#,
        "\"Stream.modify\"[0].Op: unknown operation \"mul\"; one of add, max, min, and, or, shl, shr",
    ),
    (
        r#"{"AppName": "a", "Stream.modify": [{"Method": "Count", "Field": "counts", "Op": "add"}]}"#,
        "\"Stream.modify\"[0].Parameter: missing (the add operand, a 32-bit integer)",
    ),
    (
        r#"{"AppName": "a", "Stream.modify": [{"Method": "Count", "Field": "counts", "Op": "add", "Parameter": 2147483648}]}"#,
        "\"Stream.modify\"[0].Parameter: 2147483648 does not fit a 32-bit register (-2147483648 to 2147483647)",
    ),
    (
        r#"{"AppName": "a", "Stream.modify": [{"Method": "Count", "Field": "counts", "Op": "add", "Parameter": 1.5}]}"#,
        "\"Stream.modify\"[0].Parameter: expected an integer, got a number (1.5)",
    ),
    (
        r#"{"AppName": "a", "Stream.modify": [{"Method": "Count", "Field": "counts", "Op": "shl", "Parameter": 32}]}"#,
        "\"Stream.modify\"[0].Parameter: shl shifts by 0 to 31 bits, got 32",
    ),
    (
        r#"{"AppName": "a", "Stream.modify": [{"Method": "Count", "Field": "counts", "Op": "shr", "Parameter": -1}]}"#,
        "\"Stream.modify\"[0].Parameter: shr shifts by 0 to 31 bits, got -1",
    ),
    (
        r#"{"AppName": "a", "Stream.modify": [{"Method": "Count", "Field": "counts", "Op": "max", "Parameter": 0}, {"Method": "Grad", "Field": "level", "Op": "min", "Parameter": 0}]}"#,
        "\"Stream.modify\"[1]: min 0 differs from max 0 at \"Stream.modify\"[0]; the data plane applies one operation to all of an application's values",
    ),
    (
        r#"{"AppName": "a", "Stream.modify": [{"Method": "Count", "Field": "counts", "Op": "max", "Parameter": 0}, {"Method": "Count", "Field": "counts", "Op": "max", "Parameter": 0}]}"#,
        "\"Stream.modify\"[1].Field: Stream.modify of Count.counts is already given at \"Stream.modify\"[0]; one entry per method and field",
    ),
    // CntFwd.
    (
        r#"{"AppName": "a", "CntFwd": [{"Method": "Count", "Keys": "counts", "Threshold": 2}]}"#,
        "CntFwd[0].Keys: counts of wordcount.CountRequest (request of Count) is a protoplane.inc.StrIntMap; CntFwd's Keys must be a protoplane.inc.Int, IntArray, FloatArray (counted per position) or Keys",
    ),
    (
        r#"{"AppName": "a", "CntFwd": [{"Method": "Vote", "Keys": "ballot"}]}"#,
        "CntFwd[0].Threshold: missing (a number of at least 1, \"members\" or \"majority\")",
    ),
    (
        r#"{"AppName": "a", "CntFwd": [{"Method": "Vote", "Keys": "ballot", "Threshold": 0}]}"#,
        "CntFwd[0].Threshold: expected an integer from 1 to 4294967295, got a number (0)",
    ),
    (
        r#"{"AppName": "a", "CntFwd": [{"Method": "Vote", "Keys": "ballot", "Threshold": "all"}]}"#,
        "CntFwd[0].Threshold: expected a number of at least 1, \"members\" or \"majority\", got \"all\"",
    ),
    (
        r#"{"AppName": "a", "CntFwd": [{"Method": "Vote", "Keys": "ballot", "Threshold": 33}]}"#,
        "CntFwd[0].Threshold: 33 is more than test-and-set counting can reach (distinct senders, at most 32)",
    ),
    (
        r#"{"AppName": "a", "CntFwd": [{"Method": "Vote", "Keys": "ballot", "Threshold": 2, "Destinations": "everyone"}]}"#,
        "CntFwd[0].Destinations: unknown destinations \"everyone\"; one of server, clients, both",
    ),
    (
        r#"{"AppName": "a", "CntFwd": [{"Method": "Vote", "Keys": "ballot", "Threshold": 2, "Count": "sum"}]}"#,
        "CntFwd[0].Count: unknown counting \"sum\"; one of test-and-set, accumulate",
    ),
    (
        r#"{"AppName": "a", "CntFwd": [{"Method": "Vote", "Keys": "ballot", "Threshold": 2}, {"Method": "Vote", "Keys": "ballot", "Threshold": 2}]}"#,
        "CntFwd[1].Keys: CntFwd of Vote.ballot is already given at CntFwd[0]; one entry per method and field",
    ),
    (
        r#"{"AppName": "a", "CntFwd": [{"Method": "Vote", "Keys": "ballot", "Threshold": 2}, {"Method": "Vote", "Keys": "candidates", "Threshold": "members"}]}"#,
        "CntFwd[1]: Threshold \"members\", Destinations server, Count test-and-set differs from Threshold 2, Destinations server, Count test-and-set at CntFwd[0]; the data plane counts one way per application",
    ),
];

#[test]
fn invalid_filters_fail_with_exact_messages() {
    let (tables, service) = wordcount();
    let mut wrong = Vec::new();
    for (doc, expected) in INVALID {
        match NetFilter::parse(doc, &service, &tables) {
            Ok(f) => wrong.push(format!("{doc}\n  parsed: {f:?}")),
            Err(e) if e.to_string() != *expected => {
                wrong.push(format!("{doc}\n  expected: {expected}\n  got:      {e}"))
            }
            Err(_) => {}
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} cases wrong:\n{}",
        wrong.len(),
        INVALID.len(),
        wrong.join("\n")
    );
    assert!(INVALID.len() >= 15);
}

#[test]
fn errors_carry_their_path() {
    let (tables, service) = wordcount();
    let doc = r#"{"AppName": "a", "Map.addTo": [{"Method": "Count", "Field": "x"}]}"#;
    let e = NetFilter::parse(doc, &service, &tables).expect_err("unknown field");
    assert_eq!(e.path, "\"Map.addTo\"[0].Field");
    assert!(e.message.starts_with("wordcount.CountRequest (request of Count) has no field \"x\""));
    let e = NetFilter::parse("nope", &service, &tables).expect_err("not JSON");
    assert_eq!(e.path, "");
    let _: &dyn std::error::Error = &e;
}
