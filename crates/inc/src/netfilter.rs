//! The NetFilter: what the network computes for one service.
//!
//! A service's messages carry INC-enabled data types (IEDTs, the messages
//! of `protos/protoplane/inc.proto`, package `protoplane.inc`) beside
//! ordinary fields. Its NetFilter is one JSON document saying, per method
//! and IEDT field, which INC primitive applies. [`NetFilter::parse`] reads
//! it and checks it against the service's methods ([`ServiceSig`]) and
//! messages (a [`TableSet`]), resolving every field name to a field number
//! and an [`Iedt`].
//!
//! # Format
//!
//! ```json
//! {
//!   "AppName": "wordcount",
//!   "Service": "wordcount.WordCount",
//!   "Precision": 3,
//!   "Memory": 256,
//!   "Cache": "periodic-counting",
//!   "Map.addTo": [
//!     {"Method": "Count", "Field": "counts"},
//!     {"Method": "Grad", "Field": "grads"}
//!   ],
//!   "Map.get": [{"Method": "Read", "Keys": "keys", "Result": "counts"}],
//!   "Map.clear": [{"Method": "Reset", "Policy": "copy"}],
//!   "Stream.modify": [{"Method": "Count", "Field": "counts", "Op": "max", "Parameter": 0}],
//!   "CntFwd": [
//!     {"Method": "Vote", "Keys": "ballot", "Threshold": 3,
//!      "Destinations": "server", "Count": "test-and-set"}
//!   ]
//! }
//! ```
//!
//! | key | value |
//! |---|---|
//! | `AppName` | required; 1 to 48 of `[A-Za-z0-9_.-]` |
//! | `Service` | the service's full name (or its unqualified name); optional, [`select_service`] needs it when the schema declares several services |
//! | `Precision` | decimal digits kept when floats are quantized (`x` becomes `round(x · 10^Precision)`), 0 to 9; required when any rule uses a float IEDT |
//! | `Memory` | register indices wanted, at least 1; default 256 |
//! | `Cache` | which map keys get data-plane cells: `periodic-counting` (default), `fcfs`, `hashing` ([`CachePolicy`]) |
//! | `MemberLoss` | what synchronous aggregation does when a member's heartbeats stop for a lease: `fail` (default: every aggregation fails at once, naming the member) or `continue` (the others go on; each result says which members it sums, [`MemberLoss`]) |
//! | `Map.addTo` | `Method`, `Field`: aggregate (add) a request's array or map IEDT |
//! | `Map.get` | `Method`, `Keys` (a request `protoplane.inc.Keys`), `Result` (a response map IEDT): read the aggregated values of the keys |
//! | `Map.clear` | `Method`, `Policy` (`copy`, `shadow`, `lazy`, [`ClearPolicy`]): how aggregation slots are made ready again |
//! | `Stream.modify` | `Method`, `Field` (a request `Int`, `IntArray`, `IntMap`, `StrIntMap`; with `Precision` also `FloatArray`, `IntFloatMap`, `StrFloatMap`), `Op` (`add`, `max`, `min`, `and`, `or`, `shl`, `shr`, [`ModifyOp`]), `Parameter` (an `i32`; 0 to 31 for `shl`/`shr`) |
//! | `CntFwd` | `Method`, `Keys` (a request `Int`, `IntArray`, `FloatArray` (counted per position) or `Keys`), `Threshold` (a number ≥ 1, `"members"` or `"majority"`), `Destinations` (`server` (default), `clients`, `both`), `Count` (`test-and-set` (default), `accumulate`) |
//!
//! Every primitive key is optional and holds an array of entries. Every
//! `Field` / `Keys` names a field of the method's request message and
//! `Result` one of its response message (declared or JSON name), a
//! singular field whose type is an IEDT. For a float stream the
//! `Stream.modify` parameter applies to the fixed-point values (with
//! `Precision` 3, `add 1500` adds 1.5).
//!
//! The data plane holds one clear policy, one modify operation and one way
//! of counting per application, so all `Map.clear` entries must give the
//! same `Policy`, all `Stream.modify` entries the same `Op` and
//! `Parameter`, and all `CntFwd` entries the same `Threshold`,
//! `Destinations` and `Count`. `Count: "test-and-set"` counts distinct
//! senders in a 32-bit bitmap, so a numeric threshold is at most 32 there.
//!
//! Any violation is a [`NetFilterError`] naming the JSON path (e.g.
//! `"Map.addTo"[0].Field`), the method and message involved and what was
//! expected.
//!
//! # Services
//!
//! [`TableSet`] records messages, not services: a service's methods come
//! as a [`ServiceSig`]. [`load_protos`] compiles `.proto` files into both,
//! [`services_of`] reads them from a `FileDescriptorSet`, and
//! [`select_service`] picks the one a NetFilter's `Service` names.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use prost_types::FileDescriptorSet;
use protoplane_schema::{Field, FieldFlags, Kind, Label, TableSet};
use serde_json::{Map, Value};

use crate::controller::Registration;
use crate::keys::Quantizer;
use crate::plan::{CachePolicy, ClearPolicy, MemberLoss};
use crate::switch::{CountMode, Destinations, ModifyOp};

/// The protobuf package of the IEDT messages.
pub const IEDT_PACKAGE: &str = "protoplane.inc";
/// `Memory` when the filter does not say.
pub const DEFAULT_MEMORY: u32 = 256;
/// The largest `Precision`.
pub const MAX_PRECISION: u32 = 9;
/// The largest numeric `CntFwd` threshold with test-and-set counting.
pub const MAX_TEST_AND_SET_THRESHOLD: u32 = 32;
/// The clear policy of a filter without `Map.clear`.
pub const DEFAULT_CLEAR: ClearPolicy = ClearPolicy::Copy;
/// The longest `AppName`.
pub const MAX_APP_NAME: usize = 48;

