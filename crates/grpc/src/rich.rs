//! The rich error model: machine-readable details beside a status's code
//! and message.
//!
//! gRPC carries them as one serialized `google.rpc.Status` (code, message,
//! repeated `google.protobuf.Any`) in the `grpc-status-details-bin`
//! trailer; every major implementation reads and writes the same bytes
//! (grpc-go's `status.WithDetails`, tonic-types' `StatusExt`, gRPC C++'s
//! `grpc::Status` details). A [`Status`] keeps those bytes as received
//! ([`Status::details`]); the helpers here pack and unpack them:
//!
//! * [`Any`]: one packed detail of any type (type URL and encoded bytes);
//! * the standard details of `google.rpc` (`error_details.proto`) as plain
//!   structs — [`ErrorInfo`], [`RetryInfo`], [`DebugInfo`],
//!   [`QuotaFailure`], [`PreconditionFailure`], [`BadRequest`],
//!   [`RequestInfo`], [`ResourceInfo`], [`Help`], [`LocalizedMessage`] —
//!   each one an [`ErrorDetail`] variant;
//! * [`ErrorDetails`], at most one of each standard detail, in the shape
//!   tonic-types users know: `Status::with_error_details(code, message,
//!   ErrorDetails::with_bad_request_violation("name", "required"))` on the
//!   server, `status.error_details().bad_request` on the client.
//!
//! ```
//! use protoplane_grpc::rich::{BadRequest, ErrorDetails};
//! use protoplane_grpc::{Code, Status};
//!
//! let st = Status::with_error_details(
//!     Code::InvalidArgument,
//!     "bad name",
//!     ErrorDetails::with_bad_request_violation("name", "must not be empty"),
//! );
//! // ... sent, received ...
//! let details = st.check_error_details().expect("well-formed details");
//! let bad: BadRequest = details.bad_request.expect("a BadRequest detail");
//! assert_eq!(bad.field_violations[0].field, "name");
//! ```
//!
//! The messages are declared in protoplane's own `protos/google/rpc/*.proto`
//! and encoded and decoded by protoplane's wire engine through the dynamic
//! builder and views, the path any schema loaded at run time takes; the
//! tables are built once, on first use.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use protoplane_schema::{ProtoSource, TableSet};
use protoplane_wire::{
    BlockError, BuildError, Builder, Decoder, EncodeOptions, MessageBuilder, MessageView, Value,
};

use crate::call::Message;
use crate::status::{Code, Status};

const STATUS_PROTO: &str = include_str!("../../../protos/google/rpc/status.proto");
const DETAILS_PROTO: &str = include_str!("../../../protos/google/rpc/error_details.proto");

/// The prefix of the type URLs of packed messages.
pub const TYPE_URL_PREFIX: &str = "type.googleapis.com/";

/// Most bytes of details accepted from a peer (the whole trailer block is
/// bounded by the header list limit already; this bounds what a status
/// built locally from untrusted input may carry).
const MAX_DETAILS: usize = 1 << 20;

/// The tables of `google.rpc.Status` and the standard details, built once.
fn tables() -> Result<&'static TableSet, Status> {
    static TABLES: OnceLock<Result<Arc<TableSet>, String>> = OnceLock::new();
    let t = TABLES.get_or_init(|| {
        TableSet::from_proto_sources(
            &[
                ProtoSource { name: "google/rpc/status.proto", text: STATUS_PROTO },
                ProtoSource { name: "google/rpc/error_details.proto", text: DETAILS_PROTO },
            ],
            &["google/rpc/status.proto", "google/rpc/error_details.proto"],
        )
        .map(Arc::new)
        .map_err(|e| e.to_string())
    });
    match t {
        Ok(t) => Ok(t),
        Err(e) => Err(Status::new(Code::Internal, format!("google.rpc schemas: {e}"))),
    }
}

fn type_index(ts: &TableSet, name: &str) -> Result<u32, Status> {
    ts.message_by_name(name)
        .ok_or_else(|| Status::new(Code::Internal, format!("no message {name} in google.rpc")))
}

fn build_err(e: BuildError) -> Status {
    Status::new(Code::Internal, format!("building error details: {e}"))
}

fn block_err(e: BlockError) -> Status {
    Status::new(Code::Internal, format!("reading error details: {e}"))
}

