//! The controller's protocol: JSON objects, one per line, between the
//! controller and the agents.
//!
//! ```text
//! agent → controller  {"op":"register", <Registration>}      → {"reply":"plan", <AppPlan>}
//!                     {"op":"join","name":N,"member":M,"node":P} → {"reply":"plan", ...}
//!                     {"op":"lookup","name":N}                → {"reply":"plan", ..., "member_nodes":[..]}
//!                     {"op":"heartbeat","app":A}              → {"reply":"ok"}
//!                     {"op":"deregister","app":A}             → {"reply":"ok"}
//!                     {"op":"reattach","name":N, <AppPlan>}   → {"reply":"plan", ...}
//! controller → server {"probe":A}       (unsolicited, on the server agent's connection)
//! errors              {"reply":"error","why":"..."}
//! ```

use serde_json::{json, Map, Value};

use crate::controller::Registration;
use crate::json::{
    bad, enumerated, field as get, modify, modify_to_json, object as obj, text, uint,
};
use crate::mac::Key;
use crate::plan::{AppPlan, CachePolicy, ClearPolicy, MemberLoss};
use crate::switch::{CountMode, Destinations};
use crate::Error;

/// A message to the controller.
#[derive(Clone, Debug, PartialEq)]
pub enum Request {
    /// Register an application instance.
    Register(Registration),
    /// Join as member `member` at `node`.
    Join {
        /// Application name.
        name: String,
        /// Member index.
        member: u16,
        /// The member's node.
        node: u16,
    },
    /// Look an application up.
    Lookup {
        /// Application name.
        name: String,
    },
    /// The server agent is alive.
    Heartbeat {
        /// Application id.
        app: u16,
    },
    /// Release everything.
    Deregister {
        /// Application id.
        app: u16,
    },
    /// A server agent whose controller restarted takes its application
    /// back: the same id, flows, memory and key (the data plane still
    /// holds them).
    Reattach {
        /// Application name.
        name: String,
        /// The plan the agent runs.
        plan: AppPlan,
    },
}

/// A message from the controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The application's plan (and, for a lookup, its members' nodes).
    Plan(AppPlan, Vec<Option<u16>>),
    /// Done.
    Ok,
    /// Refused.
    Error(String),
    /// Asks the server agent of an application for a heartbeat.
    Probe(u16),
}