const TOP_KEYS: [&str; 11] = [
    "AppName",
    "Service",
    "Precision",
    "Memory",
    "Cache",
    "MemberLoss",
    "Map.addTo",
    "Map.get",
    "Map.clear",
    "Stream.modify",
    "CntFwd",
];

// ---------------------------------------------------------------------------
// IEDTs.

/// An INC-enabled data type: one of the messages of `protoplane.inc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Iedt {
    /// `IntArray { repeated sint64 values = 1; uint64 members = 2; }`
    /// (`members` may be left out)
    IntArray,
    /// `FloatArray { repeated double values = 1; uint64 members = 2; }`
    /// (`members` may be left out)
    FloatArray,
    /// `IntMap { map<int64, int64> entries = 1; }`
    IntMap,
    /// `StrIntMap { map<string, int64> entries = 1; }`
    StrIntMap,
    /// `IntFloatMap { map<int64, double> entries = 1; }`
    IntFloatMap,
    /// `StrFloatMap { map<string, double> entries = 1; }`
    StrFloatMap,
    /// `Int { int64 value = 1; }`
    Int,
    /// `Keys { repeated int64 ints = 1; repeated string strs = 2; }`
    Keys,
}

/// What field 1 (and 2) of an IEDT message must be.
enum Shape {
    /// `repeated <kind> = 1`.
    Repeated(Kind),
    /// `map<key, value> = 1`.
    Map(Kind, Kind),
    /// `<kind> = 1`, singular.
    Single(Kind),
    /// `repeated int64 = 1; repeated string = 2`.
    Keys,
}

impl Iedt {
    /// Every IEDT.
    pub const ALL: [Iedt; 8] = [
        Iedt::IntArray,
        Iedt::FloatArray,
        Iedt::IntMap,
        Iedt::StrIntMap,
        Iedt::IntFloatMap,
        Iedt::StrFloatMap,
        Iedt::Int,
        Iedt::Keys,
    ];

    /// The message's short name (`IntArray`).
    pub fn name(self) -> &'static str {
        match self {
            Iedt::IntArray => "IntArray",
            Iedt::FloatArray => "FloatArray",
            Iedt::IntMap => "IntMap",
            Iedt::StrIntMap => "StrIntMap",
            Iedt::IntFloatMap => "IntFloatMap",
            Iedt::StrFloatMap => "StrFloatMap",
            Iedt::Int => "Int",
            Iedt::Keys => "Keys",
        }
    }

    /// The message's full name (`protoplane.inc.IntArray`).
    pub fn message_name(self) -> &'static str {
        match self {
            Iedt::IntArray => "protoplane.inc.IntArray",
            Iedt::FloatArray => "protoplane.inc.FloatArray",
            Iedt::IntMap => "protoplane.inc.IntMap",
            Iedt::StrIntMap => "protoplane.inc.StrIntMap",
            Iedt::IntFloatMap => "protoplane.inc.IntFloatMap",
            Iedt::StrFloatMap => "protoplane.inc.StrFloatMap",
            Iedt::Int => "protoplane.inc.Int",
            Iedt::Keys => "protoplane.inc.Keys",
        }
    }

    /// The IEDT of a full message name (a leading dot is accepted).
    pub fn from_message_name(name: &str) -> Option<Iedt> {
        let name = name.strip_prefix('.').unwrap_or(name);
        Iedt::ALL.into_iter().find(|i| i.message_name() == name)
    }

    /// Values are floats (quantized by `Precision`).
    pub fn is_float(self) -> bool {
        matches!(self, Iedt::FloatArray | Iedt::IntFloatMap | Iedt::StrFloatMap)
    }

    /// A map (sparse keys).
    pub fn is_map(self) -> bool {
        matches!(self, Iedt::IntMap | Iedt::StrIntMap | Iedt::IntFloatMap | Iedt::StrFloatMap)
    }

    /// An array (element i has key i).
    pub fn is_array(self) -> bool {
        matches!(self, Iedt::IntArray | Iedt::FloatArray)
    }

    fn shape(self) -> Shape {
        match self {
            Iedt::IntArray => Shape::Repeated(Kind::SInt64),
            Iedt::FloatArray => Shape::Repeated(Kind::Double),
            Iedt::IntMap => Shape::Map(Kind::Int64, Kind::Int64),
            Iedt::StrIntMap => Shape::Map(Kind::String, Kind::Int64),
            Iedt::IntFloatMap => Shape::Map(Kind::Int64, Kind::Double),
            Iedt::StrFloatMap => Shape::Map(Kind::String, Kind::Double),
            Iedt::Int => Shape::Single(Kind::Int64),
            Iedt::Keys => Shape::Keys,
        }
    }

    /// Whether message `index` of `tables` has this IEDT's fields.
    fn matches(self, tables: &TableSet, index: u32) -> bool {
        let fields = tables.fields(tables.message(index));
        let plain = |f: &Field, number: u32, kind: Kind, label: Label| {
            f.number == number
                && f.kind == kind
                && f.label == label
                && !f.flags.has(FieldFlags::MAP)
                && !f.flags.has(FieldFlags::ONEOF)
        };
        match (self.shape(), fields) {
            (Shape::Repeated(kind), [f]) => plain(f, 1, kind, Label::Repeated),
            // `members`, set in an aggregation result over fewer than every
            // member (`MemberLoss: continue`).
            (Shape::Repeated(kind), [f, m]) => {
                plain(f, 1, kind, Label::Repeated) && plain(m, 2, Kind::UInt64, Label::Optional)
            }
            (Shape::Single(kind), [f]) => plain(f, 1, kind, Label::Optional),
            (Shape::Keys, [a, b]) => {
                plain(a, 1, Kind::Int64, Label::Repeated)
                    && plain(b, 2, Kind::String, Label::Repeated)
            }
            (Shape::Map(key, value), [f]) => {
                if f.number != 1 || !f.flags.has(FieldFlags::MAP) || f.kind != Kind::Message {
                    return false;
                }
                match tables.fields(tables.message(f.sub)) {
                    [k, v] => k.number == 1 && k.kind == key && v.number == 2 && v.kind == value,
                    _ => false,
                }
            }
            _ => false,
        }
    }
}