/// Encodes the message `write` lays out as type `name`.
fn encode_with(
    name: &str,
    write: impl FnOnce(&mut Builder<'_>, MessageBuilder) -> Result<(), BuildError>,
) -> Result<Vec<u8>, Status> {
    let ts = tables()?;
    let ty = type_index(ts, name)?;
    let mut b = Builder::new(ts, ty).map_err(build_err)?;
    let root = b.root();
    write(&mut b, root).map_err(build_err)?;
    let block = b.finish();
    protoplane_wire::encode(ts, ty, block.as_bytes(), &EncodeOptions::default()).map_err(block_err)
}

/// Decodes `bytes` as type `name` (a view-mode [`Message`], as requests
/// are decoded) and reads it with `read`. Bytes that do not decode are an
/// error, never a panic: they come from a peer.
fn decode_with<T>(
    name: &str,
    bytes: Bytes,
    read: impl FnOnce(&MessageView<'_>) -> Result<T, BlockError>,
) -> Result<T, Status> {
    if bytes.len() > MAX_DETAILS {
        return Err(Status::new(Code::Internal, "error details too large"));
    }
    let ts = tables()?;
    let ty = type_index(ts, name)?;
    let m = Message::decode(ts, ty, bytes, &mut Decoder::new())
        .map_err(|e| Status::new(Code::Internal, format!("malformed {name}: {e}")))?;
    read(&m.view(ts)?).map_err(block_err)
}

// Field readers over a dynamic view: absent fields read as proto3 defaults.

fn string(v: &MessageView<'_>, number: u32) -> Result<String, BlockError> {
    Ok(match v.by_number(number)? {
        Some(x) => String::from_utf8_lossy(x.as_bytes().unwrap_or_default()).into_owned(),
        None => String::new(),
    })
}

fn strings(v: &MessageView<'_>, number: u32) -> Result<Vec<String>, BlockError> {
    let Some(f) = v.field(number) else { return Ok(Vec::new()) };
    v.repeated(f)?
        .iter()
        .map(|x| Ok(String::from_utf8_lossy(x?.as_bytes().unwrap_or_default()).into_owned()))
        .collect()
}

fn messages<'a, T>(
    v: &MessageView<'a>,
    number: u32,
    mut each: impl FnMut(&MessageView<'a>) -> Result<T, BlockError>,
) -> Result<Vec<T>, BlockError> {
    let Some(f) = v.field(number) else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for x in v.repeated(f)?.iter() {
        if let Some(m) = x?.as_message() {
            out.push(each(&m)?);
        }
    }
    Ok(out)
}

fn set_str(
    b: &mut Builder<'_>,
    at: MessageBuilder,
    number: u32,
    s: &str,
) -> Result<(), BuildError> {
    if s.is_empty() {
        return Ok(());
    }
    b.set(at, number, Value::String(s.as_bytes()))
}

/// One packed message: its type URL and its encoded bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Any {
    /// `type.googleapis.com/` and the message's full name, by convention.
    pub type_url: String,
    /// The encoded message.
    pub value: Vec<u8>,
}

impl Any {
    /// The full name of the packed type: the part of the URL after its last
    /// `/`.
    pub fn type_name(&self) -> &str {
        self.type_url.rsplit_once('/').map_or(&self.type_url, |(_, n)| n)
    }

    /// Packs a standard detail.
    pub fn pack(detail: &ErrorDetail) -> Result<Any, Status> {
        Ok(Any {
            type_url: format!("{TYPE_URL_PREFIX}{}", detail.type_name()),
            value: detail.encode()?,
        })
    }
}

/// A status's details as a `google.rpc.Status` message.
fn encode_status(code: Code, message: &str, details: &[Any]) -> Result<Bytes, Status> {
    let bytes = encode_with("google.rpc.Status", |b, root| {
        if code != Code::Ok {
            b.set(root, 1, Value::I32(code as i32))?;
        }
        set_str(b, root, 2, message)?;
        for d in details {
            let any = b.message(root, 3)?;
            set_str(b, any, 1, &d.type_url)?;
            if !d.value.is_empty() {
                b.set(any, 2, Value::Bytes(&d.value))?;
            }
        }
        Ok(())
    })?;
    Ok(Bytes::from(bytes))
}

impl Status {
    /// A status with details of any types, packed as [`Any`].
    pub fn with_any_details(code: Code, message: impl Into<String>, details: Vec<Any>) -> Status {
        let message = message.into();
        match encode_status(code, &message, &details) {
            Ok(bytes) => Status::with_details(code, message, bytes),
            Err(e) => e,
        }
    }

    /// A status with the standard details set in `details`.
    pub fn with_error_details(
        code: Code,
        message: impl Into<String>,
        details: ErrorDetails,
    ) -> Status {
        Status::with_error_details_vec(code, message, details.into_vec())
    }

    /// A status with a list of standard details, in order.
    pub fn with_error_details_vec(
        code: Code,
        message: impl Into<String>,
        details: impl IntoIterator<Item = ErrorDetail>,
    ) -> Status {
        let packed: Result<Vec<Any>, Status> = details.into_iter().map(|d| Any::pack(&d)).collect();
        match packed {
            Ok(any) => Status::with_any_details(code, message, any),
            Err(e) => e,
        }
    }

    /// Every detail, packed, in the order sent; empty when the status has
    /// none. Fails when the details do not parse as a `google.rpc.Status`.
    pub fn any_details(&self) -> Result<Vec<Any>, Status> {
        if self.details.is_empty() {
            return Ok(Vec::new());
        }
        decode_with("google.rpc.Status", self.details.clone(), |v| {
            messages(v, 3, |any| {
                let value = match any.by_number(2)? {
                    Some(x) => x.as_bytes().unwrap_or_default().to_vec(),
                    None => Vec::new(),
                };
                Ok(Any { type_url: string(any, 1)?, value })
            })
        })
    }

    /// The standard details, in order; details of other types are left out
    /// (see [`Status::any_details`]). Fails when a detail does not parse.
    pub fn check_error_details_vec(&self) -> Result<Vec<ErrorDetail>, Status> {
        let mut out = Vec::new();
        for any in self.any_details()? {
            if let Some(d) = ErrorDetail::unpack(&any)? {
                out.push(d);
            }
        }
        Ok(out)
    }

    /// The standard details, at most one of each type (the first sent).
    /// Fails when a detail does not parse.
    pub fn check_error_details(&self) -> Result<ErrorDetails, Status> {
        let mut out = ErrorDetails::new();
        for d in self.check_error_details_vec()? {
            out.absorb(d);
        }
        Ok(out)
    }

    /// The standard details; none when they do not parse (see
    /// [`Status::check_error_details`] to tell the two apart).
    pub fn error_details(&self) -> ErrorDetails {
        self.check_error_details().unwrap_or_default()
    }

    /// The standard details as a list; empty when they do not parse.
    pub fn error_details_vec(&self) -> Vec<ErrorDetail> {
        self.check_error_details_vec().unwrap_or_default()
    }
}

/// Why a call failed: a constant reason within a domain, plus context.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErrorInfo {
    /// A constant, UPPER_SNAKE_CASE reason.
    pub reason: String,
    /// The reason's namespace (a service name).
    pub domain: String,
    /// Context.
    pub metadata: BTreeMap<String, String>,
}

