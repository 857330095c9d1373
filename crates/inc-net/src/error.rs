//! What can go wrong in the agents' calls and the RPC face's helpers.
//!
//! One enum for the crate, like rustls's `Error`: callers match on what
//! went wrong, `Display` gives the human text (the words the CLI and the
//! logs have always shown), and [`Status`] has a `From` for gRPC code.
//! Setting up a runtime (binding, registering, joining) reports
//! `std::io::Error`s as before.

use std::fmt;
use std::time::Duration;

use protoplane_grpc::{Code, Status};
use protoplane_inc::client::Outcome;

/// An error of `protoplane-inc-net`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The agent's state machine refused the call: a key longer than a
    /// packet carries, a vote instance that is reserved or was proposed
    /// already (see [`protoplane_inc::Error`]).
    Inc(protoplane_inc::Error),
    /// A call did not finish before its deadline: the agent retransmitted
    /// its packets until then and no answer completed it.
    TimedOut {
        /// The call (`"add"`, `"get"`, `"aggregate"`, `"vote"`,
        /// `"clear"`), when the caller named it.
        call: Option<&'static str>,
        /// The deadline it had, when the caller knew it.
        after: Option<Duration>,
    },
    /// The agent finished a call with a result of another kind (a `get`
    /// answered with an aggregation).
    UnexpectedOutcome(Outcome),
    /// A vote for an instance whose proposal this agent has not seen (or
    /// no longer remembers).
    NoProposal {
        /// The instance.
        instance: u32,
    },
    /// The thread running the client agent is gone.
    AgentGone,
    /// The call cannot complete exactly: the data plane died holding
    /// values of the application.
    DataPlaneLost(String),
    /// Bytes that are not a well-formed protobuf message (the server's
    /// response, read by [`crate::rpc::strip_fields`]).
    MalformedMessage {
        /// What is wrong with them (`"truncated varint"`).
        reason: &'static str,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Inc(e) => fmt::Display::fmt(e, f),
            Error::TimedOut { call, after } => match (call, after) {
                (Some(call), Some(after)) => {
                    write!(f, "the {call} call did not finish within {after:?}")
                }
                (None, Some(after)) => write!(f, "call did not finish within {after:?}"),
                (Some(call), None) => write!(f, "the {call} call did not finish in time"),
                (None, None) => f.write_str("the call did not finish in time"),
            },
            Error::UnexpectedOutcome(o) => write!(f, "unexpected outcome {o:?}"),
            Error::NoProposal { instance } => {
                write!(f, "no proposal for instance {instance} was seen")
            }
            Error::AgentGone => f.write_str("the client agent's thread is gone"),
            Error::DataPlaneLost(why) => f.write_str(why),
            Error::MalformedMessage { reason } => f.write_str(reason),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Inc(e) => Some(e),
            _ => None,
        }
    }
}

impl From<protoplane_inc::Error> for Error {
    fn from(e: protoplane_inc::Error) -> Error {
        Error::Inc(e)
    }
}

/// The gRPC code of an error of the state machines.
fn inc_code(e: &protoplane_inc::Error) -> Code {
    use protoplane_inc::Error as E;
    match e {
        E::KeyTooLong { .. }
        | E::ReservedInstance
        | E::EmptyApplication
        | E::TooManyMembers { .. }
        | E::TooManyFlows { .. }
        | E::Config(_) => Code::InvalidArgument,
        E::AlreadyProposed { .. } | E::NameTaken { .. } => Code::AlreadyExists,
        E::NoSuchName { .. } | E::NoSuchApp { .. } | E::NoSuchMember { .. } => Code::NotFound,
        E::NoFreeFlows { .. } | E::AppIdsExhausted => Code::ResourceExhausted,
        // Malformed messages between our own processes, and the
        // controller's tables disagreeing with themselves.
        _ => Code::Internal,
    }
}

impl From<Error> for Status {
    /// A status with the error's text and a code for what went wrong:
    /// a timeout is `DeadlineExceeded`, a gone agent `Unavailable`, a
    /// vote without a proposal `FailedPrecondition`, malformed bytes and
    /// unexpected outcomes `Internal`, and the state machines' refusals
    /// their own (`InvalidArgument`, `AlreadyExists`, `NotFound`,
    /// `ResourceExhausted`).
    fn from(e: Error) -> Status {
        let code = match &e {
            Error::Inc(inner) => inc_code(inner),
            Error::TimedOut { .. } => Code::DeadlineExceeded,
            Error::AgentGone | Error::DataPlaneLost(_) => Code::Unavailable,
            Error::NoProposal { .. } => Code::FailedPrecondition,
            Error::UnexpectedOutcome(_) | Error::MalformedMessage { .. } => Code::Internal,
        };
        Status::new(code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::strip_fields;

    /// Callers match on what went wrong; the text stays the same.
    #[test]
    fn callers_match_on_what_went_wrong() {
        match strip_fields(&[0x08], &[7]) {
            Err(Error::MalformedMessage { reason }) => assert_eq!(reason, "truncated varint"),
            other => panic!("expected MalformedMessage, got {other:?}"),
        }
        let e = Error::from(protoplane_inc::Error::AlreadyProposed { instance: 3 });
        assert!(matches!(e, Error::Inc(protoplane_inc::Error::AlreadyProposed { instance: 3 })));
        assert_eq!(e.to_string(), "instance 3 was already proposed");
        assert!(std::error::Error::source(&e).is_some());

        let t = Error::TimedOut { call: None, after: Some(Duration::from_secs(2)) };
        assert_eq!(t.to_string(), "call did not finish within 2s");
        let t = Error::TimedOut { call: Some("add"), after: None };
        assert_eq!(t.to_string(), "the add call did not finish in time");
    }

    #[test]
    fn errors_become_fitting_grpc_codes() {
        let cases = [
            (Error::TimedOut { call: Some("get"), after: None }, Code::DeadlineExceeded),
            (Error::AgentGone, Code::Unavailable),
            (Error::NoProposal { instance: 1 }, Code::FailedPrecondition),
            (Error::MalformedMessage { reason: "invalid wire type" }, Code::Internal),
            (Error::UnexpectedOutcome(Outcome::Added), Code::Internal),
            (protoplane_inc::Error::KeyTooLong { len: 70 }.into(), Code::InvalidArgument),
            (protoplane_inc::Error::NoFreeFlows { flows: 4 }.into(), Code::ResourceExhausted),
            (protoplane_inc::Error::NotAnObject.into(), Code::Internal),
        ];
        for (e, code) in cases {
            let text = e.to_string();
            let s = Status::from(e);
            assert_eq!((s.code, s.message), (code, text));
        }
    }
}