impl fmt::Display for Iedt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message_name())
    }
}

/// The IEDT the type of field `field` (a field number) of message
/// `message_index` is, whatever the field's cardinality; `None` when the
/// field does not exist, is not a message, or its message is not a
/// `protoplane.inc` type with the fields of `protos/protoplane/inc.proto`.
pub fn iedt_of(tables: &TableSet, message_index: u32, field: u32) -> Option<Iedt> {
    if message_index as usize >= tables.messages().len() {
        return None;
    }
    let f = tables.field_by_number(tables.message(message_index), field)?;
    field_iedt(tables, f).ok()
}

/// Why a field is not an IEDT.
enum NotIedt {
    /// Not a message of `protoplane.inc`.
    Other,
    /// Named like one, but its fields differ from `inc.proto`'s.
    Misshapen(Iedt),
}

fn field_iedt(tables: &TableSet, f: &Field) -> std::result::Result<Iedt, NotIedt> {
    if f.kind != Kind::Message || f.flags.has(FieldFlags::MAP) {
        return Err(NotIedt::Other);
    }
    let iedt = Iedt::from_message_name(tables.message_name(f.sub)).ok_or(NotIedt::Other)?;
    if iedt.matches(tables, f.sub) {
        Ok(iedt)
    } else {
        Err(NotIedt::Misshapen(iedt))
    }
}

// ---------------------------------------------------------------------------
// Services.

/// A service: its full name and methods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceSig {
    /// Full name (`wordcount.WordCount`).
    pub name: String,
    /// Methods, in declaration order.
    pub methods: Vec<MethodSig>,
}

/// One method of a service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MethodSig {
    /// Method name (`Count`).
    pub name: String,
    /// The request message's full name, without a leading dot.
    pub input: String,
    /// The response message's full name, without a leading dot.
    pub output: String,
}

impl ServiceSig {
    /// A method by name.
    pub fn method(&self, name: &str) -> Option<&MethodSig> {
        self.methods.iter().find(|m| m.name == name)
    }

    /// The unqualified name (`WordCount`).
    pub fn short_name(&self) -> &str {
        self.name.rsplit('.').next().unwrap_or(&self.name)
    }
}

/// Every service declared in a `FileDescriptorSet`, in file order.
pub fn services_of(set: &FileDescriptorSet) -> Vec<ServiceSig> {
    let strip = |s: &str| s.strip_prefix('.').unwrap_or(s).to_owned();
    let mut out = Vec::new();
    for file in &set.file {
        for s in &file.service {
            let name = match file.package() {
                "" => s.name().to_owned(),
                p => format!("{p}.{}", s.name()),
            };
            let methods = s
                .method
                .iter()
                .map(|m| MethodSig {
                    name: m.name().to_owned(),
                    input: strip(m.input_type()),
                    output: strip(m.output_type()),
                })
                .collect();
            out.push(ServiceSig { name, methods });
        }
    }
    out
}

/// Compiles `.proto` files (with `includes` as import roots, like `-I`)
/// into the schema tables and the services they declare.
pub fn load_protos(
    files: &[impl AsRef<Path>],
    includes: &[impl AsRef<Path>],
) -> std::result::Result<(TableSet, Vec<ServiceSig>), NetFilterError> {
    let schema =
        |e: protoplane_schema::SchemaError| NetFilterError::new("", format!("schema: {e}"));
    let set = protoplane_schema::compile_protos(files, includes).map_err(schema)?;
    let tables = TableSet::from_file_descriptor_set(&set).map_err(schema)?;
    Ok((tables, services_of(&set)))
}

/// The IEDT package, for schemas compiled from text
/// (`protoplane/inc.proto`).
pub const INC_PROTO: &str = include_str!("../../../protos/protoplane/inc.proto");

/// Compiles `.proto` texts — (import name, text); `protoplane/inc.proto` is
/// provided — into tables and services.
pub fn load_sources(
    sources: &[(&str, &str)],
) -> std::result::Result<(TableSet, Vec<ServiceSig>), NetFilterError> {
    let schema =
        |e: protoplane_schema::SchemaError| NetFilterError::new("", format!("schema: {e}"));
    let mut all =
        vec![protoplane_schema::ProtoSource { name: "protoplane/inc.proto", text: INC_PROTO }];
    all.extend(sources.iter().map(|(name, text)| protoplane_schema::ProtoSource { name, text }));
    let roots: Vec<&str> = sources.iter().map(|(n, _)| *n).collect();
    let set = protoplane_schema::compile_proto_sources(&all, &roots).map_err(schema)?;
    let tables = TableSet::from_file_descriptor_set(&set).map_err(schema)?;
    Ok((tables, services_of(&set)))
}