/// When the client may retry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetryInfo {
    /// How long to wait first.
    pub retry_delay: Option<Duration>,
}

/// Server-side debugging information.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DebugInfo {
    /// The stack trace.
    pub stack_entries: Vec<String>,
    /// Anything else.
    pub detail: String,
}

/// One failed quota check.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuotaViolation {
    /// What the quota applies to (`clientip:1.2.3.4`).
    pub subject: String,
    /// How it was exceeded.
    pub description: String,
}

/// Which quota checks failed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuotaFailure {
    /// The failed checks.
    pub violations: Vec<QuotaViolation>,
}

/// One failed precondition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PreconditionViolation {
    /// The kind of precondition (`TOS`).
    pub r#type: String,
    /// What failed it.
    pub subject: String,
    /// How.
    pub description: String,
}

/// Which preconditions failed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PreconditionFailure {
    /// The failed preconditions.
    pub violations: Vec<PreconditionViolation>,
}

/// One invalid request field.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldViolation {
    /// The field's path (`user.name`).
    pub field: String,
    /// What is wrong with it.
    pub description: String,
}

/// Which request fields were invalid.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BadRequest {
    /// The invalid fields.
    pub field_violations: Vec<FieldViolation>,
}

/// The request as the server saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestInfo {
    /// An id to quote in a bug report.
    pub request_id: String,
    /// Whatever helps the server's operators.
    pub serving_data: String,
}

/// The resource the call was about.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceInfo {
    /// Its type (`sql table`).
    pub resource_type: String,
    /// Its name.
    pub resource_name: String,
    /// Who owns it.
    pub owner: String,
    /// What went wrong with it.
    pub description: String,
}

/// A link to documentation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HelpLink {
    /// What it leads to.
    pub description: String,
    /// The URL.
    pub url: String,
}

/// Where to read about the failure.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Help {
    /// The links.
    pub links: Vec<HelpLink>,
}