/// The JSON fields of a plan.
pub fn plan_to_json(p: &AppPlan) -> Map<String, Value> {
    let v = json!({
        "app": p.app,
        "server": p.server,
        "switch": p.switch,
        "members": p.members,
        "flows_per_member": p.flows_per_member,
        "flow_base": p.flow_base,
        "switches": p.switches,
        "groups": p.groups,
        "window": p.window,
        "memory": p.memory.map(|(b, l)| json!([b, l])),
        "clear": p.clear.name(),
        "cache": p.cache.name(),
        "threshold": p.threshold,
        "key_bits": p.key_bits,
        "key": p.key.to_hex(),
        "incarnation": p.incarnation,
        "member_loss": p.member_loss.name(),
    });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// `member_loss`, optional (`fail` when absent: peers that predate it).
fn member_loss(o: &Map<String, Value>) -> Result<MemberLoss, Error> {
    if o.get("member_loss").is_none() {
        return Ok(MemberLoss::Fail);
    }
    enumerated(o, "member_loss", MemberLoss::parse)
}

/// Parses the fields of a plan.
pub fn plan_from_json(o: &Map<String, Value>) -> Result<AppPlan, Error> {
    let switch = match get(o, "switch")? {
        Value::Null => None,
        v => Some(v.as_u64().and_then(|n| u16::try_from(n).ok()).ok_or(bad("switch", None))?),
    };
    let memory = match get(o, "memory")? {
        Value::Null => None,
        Value::Array(a) if a.len() == 2 => {
            let b = a[0].as_u64().and_then(|n| u32::try_from(n).ok()).ok_or(bad("memory", None))?;
            let l = a[1].as_u64().and_then(|n| u32::try_from(n).ok()).ok_or(bad("memory", None))?;
            Some((b, l))
        }
        _ => return Err(bad("memory", None)),
    };
    let plan = AppPlan {
        app: uint(o, "app")?,
        server: uint(o, "server")?,
        switch,
        members: uint(o, "members")?,
        flows_per_member: uint(o, "flows_per_member")?,
        flow_base: uint(o, "flow_base")?,
        switches: uint(o, "switches")?,
        groups: uint(o, "groups")?,
        window: uint(o, "window")?,
        memory,
        clear: enumerated(o, "clear", ClearPolicy::parse)?,
        cache: enumerated(o, "cache", CachePolicy::parse)?,
        threshold: uint(o, "threshold")?,
        key_bits: uint(o, "key_bits")?,
        key: Key::from_hex(text(o, "key")?)
            .ok_or(Error::WrongType { field: "key", expected: "32 hex digits" })?,
        incarnation: uint(o, "incarnation")?,
        member_loss: member_loss(o)?,
    };
    if plan.members == 0
        || plan.flows_per_member == 0
        || plan.groups == 0
        || !plan.window.is_power_of_two()
    {
        return Err(Error::InvalidPlan {
            why: "a plan needs members, flows, groups and a power-of-two window",
        });
    }
    if u32::from(plan.flow_base) + u32::from(plan.members) * u32::from(plan.flows_per_member)
        > 65_536
    {
        return Err(Error::InvalidPlan { why: "flows beyond 65536" });
    }
    Ok(plan)
}

impl Request {
    /// The JSON form.
    pub fn to_json(&self) -> Value {
        match self {
            Request::Register(r) => json!({
                "op": "register",
                "name": r.name,
                "server": r.server,
                "members": r.members,
                "flows_per_member": r.flows_per_member,
                "memory": r.memory,
                "clear": r.clear.name(),
                "cache": r.cache.name(),
                "threshold": r.threshold,
                "forward": r.forward.name(),
                "count": r.count.name(),
                "modify": modify_to_json(r.modify),
                "key_bits": r.key_bits,
                "member_loss": r.member_loss.name(),
            }),
            Request::Join { name, member, node } => {
                json!({"op": "join", "name": name, "member": member, "node": node})
            }
            Request::Lookup { name } => json!({"op": "lookup", "name": name}),
            Request::Heartbeat { app } => json!({"op": "heartbeat", "app": app}),
            Request::Deregister { app } => json!({"op": "deregister", "app": app}),
            Request::Reattach { name, plan } => {
                let mut o = plan_to_json(plan);
                o.insert("op".into(), json!("reattach"));
                o.insert("name".into(), json!(name));
                Value::Object(o)
            }
        }
    }

    /// Parses the JSON form.
    pub fn from_json(v: &Value) -> Result<Request, Error> {
        let o = obj(v)?;
        let op = text(o, "op")?;
        Ok(match op {
            "register" => {
                let modify = modify(o)?;
                let key_bits: u32 = uint(o, "key_bits")?;
                if !(1..=32).contains(&key_bits) {
                    return Err(Error::OutOfRange {
                        field: "key_bits",
                        value: i128::from(key_bits),
                        rule: "(1 to 32)",
                    });
                }
                Request::Register(Registration {
                    name: text(o, "name")?.to_string(),
                    server: uint(o, "server")?,
                    members: uint(o, "members")?,
                    flows_per_member: uint(o, "flows_per_member")?,
                    memory: uint(o, "memory")?,
                    clear: enumerated(o, "clear", ClearPolicy::parse)?,
                    cache: enumerated(o, "cache", CachePolicy::parse)?,
                    threshold: uint(o, "threshold")?,
                    forward: enumerated(o, "forward", Destinations::parse)?,
                    count: enumerated(o, "count", CountMode::parse)?,
                    modify,
                    key_bits,
                    member_loss: member_loss(o)?,
                })
            }
            "join" => Request::Join {
                name: text(o, "name")?.to_string(),
                member: uint(o, "member")?,
                node: uint(o, "node")?,
            },
            "lookup" => Request::Lookup { name: text(o, "name")?.to_string() },
            "heartbeat" => Request::Heartbeat { app: uint(o, "app")? },
            "deregister" => Request::Deregister { app: uint(o, "app")? },
            "reattach" => {
                Request::Reattach { name: text(o, "name")?.to_string(), plan: plan_from_json(o)? }
            }
            other => return Err(Error::Unknown { what: "request", name: other.to_string() }),
        })
    }
}

impl Reply {
    /// The JSON form.
    pub fn to_json(&self) -> Value {
        match self {
            Reply::Plan(p, members) => {
                let mut m = plan_to_json(p);
                m.insert("reply".into(), json!("plan"));
                m.insert("member_nodes".into(), json!(members));
                Value::Object(m)
            }
            Reply::Ok => json!({"reply": "ok"}),
            Reply::Error(why) => json!({"reply": "error", "why": why}),
            Reply::Probe(app) => json!({"probe": app}),
        }
    }

    /// Parses the JSON form.
    pub fn from_json(v: &Value) -> Result<Reply, Error> {
        let o = obj(v)?;
        if let Some(p) = o.get("probe") {
            return p
                .as_u64()
                .and_then(|a| u16::try_from(a).ok())
                .map(Reply::Probe)
                .ok_or(bad("probe", None));
        }
        Ok(match text(o, "reply")? {
            "plan" => {
                let members = match o.get("member_nodes") {
                    Some(Value::Array(a)) if a.len() <= 65_536 => {
                        a.iter().map(|v| v.as_u64().and_then(|n| u16::try_from(n).ok())).collect()
                    }
                    _ => Vec::new(),
                };
                Reply::Plan(plan_from_json(o)?, members)
            }
            "ok" => Reply::Ok,
            "error" => Reply::Error(text(o, "why")?.to_string()),
            other => return Err(Error::Unknown { what: "reply", name: other.to_string() }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::switch::ModifyOp;

    #[test]
    fn requests_and_replies_round_trip() {
        let reg = Registration {
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
        for r in [
            Request::Register(reg),
            Request::Join { name: "a".into(), member: 3, node: 9 },
            Request::Lookup { name: "a".into() },
            Request::Heartbeat { app: 2 },
            Request::Deregister { app: 2 },
        ] {
            let back = Request::from_json(&r.to_json()).expect("parses");
            assert_eq!(back, r);
        }
        let plan = AppPlan {
            app: 1,
            server: 2,
            switch: Some(3),
            members: 4,
            flows_per_member: 1,
            flow_base: 5,
            switches: 2,
            groups: 32,
            window: 256,
            memory: Some((0, 64)),
            clear: ClearPolicy::Copy,
            cache: CachePolicy::Fcfs,
            threshold: 4,
            key_bits: 32,
            key: Key([3; 16]),
            incarnation: 9,
            member_loss: MemberLoss::Continue,
        };
        let back = Request::from_json(
            &Request::Reattach { name: "a".into(), plan: plan.clone() }.to_json(),
        )
        .expect("parses");
        assert_eq!(back, Request::Reattach { name: "a".into(), plan: plan.clone() });
        for r in [
            Reply::Plan(plan, vec![Some(1), None]),
            Reply::Ok,
            Reply::Error("x".into()),
            Reply::Probe(7),
        ] {
            assert_eq!(Reply::from_json(&r.to_json()).expect("parses"), r);
        }
    }
}