/// The service a NetFilter is for: the one its `Service` names (full or
/// unqualified name), or the only service of the schema when it names none.
pub fn select_service<'a>(
    services: &'a [ServiceSig],
    json: &str,
) -> std::result::Result<&'a ServiceSig, NetFilterError> {
    let doc = parse_object(json)?;
    let list = || services.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ");
    match doc.get("Service") {
        None => match services {
            [] => Err(NetFilterError::new("", "the schema declares no services")),
            [one] => Ok(one),
            _ => Err(NetFilterError::new(
                "Service",
                format!(
                    "missing; the schema declares {} services ({}): say which one this filter is for",
                    services.len(),
                    list()
                ),
            )),
        },
        Some(Value::String(name)) => {
            if let Some(s) = services.iter().find(|s| &s.name == name) {
                return Ok(s);
            }
            let short: Vec<&ServiceSig> =
                services.iter().filter(|s| s.short_name() == name).collect();
            match short.as_slice() {
                [one] => Ok(one),
                [] if services.is_empty() => Err(NetFilterError::new(
                    "Service",
                    format!("{name:?}: the schema declares no services"),
                )),
                [] => Err(NetFilterError::new(
                    "Service",
                    format!("no service {name:?} in the schema (services: {})", list()),
                )),
                _ => Err(NetFilterError::new(
                    "Service",
                    format!(
                        "{name:?} is ambiguous ({}): give the full name",
                        short.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ")
                    ),
                )),
            }
        }
        Some(other) => Err(NetFilterError::new(
            "Service",
            format!("expected a string, got {}", json_type(other)),
        )),
    }
}

// ---------------------------------------------------------------------------
// The filter.

/// An IEDT field a rule refers to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldRef {
    /// Index of the message (request or response) holding the field.
    pub message: u32,
    /// The field's declared name.
    pub name: String,
    /// The field's number.
    pub number: u32,
    /// Its type.
    pub iedt: Iedt,
}

/// `Map.addTo`: aggregate a request field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldRule {
    /// Method name.
    pub method: String,
    /// The request's array or map IEDT.
    pub field: FieldRef,
}

/// `Map.get`: read aggregated values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GetRule {
    /// Method name.
    pub method: String,
    /// The request's `protoplane.inc.Keys`.
    pub keys: FieldRef,
    /// The response's map IEDT that receives the values.
    pub result: FieldRef,
}

/// `Map.clear`: how a method's aggregation slots are made ready again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClearRule {
    /// Method name.
    pub method: String,
    /// The policy.
    pub policy: ClearPolicy,
}

/// `Stream.modify`: an operation applied to a stream's values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModifyRule {
    /// Method name.
    pub method: String,
    /// The request's integer (or, with `Precision`, float) IEDT.
    pub field: FieldRef,
    /// The operation.
    pub op: ModifyOp,
    /// Its parameter (for float streams: in fixed point).
    pub parameter: i32,
}

/// A `CntFwd` threshold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Threshold {
    /// A fixed count (≥ 1).
    Count(u32),
    /// The application's number of members (synchronous aggregation).
    Members,
    /// More than half of the members (agreement).
    Majority,
}

impl Threshold {
    /// The number, given the application's members.
    pub fn resolve(self, members: u32) -> u32 {
        match self {
            Threshold::Count(n) => n,
            Threshold::Members => members,
            Threshold::Majority => members / 2 + 1,
        }
    }
}

/// `CntFwd`: count keys and forward what reaches the threshold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CntFwdRule {
    /// Method name.
    pub method: String,
    /// The request's `Int`, `IntArray` or `Keys` field counted.
    pub keys: FieldRef,
    /// The threshold.
    pub threshold: Threshold,
    /// Where what reached the threshold goes.
    pub destinations: Destinations,
    /// How senders are counted.
    pub count: CountMode,
}

/// A parsed and validated NetFilter.
#[derive(Clone, Debug, PartialEq)]
pub struct NetFilter {
    /// `AppName`.
    pub app_name: String,
    /// The service's full name.
    pub service: String,
    /// `Precision`: decimal digits kept for floats.
    pub precision: Option<u32>,
    /// `Memory`: register indices wanted.
    pub memory: u32,
    /// `Cache`.
    pub cache: CachePolicy,
    /// `MemberLoss`.
    pub member_loss: MemberLoss,
    /// `Map.addTo`.
    pub add_to: Vec<FieldRule>,
    /// `Map.get`.
    pub get: Vec<GetRule>,
    /// `Map.clear`.
    pub clear: Vec<ClearRule>,
    /// `Stream.modify`.
    pub modify: Vec<ModifyRule>,
    /// `CntFwd`.
    pub cnt_fwd: Vec<CntFwdRule>,
}

/// A NetFilter that does not parse or does not fit its service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetFilterError {
    /// The JSON path (`"Map.addTo"[0].Field`); empty for the whole document.
    pub path: String,
    /// What is wrong and what was expected.
    pub message: String,
}

impl NetFilterError {
    fn new(path: impl Into<String>, message: impl Into<String>) -> NetFilterError {
        NetFilterError { path: path.into(), message: message.into() }
    }
}

impl fmt::Display for NetFilterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for NetFilterError {}

type Result<T> = std::result::Result<T, NetFilterError>;

impl NetFilter {
    /// Parses `json` and checks it against `service` and the messages of
    /// `tables`.
    pub fn parse(json: &str, service: &ServiceSig, tables: &TableSet) -> Result<NetFilter> {
        let doc = parse_object(json)?;
        for key in doc.keys() {
            if !TOP_KEYS.contains(&key.as_str()) {
                return Err(NetFilterError::new(
                    key_path(key),
                    format!("unknown key; a NetFilter takes {}", TOP_KEYS.join(", ")),
                ));
            }
        }
        let app_name = app_name(doc.get("AppName"))?;
        if let Some(v) = doc.get("Service") {
            let Value::String(name) = v else {
                return Err(NetFilterError::new(
                    "Service",
                    format!("expected a string, got {}", json_type(v)),
                ));
            };
            if *name != service.name && name != service.short_name() {
                return Err(NetFilterError::new(
                    "Service",
                    format!(
                        "{name:?} is not the service this filter is checked against ({})",
                        service.name
                    ),
                ));
            }
        }
        let precision = match doc.get("Precision") {
            None => None,
            Some(v) => Some(integer_in("Precision", v, 0, i64::from(MAX_PRECISION))? as u32),
        };
        let memory = match doc.get("Memory") {
            None => DEFAULT_MEMORY,
            Some(v) => integer_in("Memory", v, 1, i64::from(u32::MAX))? as u32,
        };
        let cache = named(
            &doc,
            ("Cache", "cache policy", "periodic-counting, fcfs, hashing"),
            CachePolicy::parse,
        )?
        .unwrap_or(CachePolicy::PeriodicCounting);
        let member_loss =
            named(&doc, ("MemberLoss", "member-loss policy", "fail, continue"), MemberLoss::parse)?
                .unwrap_or_default();
        let cx = Cx { service, tables, precision };
        Ok(NetFilter {
            app_name,
            service: service.name.clone(),
            precision,
            memory,
            cache,
            member_loss,
            add_to: cx.add_to(&doc)?,
            get: cx.get(&doc)?,
            clear: cx.clear(&doc)?,
            modify: cx.modify(&doc)?,
            cnt_fwd: cx.cnt_fwd(&doc)?,
        })
    }