/// The error message in the user's language.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalizedMessage {
    /// A BCP 47 locale (`en-US`).
    pub locale: String,
    /// The message.
    pub message: String,
}

/// One standard detail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorDetail {
    /// `google.rpc.ErrorInfo`
    ErrorInfo(ErrorInfo),
    /// `google.rpc.RetryInfo`
    RetryInfo(RetryInfo),
    /// `google.rpc.DebugInfo`
    DebugInfo(DebugInfo),
    /// `google.rpc.QuotaFailure`
    QuotaFailure(QuotaFailure),
    /// `google.rpc.PreconditionFailure`
    PreconditionFailure(PreconditionFailure),
    /// `google.rpc.BadRequest`
    BadRequest(BadRequest),
    /// `google.rpc.RequestInfo`
    RequestInfo(RequestInfo),
    /// `google.rpc.ResourceInfo`
    ResourceInfo(ResourceInfo),
    /// `google.rpc.Help`
    Help(Help),
    /// `google.rpc.LocalizedMessage`
    LocalizedMessage(LocalizedMessage),
}

impl ErrorDetail {
    /// The full name of the detail's message type.
    pub fn type_name(&self) -> &'static str {
        match self {
            ErrorDetail::ErrorInfo(_) => "google.rpc.ErrorInfo",
            ErrorDetail::RetryInfo(_) => "google.rpc.RetryInfo",
            ErrorDetail::DebugInfo(_) => "google.rpc.DebugInfo",
            ErrorDetail::QuotaFailure(_) => "google.rpc.QuotaFailure",
            ErrorDetail::PreconditionFailure(_) => "google.rpc.PreconditionFailure",
            ErrorDetail::BadRequest(_) => "google.rpc.BadRequest",
            ErrorDetail::RequestInfo(_) => "google.rpc.RequestInfo",
            ErrorDetail::ResourceInfo(_) => "google.rpc.ResourceInfo",
            ErrorDetail::Help(_) => "google.rpc.Help",
            ErrorDetail::LocalizedMessage(_) => "google.rpc.LocalizedMessage",
        }
    }

    /// The detail's encoding.
    pub fn encode(&self) -> Result<Vec<u8>, Status> {
        encode_with(self.type_name(), |b, r| match self {
            ErrorDetail::ErrorInfo(d) => {
                set_str(b, r, 1, &d.reason)?;
                set_str(b, r, 2, &d.domain)?;
                for (k, v) in &d.metadata {
                    let e = b.message(r, 3)?;
                    set_str(b, e, 1, k)?;
                    set_str(b, e, 2, v)?;
                }
                Ok(())
            }
            ErrorDetail::RetryInfo(d) => {
                if let Some(delay) = d.retry_delay {
                    let dur = b.message(r, 1)?;
                    let secs = i64::try_from(delay.as_secs()).unwrap_or(i64::MAX);
                    if secs != 0 {
                        b.set(dur, 1, Value::I64(secs))?;
                    }
                    if delay.subsec_nanos() != 0 {
                        b.set(dur, 2, Value::I32(delay.subsec_nanos() as i32))?;
                    }
                }
                Ok(())
            }
            ErrorDetail::DebugInfo(d) => {
                for s in &d.stack_entries {
                    b.push(r, 1, Value::String(s.as_bytes()))?;
                }
                set_str(b, r, 2, &d.detail)
            }
            ErrorDetail::QuotaFailure(d) => {
                for v in &d.violations {
                    let m = b.message(r, 1)?;
                    set_str(b, m, 1, &v.subject)?;
                    set_str(b, m, 2, &v.description)?;
                }
                Ok(())
            }
            ErrorDetail::PreconditionFailure(d) => {
                for v in &d.violations {
                    let m = b.message(r, 1)?;
                    set_str(b, m, 1, &v.r#type)?;
                    set_str(b, m, 2, &v.subject)?;
                    set_str(b, m, 3, &v.description)?;
                }
                Ok(())
            }
            ErrorDetail::BadRequest(d) => {
                for v in &d.field_violations {
                    let m = b.message(r, 1)?;
                    set_str(b, m, 1, &v.field)?;
                    set_str(b, m, 2, &v.description)?;
                }
                Ok(())
            }
            ErrorDetail::RequestInfo(d) => {
                set_str(b, r, 1, &d.request_id)?;
                set_str(b, r, 2, &d.serving_data)
            }
            ErrorDetail::ResourceInfo(d) => {
                set_str(b, r, 1, &d.resource_type)?;
                set_str(b, r, 2, &d.resource_name)?;
                set_str(b, r, 3, &d.owner)?;
                set_str(b, r, 4, &d.description)
            }
            ErrorDetail::Help(d) => {
                for l in &d.links {
                    let m = b.message(r, 1)?;
                    set_str(b, m, 1, &l.description)?;
                    set_str(b, m, 2, &l.url)?;
                }
                Ok(())
            }
            ErrorDetail::LocalizedMessage(d) => {
                set_str(b, r, 1, &d.locale)?;
                set_str(b, r, 2, &d.message)
            }
        })
    }

    /// The standard detail packed in `any`; `None` for another type.
    pub fn unpack(any: &Any) -> Result<Option<ErrorDetail>, Status> {
        let name = any.type_name();
        let v = Bytes::copy_from_slice(&any.value);
        let d = match name {
            "google.rpc.ErrorInfo" => ErrorDetail::ErrorInfo(decode_with(name, v, |m| {
                let mut metadata = BTreeMap::new();
                for (k, v) in messages(m, 3, |e| Ok((string(e, 1)?, string(e, 2)?)))? {
                    metadata.insert(k, v);
                }
                Ok(ErrorInfo { reason: string(m, 1)?, domain: string(m, 2)?, metadata })
            })?),
            "google.rpc.RetryInfo" => ErrorDetail::RetryInfo(decode_with(name, v, |m| {
                let retry_delay = match m.by_number(1)?.and_then(|x| x.as_message()) {
                    None => None,
                    Some(d) => {
                        let secs = d.by_number(1)?.and_then(|x| x.as_i128()).unwrap_or(0);
                        let nanos = d.by_number(2)?.and_then(|x| x.as_i128()).unwrap_or(0);
                        // A negative or out-of-range delay means "no delay
                        // given" rather than a wrap-around.
                        match (u64::try_from(secs), u32::try_from(nanos)) {
                            (Ok(s), Ok(n)) if n < 1_000_000_000 => Some(Duration::new(s, n)),
                            _ => None,
                        }
                    }
                };
                Ok(RetryInfo { retry_delay })
            })?),
            "google.rpc.DebugInfo" => ErrorDetail::DebugInfo(decode_with(name, v, |m| {
                Ok(DebugInfo { stack_entries: strings(m, 1)?, detail: string(m, 2)? })
            })?),
            "google.rpc.QuotaFailure" => ErrorDetail::QuotaFailure(decode_with(name, v, |m| {
                let violations = messages(m, 1, |x| {
                    Ok(QuotaViolation { subject: string(x, 1)?, description: string(x, 2)? })
                })?;
                Ok(QuotaFailure { violations })
            })?),
            "google.rpc.PreconditionFailure" => {
                ErrorDetail::PreconditionFailure(decode_with(name, v, |m| {
                    let violations = messages(m, 1, |x| {
                        Ok(PreconditionViolation {
                            r#type: string(x, 1)?,
                            subject: string(x, 2)?,
                            description: string(x, 3)?,
                        })
                    })?;
                    Ok(PreconditionFailure { violations })
                })?)
            }
            "google.rpc.BadRequest" => ErrorDetail::BadRequest(decode_with(name, v, |m| {
                let field_violations = messages(m, 1, |x| {
                    Ok(FieldViolation { field: string(x, 1)?, description: string(x, 2)? })
                })?;
                Ok(BadRequest { field_violations })
            })?),
            "google.rpc.RequestInfo" => ErrorDetail::RequestInfo(decode_with(name, v, |m| {
                Ok(RequestInfo { request_id: string(m, 1)?, serving_data: string(m, 2)? })
            })?),
            "google.rpc.ResourceInfo" => ErrorDetail::ResourceInfo(decode_with(name, v, |m| {
                Ok(ResourceInfo {
                    resource_type: string(m, 1)?,
                    resource_name: string(m, 2)?,
                    owner: string(m, 3)?,
                    description: string(m, 4)?,
                })
            })?),
            "google.rpc.Help" => ErrorDetail::Help(decode_with(name, v, |m| {
                let links = messages(m, 1, |x| {
                    Ok(HelpLink { description: string(x, 1)?, url: string(x, 2)? })
                })?;
                Ok(Help { links })
            })?),
            "google.rpc.LocalizedMessage" => {
                ErrorDetail::LocalizedMessage(decode_with(name, v, |m| {
                    Ok(LocalizedMessage { locale: string(m, 1)?, message: string(m, 2)? })
                })?)
            }
            _ => return Ok(None),
        };
        Ok(Some(d))
    }
}

