//! What can go wrong in this crate's fallible calls: a control-plane or
//! controller message that is malformed, a request the controller
//! refuses, a call an agent cannot start, a vote that cannot be opened.
//!
//! One enum for the crate, like rustls's `Error`: callers match on what
//! went wrong, and `Display` gives the human text (the same words the
//! JSON protocol sends back in a refusal, so logs read as before).

use std::fmt;

use crate::packet::MAX_KEY;
use crate::switch::ConfigError;

/// An error of `protoplane-inc`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    // ---- Malformed messages (the controller's protocol and the switch's
    // control plane: JSON objects, every field checked).
    /// The message is not a JSON object.
    NotAnObject,
    /// A required field is absent.
    MissingField {
        /// The field's name.
        field: &'static str,
    },
    /// A field has the wrong JSON type.
    WrongType {
        /// The field's name.
        field: &'static str,
        /// What it should be, as the message words it (`"a string"`).
        expected: &'static str,
    },
    /// A number outside the range its field allows.
    OutOfRange {
        /// The field's name.
        field: &'static str,
        /// The number received.
        value: i128,
        /// The rule it breaks, as the message words it (`"is out of
        /// range"`, `"does not fit 32 bits"`, `"(1 to 32)"`).
        rule: &'static str,
    },
    /// A string field with a value the protocol does not know (a policy,
    /// a count mode).
    UnknownValue {
        /// The field's name.
        field: &'static str,
        /// The value received.
        value: String,
    },
    /// Something the protocol does not know: a request, a reply, a
    /// control operation, destinations, a count mode.
    Unknown {
        /// What kind of thing, as the message words it (`"request"`,
        /// `"control operation"`).
        what: &'static str,
        /// The name received.
        name: String,
    },
    /// A list longer than a message may carry (it is refused, not
    /// allocated).
    TooManyItems {
        /// The field's name.
        field: &'static str,
        /// Items received.
        items: usize,
        /// Items allowed.
        max: usize,
    },
    /// An item of a list that does not have the shape the field wants.
    BadItem {
        /// The field's name.
        field: &'static str,
        /// The item, as JSON.
        item: String,
    },
    /// A field whose value does not have the shape the protocol wants
    /// (`"modify"`, `"memory"`, `"switch"`, `"probe"`).
    BadField {
        /// The field's name.
        field: &'static str,
        /// The part of the field that is wrong (`"operation"`), if one is.
        part: Option<&'static str>,
        /// The value received, as JSON, when the message names it.
        value: Option<String>,
    },
    /// A plan no agent can run (no members, flows or groups, a window
    /// that is not a power of two, flows beyond 65536).
    InvalidPlan {
        /// Why, as the message words it.
        why: &'static str,
    },

    // ---- The controller refuses a request.
    /// An application of this name is registered already.
    NameTaken {
        /// The name.
        name: String,
    },
    /// A registration with no member or no flow per member.
    EmptyApplication,
    /// More members than the contributor and voter bitmaps hold (32).
    TooManyMembers {
        /// Members asked for.
        members: u16,
    },
    /// Members × flows per member does not fit the 16-bit flow ids.
    TooManyFlows {
        /// Members asked for.
        members: u16,
        /// Flows per member asked for.
        flows_per_member: u16,
    },
    /// The data plane has no free range of this many flows.
    NoFreeFlows {
        /// Flows asked for.
        flows: u16,
    },
    /// Every application id was handed out.
    AppIdsExhausted,
    /// No application of this name is registered.
    NoSuchName {
        /// The name.
        name: String,
    },
    /// No application with this id is registered.
    NoSuchApp {
        /// The application id.
        app: u16,
    },
    /// A member index beyond the application's members.
    NoSuchMember {
        /// The member index asked for.
        member: u16,
        /// The application's members.
        members: u16,
    },
    /// A reattaching server agent's application conflicts with what the
    /// controller holds (its id, flows or memory belong to another).
    CannotReattach {
        /// The application id.
        app: u16,
        /// Why, in words.
        why: &'static str,
    },
    /// The controller's tables disagree: a name points to an application
    /// it no longer holds.
    AppVanished {
        /// The application id the name pointed to.
        app: u16,
    },

    // ---- Agents.
    /// A key longer than a packet carries ([`MAX_KEY`] bytes).
    KeyTooLong {
        /// The key's length in bytes.
        len: usize,
    },
    /// Vote instance 0 cannot be proposed: it marks an empty slot.
    ReservedInstance,
    /// The vote instance was proposed already.
    AlreadyProposed {
        /// The instance.
        instance: u32,
    },

    // ---- Configuration.
    /// A switch configuration no pipeline can have.
    Config(ConfigError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotAnObject => f.write_str("not a JSON object"),
            Error::MissingField { field } => write!(f, "missing \"{field}\""),
            Error::WrongType { field, expected } => write!(f, "\"{field}\" is not {expected}"),
            Error::OutOfRange { field, value, rule } => write!(f, "\"{field}\" = {value} {rule}"),
            Error::UnknownValue { field, value } => write!(f, "unknown \"{field}\" {value:?}"),
            Error::Unknown { what, name } => write!(f, "unknown {what} {name:?}"),
            Error::TooManyItems { field, items, max } => {
                write!(f, "\"{field}\" has {items} items (at most {max})")
            }
            Error::BadItem { field, item } => write!(f, "bad item in \"{field}\": {item}"),
            Error::BadField { field, part, value } => {
                write!(f, "bad \"{field}\"")?;
                if let Some(part) = part {
                    write!(f, " {part}")?;
                }
                if let Some(value) = value {
                    write!(f, ": {value}")?;
                }
                Ok(())
            }
            Error::InvalidPlan { why } => f.write_str(why),
            Error::NameTaken { name } => write!(f, "an application named {name:?} is registered"),
            Error::EmptyApplication => {
                f.write_str("an application needs at least one member and one flow per member")
            }
            Error::TooManyMembers { members } => {
                write!(f, "{members} members: contributor and voter bitmaps hold 32")
            }
            Error::TooManyFlows { members, flows_per_member } => {
                write!(f, "{members} members × {flows_per_member} flows")
            }
            Error::NoFreeFlows { flows } => write!(f, "no {flows} free flows"),
            Error::AppIdsExhausted => f.write_str("application ids exhausted"),
            Error::NoSuchName { name } => write!(f, "no application named {name:?}"),
            Error::NoSuchApp { app } => write!(f, "no application {app}"),
            Error::NoSuchMember { member, members } => {
                write!(f, "member {member} of an application with {members} members")
            }
            Error::AppVanished { .. } => f.write_str("application vanished"),
            Error::CannotReattach { app, why } => {
                write!(f, "application {app} cannot reattach: {why}")
            }
            Error::KeyTooLong { len } => write!(f, "key of {len} bytes (at most {MAX_KEY})"),
            Error::ReservedInstance => {
                f.write_str("instance 0 is reserved (an empty slot has tag 0)")
            }
            Error::AlreadyProposed { instance } => {
                write!(f, "instance {instance} was already proposed")
            }
            Error::Config(e) => fmt::Display::fmt(e, f),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Config(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Error {
        Error::Config(e)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::controller::{Controller, ControllerTuning, Registration};
    use crate::messages::Request;
    use crate::plan::{CachePolicy, ClearPolicy};
    use crate::switch::{Control, CountMode, Destinations};

    fn reg(name: &str) -> Registration {
        Registration {
            name: name.into(),
            server: 1,
            members: 2,
            flows_per_member: 1,
            memory: 0,
            clear: ClearPolicy::Lazy,
            cache: CachePolicy::Fcfs,
            threshold: 2,
            forward: Destinations::Members,
            count: CountMode::TestAndSet,
            modify: None,
            key_bits: 32,
            member_loss: crate::plan::MemberLoss::Fail,
        }
    }

    /// Callers match on what went wrong; the text stays the protocol's.
    #[test]
    fn callers_match_on_what_went_wrong() {
        let mut c = Controller::new(None, ControllerTuning::default(), crate::mac::Key::default());
        c.register(0, reg("a")).expect("first registration");
        match c.register(0, reg("a")) {
            Err(Error::NameTaken { name }) => assert_eq!(name, "a"),
            other => panic!("expected NameTaken, got {other:?}"),
        }
        let e = c.join(0, "a", 5, 9).expect_err("member 5 of 2");
        assert_eq!(e, Error::NoSuchMember { member: 5, members: 2 });
        assert_eq!(e.to_string(), "member 5 of an application with 2 members");

        let e = Request::from_json(&json!({"op": "heartbeat"})).expect_err("no app");
        assert!(matches!(e, Error::MissingField { field: "app" }), "{e:?}");
        let e = Control::from_json(&json!({"op": "remove", "app": 70000})).expect_err("range");
        assert!(matches!(e, Error::OutOfRange { field: "app", value: 70000, .. }), "{e:?}");
        assert_eq!(e.to_string(), "\"app\" = 70000 is out of range");
    }

    #[test]
    fn a_configuration_error_is_the_source() {
        let e = Error::from(ConfigError("0 flows".into()));
        assert_eq!(e.to_string(), "0 flows");
        let source = std::error::Error::source(&e).map(|s| s.to_string());
        assert_eq!(source.as_deref(), Some("0 flows"));
    }
}