    /// The clear policy of the application ([`DEFAULT_CLEAR`] without
    /// `Map.clear`).
    pub fn clear_policy(&self) -> ClearPolicy {
        self.clear.first().map_or(DEFAULT_CLEAR, |c| c.policy)
    }

    /// The application's `Stream.modify` operation, if any.
    pub fn modify_op(&self) -> Option<(ModifyOp, i32)> {
        self.modify.first().map(|m| (m.op, m.parameter))
    }

    /// The application's `CntFwd` counting, if any.
    pub fn counting(&self) -> Option<(Threshold, Destinations, CountMode)> {
        self.cnt_fwd.first().map(|c| (c.threshold, c.destinations, c.count))
    }

    /// The float quantizer (with `Precision`).
    pub fn quantizer(&self) -> Option<Quantizer> {
        self.precision.map(Quantizer::new)
    }

    /// What to ask the controller for: an instance `name` of this
    /// application with `members` members and `flows_per_member` flows each.
    pub fn registration(&self, name: &str, members: u16, flows_per_member: u16) -> Registration {
        let (threshold, forward, count) = self.counting().unwrap_or((
            Threshold::Members,
            Destinations::Members,
            CountMode::TestAndSet,
        ));
        Registration {
            name: name.to_string(),
            server: 0,
            members,
            flows_per_member,
            memory: self.memory,
            clear: self.clear_policy(),
            cache: self.cache,
            threshold: threshold.resolve(u32::from(members)),
            forward,
            count,
            modify: self.modify_op(),
            key_bits: 32,
            member_loss: self.member_loss,
        }
    }

    /// Whether any rule uses a float IEDT.
    pub fn uses_floats(&self) -> bool {
        self.add_to.iter().any(|r| r.field.iedt.is_float())
            || self.get.iter().any(|r| r.result.iedt.is_float())
            || self.modify.iter().any(|r| r.field.iedt.is_float())
    }
}

// ---------------------------------------------------------------------------
// Validation.

/// Request or response.
#[derive(Clone, Copy)]
enum Side {
    Request,
    Response,
}

/// The validation context.
struct Cx<'a> {
    service: &'a ServiceSig,
    tables: &'a TableSet,
    precision: Option<u32>,
}

/// One entry of a primitive's array.
struct Entry<'v> {
    /// `"Map.addTo"[0]`.
    path: String,
    /// The primitive (`Map.addTo`).
    primitive: &'static str,
    obj: &'v Map<String, Value>,
}

impl Entry<'_> {
    fn at(&self, key: &str) -> String {
        format!("{}.{key}", self.path)
    }

    /// A required string member.
    fn str(&self, key: &str, what: &str) -> Result<&str> {
        match self.obj.get(key) {
            None => Err(NetFilterError::new(self.at(key), format!("missing ({what})"))),
            Some(v) => string(&self.at(key), v),
        }
    }

    /// An optional string member.
    fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        self.obj.get(key).map(|v| string(&self.at(key), v)).transpose()
    }
}

const ADD_TO: &[Iedt] = &[
    Iedt::IntArray,
    Iedt::FloatArray,
    Iedt::IntMap,
    Iedt::StrIntMap,
    Iedt::IntFloatMap,
    Iedt::StrFloatMap,
];
const MAPS: &[Iedt] = &[Iedt::IntMap, Iedt::StrIntMap, Iedt::IntFloatMap, Iedt::StrFloatMap];
const KEYS: &[Iedt] = &[Iedt::Keys];
const STREAMS: &[Iedt] = &[
    Iedt::Int,
    Iedt::IntArray,
    Iedt::IntMap,
    Iedt::StrIntMap,
    Iedt::FloatArray,
    Iedt::IntFloatMap,
    Iedt::StrFloatMap,
];
const VOTES: &[Iedt] = &[Iedt::Int, Iedt::IntArray, Iedt::FloatArray, Iedt::Keys];