/// The standard details of a status, at most one of each type (tonic-types'
/// `ErrorDetails`). Built with the `with_*` constructors and the `add_*` /
/// `set_*` methods, or read off a received status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErrorDetails {
    /// `google.rpc.ErrorInfo`
    pub error_info: Option<ErrorInfo>,
    /// `google.rpc.RetryInfo`
    pub retry_info: Option<RetryInfo>,
    /// `google.rpc.DebugInfo`
    pub debug_info: Option<DebugInfo>,
    /// `google.rpc.QuotaFailure`
    pub quota_failure: Option<QuotaFailure>,
    /// `google.rpc.PreconditionFailure`
    pub precondition_failure: Option<PreconditionFailure>,
    /// `google.rpc.BadRequest`
    pub bad_request: Option<BadRequest>,
    /// `google.rpc.RequestInfo`
    pub request_info: Option<RequestInfo>,
    /// `google.rpc.ResourceInfo`
    pub resource_info: Option<ResourceInfo>,
    /// `google.rpc.Help`
    pub help: Option<Help>,
    /// `google.rpc.LocalizedMessage`
    pub localized_message: Option<LocalizedMessage>,
}

impl ErrorDetails {
    /// No details.
    pub fn new() -> ErrorDetails {
        ErrorDetails::default()
    }