impl<'a> Cx<'a> {
    /// The entries of primitive `key`, with the members they may have.
    fn entries<'v>(
        &self,
        doc: &'v Map<String, Value>,
        primitive: &'static str,
        allowed: &[&str],
    ) -> Result<Vec<Entry<'v>>> {
        let Some(v) = doc.get(primitive) else { return Ok(Vec::new()) };
        let Value::Array(items) = v else {
            return Err(NetFilterError::new(
                key_path(primitive),
                format!("expected an array of entries, got {}", json_type(v)),
            ));
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let path = format!("{}[{i}]", key_path(primitive));
            let Value::Object(obj) = item else {
                return Err(NetFilterError::new(
                    path,
                    format!("expected an object, got {}", json_type(item)),
                ));
            };
            for k in obj.keys() {
                if !allowed.contains(&k.as_str()) {
                    return Err(NetFilterError::new(
                        format!("{path}.{}", key_path(k)),
                        format!("unknown key; {primitive} entries take {}", allowed.join(", ")),
                    ));
                }
            }
            out.push(Entry { path, primitive, obj });
        }
        Ok(out)
    }

    /// The entry's `Method`.
    fn method(&self, e: &Entry<'_>) -> Result<&'a MethodSig> {
        let name = e.str("Method", "the name of a method of the service")?;
        self.service.method(name).ok_or_else(|| {
            let list = self.service.methods.iter().map(|m| m.name.as_str()).collect::<Vec<_>>();
            let list = if list.is_empty() { "none".to_owned() } else { list.join(", ") };
            NetFilterError::new(
                e.at("Method"),
                format!(
                    "the service {} has no method {name:?} (methods: {list})",
                    self.service.name
                ),
            )
        })
    }

    /// Resolves member `key` of an entry: a singular field of the method's
    /// request (or response) message whose type is one of `allowed`.
    fn field(
        &self,
        e: &Entry<'_>,
        key: &str,
        method: &MethodSig,
        side: Side,
        allowed: &[Iedt],
        expected: &str,
    ) -> Result<FieldRef> {
        let path = e.at(key);
        let (msg_name, role) = match side {
            Side::Request => (&method.input, "request"),
            Side::Response => (&method.output, "response"),
        };
        let what = match side {
            Side::Request => format!("a field of {msg_name}, the request of {}", method.name),
            Side::Response => format!("a field of {msg_name}, the response of {}", method.name),
        };
        let name = e.str(key, &what)?;
        let Some(index) = self.tables.message_by_name(msg_name) else {
            return Err(NetFilterError::new(
                path,
                format!(
                    "the {role} type {msg_name} of method {} is not in the schema tables",
                    method.name
                ),
            ));
        };
        let msg = self.tables.message(index);
        let Some(f) = self.tables.field_by_name(msg, name) else {
            let fields = self
                .tables
                .fields(msg)
                .iter()
                .map(|f| format!("{} ({})", self.tables.str(f.name), self.describe(f)))
                .collect::<Vec<_>>();
            let fields = if fields.is_empty() { "none".to_owned() } else { fields.join(", ") };
            return Err(NetFilterError::new(
                path,
                format!(
                    "{msg_name} ({role} of {}) has no field {name:?}; its fields: {fields}",
                    method.name
                ),
            ));
        };
        let fname = self.tables.str(f.name);
        let subject = format!("{fname} of {msg_name} ({role} of {})", method.name);
        let iedt = match field_iedt(self.tables, f) {
            Ok(i) => i,
            Err(NotIedt::Misshapen(i)) => {
                return Err(NetFilterError::new(
                    path,
                    format!(
                        "{subject} is a {i} whose fields differ from protos/protoplane/inc.proto; \
                         import that file rather than declaring the type"
                    ),
                ))
            }
            Err(NotIedt::Other) => {
                return Err(NetFilterError::new(
                    path,
                    format!(
                        "{subject} is {}, not an IEDT; {}'s {key} must be {expected}",
                        self.describe_a(f),
                        e.primitive
                    ),
                ))
            }
        };
        if f.is_repeated() {
            return Err(NetFilterError::new(
                path,
                format!("{subject} is a repeated {iedt}; an IEDT field must be singular"),
            ));
        }
        if !allowed.contains(&iedt) {
            return Err(NetFilterError::new(
                path,
                format!("{subject} is a {iedt}; {}'s {key} must be {expected}", e.primitive),
            ));
        }
        if iedt.is_float() && self.precision.is_none() {
            return Err(NetFilterError::new(
                path,
                format!(
                    "{subject} is a {iedt}: floats need \"Precision\" (decimal digits kept, 0 to {MAX_PRECISION})"
                ),
            ));
        }
        Ok(FieldRef { message: index, name: fname.to_owned(), number: f.number, iedt })
    }

    /// A field's type as `.proto` spells it.
    fn describe(&self, f: &Field) -> String {
        let base = |f: &Field| match f.kind {
            Kind::Message | Kind::Group => self.tables.message_name(f.sub).to_owned(),
            Kind::Enum => self.tables.str(self.tables.enum_type(f.sub).name).to_owned(),
            k => k.proto_name().to_owned(),
        };
        if f.flags.has(FieldFlags::MAP) {
            if let [k, v] = self.tables.fields(self.tables.message(f.sub)) {
                return format!("map<{}, {}>", base(k), base(v));
            }
        }
        if f.is_repeated() {
            format!("repeated {}", base(f))
        } else {
            base(f)
        }
    }

    /// [`Cx::describe`] with an article.
    fn describe_a(&self, f: &Field) -> String {
        let d = self.describe(f);
        if f.flags.has(FieldFlags::MAP) {
            return d;
        }
        let vowel = d.starts_with(['a', 'e', 'i', 'o', 'u', 'A', 'E', 'I', 'O', 'U']);
        format!("{} {d}", if vowel { "an" } else { "a" })
    }

    fn add_to(&self, doc: &Map<String, Value>) -> Result<Vec<FieldRule>> {
        let mut out: Vec<FieldRule> = Vec::new();
        let mut seen = Seen::default();
        for e in self.entries(doc, "Map.addTo", &["Method", "Field"])? {
            let m = self.method(&e)?;
            let field = self.field(&e, "Field", m, Side::Request, ADD_TO, ARRAY_OR_MAP)?;
            seen.check(&e, m, &field.name, "Field")?;
            out.push(FieldRule { method: m.name.clone(), field });
        }
        Ok(out)
    }

    fn get(&self, doc: &Map<String, Value>) -> Result<Vec<GetRule>> {
        let mut out = Vec::new();
        let mut seen = Seen::default();
        for e in self.entries(doc, "Map.get", &["Method", "Keys", "Result"])? {
            let m = self.method(&e)?;
            let keys = self.field(&e, "Keys", m, Side::Request, KEYS, "a protoplane.inc.Keys")?;
            let result = self.field(&e, "Result", m, Side::Response, MAPS, A_MAP)?;
            seen.check(&e, m, &result.name, "Result")?;
            out.push(GetRule { method: m.name.clone(), keys, result });
        }
        Ok(out)
    }

    fn clear(&self, doc: &Map<String, Value>) -> Result<Vec<ClearRule>> {
        let mut out: Vec<ClearRule> = Vec::new();
        let mut first: HashMap<&str, String> = HashMap::new();
        for e in self.entries(doc, "Map.clear", &["Method", "Policy"])? {
            let m = self.method(&e)?;
            let name = e.str("Policy", "copy, shadow or lazy")?;
            let policy = ClearPolicy::parse(name).ok_or_else(|| {
                NetFilterError::new(
                    e.at("Policy"),
                    format!("unknown clear policy {name:?}; one of copy, shadow, lazy"),
                )
            })?;
            if let Some(at) = first.get(m.name.as_str()) {
                return Err(NetFilterError::new(
                    e.at("Method"),
                    format!(
                        "{} already has a clear policy (at {at}); at most one per method",
                        m.name
                    ),
                ));
            }
            if let Some(prev) = out.first() {
                if prev.policy != policy {
                    return Err(NetFilterError::new(
                        e.at("Policy"),
                        format!(
                            "{} differs from {} at {}; the data plane clears all of an application's slots one way",
                            policy.name(),
                            prev.policy.name(),
                            first.get(prev.method.as_str()).map_or("", String::as_str)
                        ),
                    ));
                }
            }
            first.insert(&m.name, e.path.clone());
            out.push(ClearRule { method: m.name.clone(), policy });
        }
        Ok(out)
    }

    fn modify(&self, doc: &Map<String, Value>) -> Result<Vec<ModifyRule>> {
        let mut out: Vec<ModifyRule> = Vec::new();
        let mut seen = Seen::default();
        let mut first_path = String::new();
        for e in self.entries(doc, "Stream.modify", &["Method", "Field", "Op", "Parameter"])? {
            let m = self.method(&e)?;
            let field = self.field(&e, "Field", m, Side::Request, STREAMS, STREAM)?;
            seen.check(&e, m, &field.name, "Field")?;
            let op_name = e.str("Op", OPS)?;
            let op = ModifyOp::parse(op_name).ok_or_else(|| {
                NetFilterError::new(
                    e.at("Op"),
                    format!("unknown operation {op_name:?}; one of {OPS}"),
                )
            })?;
            let Some(v) = e.obj.get("Parameter") else {
                return Err(NetFilterError::new(
                    e.at("Parameter"),
                    format!("missing (the {op_name} operand, a 32-bit integer)"),
                ));
            };
            let p = integer(&e.at("Parameter"), v)?;
            let parameter = i32::try_from(p).map_err(|_| {
                NetFilterError::new(
                    e.at("Parameter"),
                    format!("{p} does not fit a 32-bit register ({} to {})", i32::MIN, i32::MAX),
                )
            })?;
            if matches!(op, ModifyOp::Shl | ModifyOp::Shr) && !(0..=31).contains(&parameter) {
                return Err(NetFilterError::new(
                    e.at("Parameter"),
                    format!("{op_name} shifts by 0 to 31 bits, got {parameter}"),
                ));
            }
            if let Some(prev) = out.first() {
                if (prev.op, prev.parameter) != (op, parameter) {
                    return Err(NetFilterError::new(
                        e.path.clone(),
                        format!(
                            "{op_name} {parameter} differs from {} {} at {first_path}; the data plane applies one operation to all of an application's values",
                            prev.op.name(),
                            prev.parameter
                        ),
                    ));
                }
            } else {
                first_path = e.path.clone();
            }
            out.push(ModifyRule { method: m.name.clone(), field, op, parameter });
        }
        Ok(out)
    }

    fn cnt_fwd(&self, doc: &Map<String, Value>) -> Result<Vec<CntFwdRule>> {
        let mut out: Vec<CntFwdRule> = Vec::new();
        let mut seen = Seen::default();
        let mut first_path = String::new();
        let allowed = ["Method", "Keys", "Threshold", "Destinations", "Count"];
        for e in self.entries(doc, "CntFwd", &allowed)? {
            let m = self.method(&e)?;
            let keys = self.field(&e, "Keys", m, Side::Request, VOTES, VOTE)?;
            seen.check(&e, m, &keys.name, "Keys")?;
            let count = match e.opt_str("Count")? {
                None | Some("test-and-set") => CountMode::TestAndSet,
                Some("accumulate") => CountMode::Accumulate,
                Some(other) => {
                    return Err(NetFilterError::new(
                        e.at("Count"),
                        format!("unknown counting {other:?}; one of test-and-set, accumulate"),
                    ))
                }
            };
            let threshold = match e.obj.get("Threshold") {
                None => {
                    return Err(NetFilterError::new(
                        e.at("Threshold"),
                        "missing (a number of at least 1, \"members\" or \"majority\")",
                    ))
                }
                Some(Value::String(s)) if s == "members" => Threshold::Members,
                Some(Value::String(s)) if s == "majority" => Threshold::Majority,
                Some(Value::String(s)) => {
                    return Err(NetFilterError::new(
                        e.at("Threshold"),
                        format!(
                        "expected a number of at least 1, \"members\" or \"majority\", got {s:?}"
                    ),
                    ))
                }
                Some(v) => {
                    let path = e.at("Threshold");
                    let n = integer_in(&path, v, 1, i64::from(u32::MAX))? as u32;
                    if count == CountMode::TestAndSet && n > MAX_TEST_AND_SET_THRESHOLD {
                        return Err(NetFilterError::new(
                            path,
                            format!(
                                "{n} is more than test-and-set counting can reach (distinct senders, at most {MAX_TEST_AND_SET_THRESHOLD})"
                            ),
                        ));
                    }
                    Threshold::Count(n)
                }
            };
            let destinations = match e.opt_str("Destinations")? {
                None | Some("server") => Destinations::Server,
                Some("clients") => Destinations::Members,
                Some("both") => Destinations::Both,
                Some(other) => {
                    return Err(NetFilterError::new(
                        e.at("Destinations"),
                        format!("unknown destinations {other:?}; one of server, clients, both"),
                    ))
                }
            };
            if let Some(prev) = out.first() {
                if (prev.threshold, prev.destinations, prev.count)
                    != (threshold, destinations, count)
                {
                    return Err(NetFilterError::new(
                        e.path.clone(),
                        format!(
                            "{} differs from {} at {first_path}; the data plane counts one way per application",
                            counting_label(threshold, destinations, count),
                            counting_label(prev.threshold, prev.destinations, prev.count)
                        ),
                    ));
                }
            } else {
                first_path = e.path.clone();
            }
            out.push(CntFwdRule { method: m.name.clone(), keys, threshold, destinations, count });
        }
        Ok(out)
    }
}