    /// Only an `ErrorInfo`.
    pub fn with_error_info(
        reason: impl Into<String>,
        domain: impl Into<String>,
        metadata: impl IntoIterator<Item = (String, String)>,
    ) -> ErrorDetails {
        let mut d = ErrorDetails::new();
        d.set_error_info(reason, domain, metadata);
        d
    }

    /// Only a `RetryInfo`.
    pub fn with_retry_info(retry_delay: Option<Duration>) -> ErrorDetails {
        ErrorDetails { retry_info: Some(RetryInfo { retry_delay }), ..ErrorDetails::new() }
    }

    /// Only a `DebugInfo`.
    pub fn with_debug_info(
        stack_entries: impl IntoIterator<Item = String>,
        detail: impl Into<String>,
    ) -> ErrorDetails {
        let debug =
            DebugInfo { stack_entries: stack_entries.into_iter().collect(), detail: detail.into() };
        ErrorDetails { debug_info: Some(debug), ..ErrorDetails::new() }
    }

    /// Only a `QuotaFailure` with one violation.
    pub fn with_quota_failure_violation(
        subject: impl Into<String>,
        description: impl Into<String>,
    ) -> ErrorDetails {
        let mut d = ErrorDetails::new();
        d.add_quota_failure_violation(subject, description);
        d
    }