const ARRAY_OR_MAP: &str = "an array or map IEDT (protoplane.inc.IntArray, FloatArray, IntMap, \
                            StrIntMap, IntFloatMap or StrFloatMap)";
const A_MAP: &str = "a map IEDT (protoplane.inc.IntMap, StrIntMap, IntFloatMap or StrFloatMap)";
const STREAM: &str = "an integer IEDT (protoplane.inc.Int, IntArray, IntMap or StrIntMap) or, \
                      with Precision, a float one (FloatArray, IntFloatMap or StrFloatMap)";
const VOTE: &str = "a protoplane.inc.Int, IntArray, FloatArray (counted per position) or Keys";
const OPS: &str = "add, max, min, and, or, shl, shr";

/// The (method, field) pairs a primitive has seen.
#[derive(Default)]
struct Seen(HashMap<(String, String), String>);

impl Seen {
    fn check(&mut self, e: &Entry<'_>, m: &MethodSig, field: &str, key: &str) -> Result<()> {
        let k = (m.name.clone(), field.to_owned());
        if let Some(at) = self.0.get(&k) {
            return Err(NetFilterError::new(
                e.at(key),
                format!(
                    "{} of {}.{field} is already given at {at}; one entry per method and field",
                    e.primitive, m.name
                ),
            ));
        }
        self.0.insert(k, e.path.clone());
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// JSON helpers.

fn parse_object(json: &str) -> Result<Map<String, Value>> {
    match serde_json::from_str::<Value>(json) {
        Err(e) => Err(NetFilterError::new("", format!("not valid JSON: {e}"))),
        Ok(Value::Object(map)) => Ok(map),
        Ok(v) => Err(NetFilterError::new(
            "",
            format!("a NetFilter is a JSON object, got {}", json_type(&v)),
        )),
    }
}

/// A top-level key as a path: bare when it is an identifier, quoted else.
fn key_path(key: &str) -> String {
    if !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        key.to_owned()
    } else {
        format!("{key:?}")
    }
}

fn json_type(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("a boolean ({b})"),
        Value::Number(n) => format!("a number ({n})"),
        Value::String(s) => format!("a string ({s:?})"),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// An optional top-level key holding one of a set of names: `(key, what
/// it is, the names)` and the parser of a name.
fn named<T>(
    doc: &Map<String, Value>,
    (key, what, names): (&str, &str, &str),
    parse: impl Fn(&str) -> Option<T>,
) -> Result<Option<T>> {
    let Some(v) = doc.get(key) else { return Ok(None) };
    let s = string(key, v)?;
    match parse(s) {
        Some(t) => Ok(Some(t)),
        None => Err(NetFilterError::new(key, format!("unknown {what} {s:?}; one of {names}"))),
    }
}

fn string<'v>(path: &str, v: &'v Value) -> Result<&'v str> {
    match v {
        Value::String(s) => Ok(s),
        other => {
            Err(NetFilterError::new(path, format!("expected a string, got {}", json_type(other))))
        }
    }
}

fn integer(path: &str, v: &Value) -> Result<i64> {
    match v.as_i64() {
        Some(n) => Ok(n),
        None => {
            Err(NetFilterError::new(path, format!("expected an integer, got {}", json_type(v))))
        }
    }
}

fn integer_in(path: &str, v: &Value, lo: i64, hi: i64) -> Result<i64> {
    match v.as_i64() {
        Some(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(NetFilterError::new(
            path,
            format!("expected an integer from {lo} to {hi}, got {}", json_type(v)),
        )),
    }
}

fn app_name(v: Option<&Value>) -> Result<String> {
    const RULE: &str = "1 to 48 characters of [A-Za-z0-9_.-]";
    let Some(v) = v else {
        return Err(NetFilterError::new(
            "AppName",
            format!("missing (the application's name, {RULE})"),
        ));
    };
    let name = string("AppName", v)?;
    if name.is_empty() {
        return Err(NetFilterError::new("AppName", format!("empty; give {RULE}")));
    }
    if let Some((i, c)) = name
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(NetFilterError::new(
            "AppName",
            format!("{name:?} has {c:?} at byte {i}; give {RULE}"),
        ));
    }
    if name.len() > MAX_APP_NAME {
        return Err(NetFilterError::new(
            "AppName",
            format!("{name:?} is {} characters long; give {RULE}", name.len()),
        ));
    }
    Ok(name.to_owned())
}

fn counting_label(t: Threshold, d: Destinations, c: CountMode) -> String {
    let t = match t {
        Threshold::Count(n) => n.to_string(),
        Threshold::Members => "\"members\"".into(),
        Threshold::Majority => "\"majority\"".into(),
    };
    let d = match d {
        Destinations::Server => "server",
        Destinations::Members => "clients",
        Destinations::Both => "both",
    };
    format!("Threshold {t}, Destinations {d}, Count {}", c.name())
}