    /// Only a `PreconditionFailure` with one violation.
    pub fn with_precondition_failure_violation(
        r#type: impl Into<String>,
        subject: impl Into<String>,
        description: impl Into<String>,
    ) -> ErrorDetails {
        let mut d = ErrorDetails::new();
        d.add_precondition_failure_violation(r#type, subject, description);
        d
    }

    /// Only a `BadRequest` with one field violation.
    pub fn with_bad_request_violation(
        field: impl Into<String>,
        description: impl Into<String>,
    ) -> ErrorDetails {
        let mut d = ErrorDetails::new();
        d.add_bad_request_violation(field, description);
        d
    }

    /// Only a `RequestInfo`.
    pub fn with_request_info(
        request_id: impl Into<String>,
        serving_data: impl Into<String>,
    ) -> ErrorDetails {
        let info = RequestInfo { request_id: request_id.into(), serving_data: serving_data.into() };
        ErrorDetails { request_info: Some(info), ..ErrorDetails::new() }
    }

    /// Only a `ResourceInfo`.
    pub fn with_resource_info(
        resource_type: impl Into<String>,
        resource_name: impl Into<String>,
        owner: impl Into<String>,
        description: impl Into<String>,
    ) -> ErrorDetails {
        let info = ResourceInfo {
            resource_type: resource_type.into(),
            resource_name: resource_name.into(),
            owner: owner.into(),
            description: description.into(),
        };
        ErrorDetails { resource_info: Some(info), ..ErrorDetails::new() }
    }

    /// Only a `Help` with one link.
    pub fn with_help_link(description: impl Into<String>, url: impl Into<String>) -> ErrorDetails {
        let mut d = ErrorDetails::new();
        d.add_help_link(description, url);
        d
    }

    /// Only a `LocalizedMessage`.
    pub fn with_localized_message(
        locale: impl Into<String>,
        message: impl Into<String>,
    ) -> ErrorDetails {
        let m = LocalizedMessage { locale: locale.into(), message: message.into() };
        ErrorDetails { localized_message: Some(m), ..ErrorDetails::new() }
    }

    /// Sets the `ErrorInfo`.
    pub fn set_error_info(
        &mut self,
        reason: impl Into<String>,
        domain: impl Into<String>,
        metadata: impl IntoIterator<Item = (String, String)>,
    ) -> &mut ErrorDetails {
        self.error_info = Some(ErrorInfo {
            reason: reason.into(),
            domain: domain.into(),
            metadata: metadata.into_iter().collect(),
        });
        self
    }

    /// Adds a violation to the `QuotaFailure`.
    pub fn add_quota_failure_violation(
        &mut self,
        subject: impl Into<String>,
        description: impl Into<String>,
    ) -> &mut ErrorDetails {
        let v = QuotaViolation { subject: subject.into(), description: description.into() };
        self.quota_failure.get_or_insert_with(Default::default).violations.push(v);
        self
    }

    /// Adds a violation to the `PreconditionFailure`.
    pub fn add_precondition_failure_violation(
        &mut self,
        r#type: impl Into<String>,
        subject: impl Into<String>,
        description: impl Into<String>,
    ) -> &mut ErrorDetails {
        let v = PreconditionViolation {
            r#type: r#type.into(),
            subject: subject.into(),
            description: description.into(),
        };
        self.precondition_failure.get_or_insert_with(Default::default).violations.push(v);
        self
    }

    /// Adds a field violation to the `BadRequest`.
    pub fn add_bad_request_violation(
        &mut self,
        field: impl Into<String>,
        description: impl Into<String>,
    ) -> &mut ErrorDetails {
        let v = FieldViolation { field: field.into(), description: description.into() };
        self.bad_request.get_or_insert_with(Default::default).field_violations.push(v);
        self
    }

    /// Adds a link to the `Help`.
    pub fn add_help_link(
        &mut self,
        description: impl Into<String>,
        url: impl Into<String>,
    ) -> &mut ErrorDetails {
        let l = HelpLink { description: description.into(), url: url.into() };
        self.help.get_or_insert_with(Default::default).links.push(l);
        self
    }

    /// Whether no detail is set.
    pub fn is_empty(&self) -> bool {
        self == &ErrorDetails::default()
    }

    /// The details as a list, in the order of the fields above.
    pub fn into_vec(self) -> Vec<ErrorDetail> {
        let mut out = Vec::new();
        out.extend(self.error_info.map(ErrorDetail::ErrorInfo));
        out.extend(self.retry_info.map(ErrorDetail::RetryInfo));
        out.extend(self.debug_info.map(ErrorDetail::DebugInfo));
        out.extend(self.quota_failure.map(ErrorDetail::QuotaFailure));
        out.extend(self.precondition_failure.map(ErrorDetail::PreconditionFailure));
        out.extend(self.bad_request.map(ErrorDetail::BadRequest));
        out.extend(self.request_info.map(ErrorDetail::RequestInfo));
        out.extend(self.resource_info.map(ErrorDetail::ResourceInfo));
        out.extend(self.help.map(ErrorDetail::Help));
        out.extend(self.localized_message.map(ErrorDetail::LocalizedMessage));
        out
    }

    /// Keeps `d` unless a detail of its type is already set.
    fn absorb(&mut self, d: ErrorDetail) {
        match d {
            ErrorDetail::ErrorInfo(x) => _ = self.error_info.get_or_insert(x),
            ErrorDetail::RetryInfo(x) => _ = self.retry_info.get_or_insert(x),
            ErrorDetail::DebugInfo(x) => _ = self.debug_info.get_or_insert(x),
            ErrorDetail::QuotaFailure(x) => _ = self.quota_failure.get_or_insert(x),
            ErrorDetail::PreconditionFailure(x) => _ = self.precondition_failure.get_or_insert(x),
            ErrorDetail::BadRequest(x) => _ = self.bad_request.get_or_insert(x),
            ErrorDetail::RequestInfo(x) => _ = self.request_info.get_or_insert(x),
            ErrorDetail::ResourceInfo(x) => _ = self.resource_info.get_or_insert(x),
            ErrorDetail::Help(x) => _ = self.help.get_or_insert(x),
            ErrorDetail::LocalizedMessage(x) => _ = self.localized_message.get_or_insert(x),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> ErrorDetails {
        let mut d = ErrorDetails::with_error_info(
            "QUOTA",
            "example.com",
            [("zone".to_string(), "eu".to_string()), ("a".to_string(), "".to_string())],
        );
        d.retry_info = Some(RetryInfo { retry_delay: Some(Duration::new(3, 500)) });
        d.debug_info = Some(DebugInfo {
            stack_entries: vec!["main".into(), "".into(), "f ☺".into()],
            detail: "d".into(),
        });
        d.add_quota_failure_violation("clientip:1.2.3.4", "too many");
        d.add_precondition_failure_violation("TOS", "user", "not accepted");
        d.add_bad_request_violation("name", "empty").add_bad_request_violation("age", "");
        d.request_info = Some(RequestInfo { request_id: "r1".into(), serving_data: "s".into() });
        d.resource_info =
            ErrorDetails::with_resource_info("table", "t", "me", "gone").resource_info;
        d.add_help_link("docs", "https://example.com");
        d.localized_message = Some(LocalizedMessage { locale: "fr".into(), message: "non".into() });
        d
    }

    #[test]
    fn every_standard_detail_round_trips() {
        let d = all();
        let st = Status::with_error_details(Code::InvalidArgument, "bad", d.clone());
        assert!(!st.details.is_empty());
        assert_eq!(st.code, Code::InvalidArgument);
        assert_eq!(st.check_error_details(), Ok(d.clone()));
        let list = st.check_error_details_vec().unwrap_or_default();
        assert_eq!(list.len(), 10);
        assert_eq!(list, d.into_vec());
    }

    #[test]
    fn other_types_travel_as_any_and_order_is_kept() {
        let custom = Any { type_url: "type.googleapis.com/x.Custom".into(), value: vec![8, 1] };
        let info = Any::pack(&ErrorDetail::RequestInfo(RequestInfo {
            request_id: "1".into(),
            serving_data: String::new(),
        }));
        let Ok(info) = info else { panic!("packs") };
        let st = Status::with_any_details(Code::Aborted, "m", vec![custom.clone(), info.clone()]);
        assert_eq!(st.any_details(), Ok(vec![custom, info]));
        // Only the standard one is typed.
        assert_eq!(st.error_details_vec().len(), 1);
        assert!(st.error_details().request_info.is_some());
    }

    #[test]
    fn the_google_rpc_status_carries_code_and_message() {
        let st = Status::with_any_details(Code::NotFound, "gone ☺", Vec::new());
        let (code, msg) = decode_with("google.rpc.Status", st.details.clone(), |v| {
            Ok((v.by_number(1)?.and_then(|x| x.as_i128()), string(v, 2)?))
        })
        .unwrap_or_default();
        assert_eq!(code, Some(5));
        assert_eq!(msg, "gone ☺");
    }

    #[test]
    fn known_bytes_from_another_implementation_decode() {
        // google.rpc.Status{code: 3, message: "x", details: [Any{
        // "type.googleapis.com/google.rpc.ErrorInfo", ErrorInfo{reason:
        // "R", metadata: {"k": "v"}}}]}, encoded by hand from the spec.
        let info = [0x0a, 1, b'R', 0x1a, 6, 0x0a, 1, b'k', 0x12, 1, b'v'];
        let url = b"type.googleapis.com/google.rpc.ErrorInfo";
        let mut any = vec![0x0a, url.len() as u8];
        any.extend_from_slice(url);
        any.extend_from_slice(&[0x12, info.len() as u8]);
        any.extend_from_slice(&info);
        let mut status = vec![0x08, 3, 0x12, 1, b'x', 0x1a, any.len() as u8];
        status.extend_from_slice(&any);
        let st = Status::with_details(Code::InvalidArgument, "x", Bytes::from(status));
        let d = st.check_error_details().unwrap_or_default();
        let Some(info) = d.error_info else { panic!("ErrorInfo decoded") };
        assert_eq!(info.reason, "R");
        assert_eq!(info.metadata.get("k").map(String::as_str), Some("v"));
    }

    #[test]
    fn malformed_details_are_an_error_not_a_panic() {
        for bad in [&b"\xff"[..], b"\x1a\x05abc", b"\x0a\xff\xff\xff\xff\x0f"] {
            let st = Status::with_details(Code::Internal, "", Bytes::copy_from_slice(bad));
            assert!(st.any_details().is_err(), "{bad:?}");
            assert!(st.check_error_details().is_err());
            assert!(st.error_details().is_empty());
        }
        // A standard type URL over bytes that are not that message.
        let any = Any { type_url: "type.googleapis.com/google.rpc.Help".into(), value: vec![0xff] };
        assert!(ErrorDetail::unpack(&any).is_err());
    }
}
