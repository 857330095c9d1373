//! The control plane's byte form: one JSON object per request or reply
//! (a line on the switch's control connection). Readable with `nc`, and
//! every field is checked when parsed: a control peer is another process.
//!
//! ```text
//! {"op":"install","app":3,"server":41000,"members":[41001],"forward":"members",
//!  "flow_base":0,"flows":4,"mem_base":0,"mem_len":64,"threshold":4,
//!  "count":"test-and-set","modify":null}
//! {"op":"swap","app":3,"addr":65541,"tag":17,"value":0}
//! {"reply":"swapped","tag":0,"value":0}
//! ```

use serde_json::{json, Map, Value};

use super::{AppEntry, Control, ControlReply, CountMode, Destinations, ModifyOp};
use crate::json::{int32, list, modify, modify_to_json, object, text, u16_of, u32_of, uint};
use crate::mac::Key;
use crate::packet::Addr;
use crate::Error;

impl Destinations {
    /// The control-plane spelling.
    pub fn name(self) -> &'static str {
        match self {
            Destinations::Server => "server",
            Destinations::Members => "members",
            Destinations::Both => "both",
        }
    }

    /// Parses the control-plane spelling (`clients` is taken for `members`).
    pub fn parse(s: &str) -> Option<Destinations> {
        Some(match s {
            "server" => Destinations::Server,
            "members" | "clients" => Destinations::Members,
            "both" => Destinations::Both,
            _ => return None,
        })
    }
}

impl CountMode {
    /// The control-plane spelling.
    pub fn name(self) -> &'static str {
        match self {
            CountMode::TestAndSet => "test-and-set",
            CountMode::Accumulate => "accumulate",
        }
    }

    /// Parses the control-plane spelling.
    pub fn parse(s: &str) -> Option<CountMode> {
        Some(match s {
            "test-and-set" => CountMode::TestAndSet,
            "accumulate" => CountMode::Accumulate,
            _ => return None,
        })
    }
}

impl ModifyOp {
    /// The NetFilter spelling.
    pub fn name(self) -> &'static str {
        match self {
            ModifyOp::Add => "add",
            ModifyOp::Max => "max",
            ModifyOp::Min => "min",
            ModifyOp::And => "and",
            ModifyOp::Or => "or",
            ModifyOp::Shl => "shl",
            ModifyOp::Shr => "shr",
        }
    }

    /// Parses the NetFilter spelling.
    pub fn parse(s: &str) -> Option<ModifyOp> {
        Some(match s {
            "add" => ModifyOp::Add,
            "max" => ModifyOp::Max,
            "min" => ModifyOp::Min,
            "and" => ModifyOp::And,
            "or" => ModifyOp::Or,
            "shl" => ModifyOp::Shl,
            "shr" => ModifyOp::Shr,
            _ => return None,
        })
    }
}

impl AppEntry {
    fn to_json(&self) -> Value {
        json!({
            "op": "install",
            "app": self.app,
            "server": self.server,
            "members": self.members,
            "forward": self.forward.name(),
            "flow_base": self.flow_base,
            "flows": self.flows,
            "mem_base": self.mem_base,
            "mem_len": self.mem_len,
            "threshold": self.threshold,
            "count": self.count.name(),
            "modify": modify_to_json(self.modify),
            "key": self.key.to_hex(),
        })
    }

    fn from_json(o: &Map<String, Value>) -> Result<AppEntry, Error> {
        let forward = text(o, "forward")?;
        let count = text(o, "count")?;
        let modify = modify(o)?;
        let key = text(o, "key")?;
        Ok(AppEntry {
            app: uint(o, "app")?,
            server: uint(o, "server")?,
            members: list(o, "members", u16_of)?,
            forward: Destinations::parse(forward)
                .ok_or_else(|| Error::Unknown { what: "destinations", name: forward.into() })?,
            flow_base: uint(o, "flow_base")?,
            flows: uint(o, "flows")?,
            mem_base: uint(o, "mem_base")?,
            mem_len: uint(o, "mem_len")?,
            threshold: uint(o, "threshold")?,
            count: CountMode::parse(count)
                .ok_or_else(|| Error::Unknown { what: "count mode", name: count.into() })?,
            modify,
            key: Key::from_hex(key)
                .ok_or(Error::WrongType { field: "key", expected: "32 hex digits" })?,
        })
    }
}

impl Control {
    /// The JSON form.
    pub fn to_json(&self) -> Value {
        match self {
            Control::Install(e) => e.to_json(),
            Control::Remove { app } => json!({"op": "remove", "app": app}),
            Control::Members { app, members } => {
                json!({"op": "members", "app": app, "members": members})
            }
            Control::Swap { app, addr, tag, value } => {
                json!({"op": "swap", "app": app, "addr": addr.0, "tag": tag, "value": value})
            }
            Control::Read { app, addrs } => {
                json!({"op": "read", "app": app, "addrs": addrs.iter().map(|a| a.0).collect::<Vec<_>>()})
            }
            Control::SwapMany { app, cells } => json!({
                "op": "swap_many",
                "app": app,
                "cells": cells.iter().map(|(a, t, v)| json!([a.0, t, v])).collect::<Vec<_>>(),
            }),
            Control::ReadMeta { app, indices } => {
                json!({"op": "read_meta", "app": app, "indices": indices})
            }
            Control::ResetMeta { app, slots } => {
                json!({"op": "reset_meta", "app": app, "slots": slots})
            }
            Control::ReadSlot { app, index } => {
                json!({"op": "read_slot", "app": app, "index": index})
            }
            Control::LastSeen => json!({"op": "last_seen"}),
            Control::Apps => json!({"op": "apps"}),
            Control::Flows { app, flows, incarnation } => {
                json!({"op": "flows", "app": app, "flows": flows, "incarnation": incarnation})
            }
            Control::Describe => json!({"op": "describe"}),
        }
    }

    /// Parses the JSON form.
    pub fn from_json(v: &Value) -> Result<Control, Error> {
        let o = object(v)?;
        let op = text(o, "op")?;
        Ok(match op {
            "install" => Control::Install(AppEntry::from_json(o)?),
            "remove" => Control::Remove { app: uint(o, "app")? },
            "members" => {
                Control::Members { app: uint(o, "app")?, members: list(o, "members", u16_of)? }
            }
            "swap" => Control::Swap {
                app: uint(o, "app")?,
                addr: Addr(uint(o, "addr")?),
                tag: uint(o, "tag")?,
                value: int32(o, "value")?,
            },
            "swap_many" => Control::SwapMany {
                app: uint(o, "app")?,
                cells: list(o, "cells", |v| {
                    let a = v.as_array().filter(|a| a.len() == 3)?;
                    Some((
                        Addr(u32_of(&a[0])?),
                        u32_of(&a[1])?,
                        i32::try_from(a[2].as_i64()?).ok()?,
                    ))
                })?,
            },
            "read" => Control::Read {
                app: uint(o, "app")?,
                addrs: list(o, "addrs", |v| u32_of(v).map(Addr))?,
            },
            "read_meta" => {
                Control::ReadMeta { app: uint(o, "app")?, indices: list(o, "indices", u32_of)? }
            }
            "reset_meta" => Control::ResetMeta {
                app: uint(o, "app")?,
                slots: list(o, "slots", |v| {
                    let a = v.as_array().filter(|a| a.len() == 2)?;
                    Some((u32_of(&a[0])?, u32_of(&a[1])?))
                })?,
            },
            "read_slot" => Control::ReadSlot { app: uint(o, "app")?, index: uint(o, "index")? },
            "last_seen" => Control::LastSeen,
            "apps" => Control::Apps,
            "flows" => Control::Flows {
                app: uint(o, "app")?,
                flows: list(o, "flows", u16_of)?,
                incarnation: uint(o, "incarnation")?,
            },
            "describe" => Control::Describe,
            other => return Err(Error::Unknown { what: "control operation", name: other.into() }),
        })
    }
}

impl ControlReply {
    /// The JSON form.
    pub fn to_json(&self) -> Value {
        match self {
            ControlReply::Done => json!({"reply": "done"}),
            ControlReply::Swapped { tag, value } => {
                json!({"reply": "swapped", "tag": tag, "value": value})
            }
            ControlReply::Cells(c) => json!({"reply": "cells", "cells": c}),
            ControlReply::SwappedMany(c) => json!({"reply": "swapped_many", "cells": c}),
            ControlReply::Meta(m) => json!({"reply": "meta", "meta": m}),
            ControlReply::LastSeen(s) => json!({"reply": "last_seen", "seen": s}),
            ControlReply::Apps(apps) => {
                let apps: Vec<Value> = apps
                    .iter()
                    .map(|(e, inc)| {
                        let mut v = e.to_json();
                        v["incarnations"] = json!(inc);
                        v
                    })
                    .collect();
                json!({"reply": "apps", "apps": apps})
            }
            ControlReply::Slot { tag, count, bits, overflow, values } => json!({
                "reply": "slot", "tag": tag, "count": count, "bits": bits, "overflow": overflow, "values": values,
            }),
            ControlReply::Described { node, chain_index, groups, registers, flows, window } => {
                json!({
                    "reply": "described", "node": node, "chain_index": chain_index, "groups": groups,
                    "registers": registers, "flows": flows, "window": window,
                })
            }
            ControlReply::Refused(why) => json!({"reply": "refused", "why": why}),
        }
    }

    /// Parses the JSON form.
    pub fn from_json(v: &Value) -> Result<ControlReply, Error> {
        let o = object(v)?;
        let kind = text(o, "reply")?;
        Ok(match kind {
            "done" => ControlReply::Done,
            "swapped" => ControlReply::Swapped { tag: uint(o, "tag")?, value: int32(o, "value")? },
            "cells" => ControlReply::Cells(list(o, "cells", |v| {
                let a = v.as_array().filter(|a| a.len() == 2)?;
                Some((u32_of(&a[0])?, i32::try_from(a[1].as_i64()?).ok()?))
            })?),
            "swapped_many" => ControlReply::SwappedMany(list(o, "cells", |v| {
                let a = v.as_array().filter(|a| a.len() == 2)?;
                Some((u32_of(&a[0])?, i32::try_from(a[1].as_i64()?).ok()?))
            })?),
            "meta" => ControlReply::Meta(list(o, "meta", |v| {
                let a = v.as_array().filter(|a| a.len() == 4)?;
                Some((u32_of(&a[0])?, u32_of(&a[1])?, u32_of(&a[2])?, a[3].as_u64()?))
            })?),
            "last_seen" => ControlReply::LastSeen(list(o, "seen", |v| {
                let a = v.as_array().filter(|a| a.len() == 2)?;
                Some((u16_of(&a[0])?, a[1].as_u64()?))
            })?),
            "slot" => ControlReply::Slot {
                tag: uint(o, "tag")?,
                count: uint(o, "count")?,
                bits: uint(o, "bits")?,
                overflow: uint(o, "overflow")?,
                values: list(o, "values", |v| i32::try_from(v.as_i64()?).ok())?,
            },
            "described" => ControlReply::Described {
                node: uint(o, "node")?,
                chain_index: uint(o, "chain_index")?,
                groups: uint(o, "groups")?,
                registers: uint(o, "registers")?,
                flows: uint(o, "flows")?,
                window: uint(o, "window")?,
            },
            "apps" => ControlReply::Apps(list(o, "apps", |v| {
                let o = v.as_object()?;
                let inc = list(o, "incarnations", |v| u8::try_from(v.as_u64()?).ok()).ok()?;
                Some((AppEntry::from_json(o).ok()?, inc))
            })?),
            "refused" => ControlReply::Refused(text(o, "why")?.to_string()),
            other => return Err(Error::Unknown { what: "control reply", name: other.into() }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_control_message_round_trips() {
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
            key: Key([0xa5; 16]),
        };
        let requests = vec![
            Control::Install(entry.clone()),
            Control::Flows { app: 3, flows: vec![8, 9], incarnation: 200 },
            Control::Apps,
            Control::Remove { app: 3 },
            Control::Members { app: 3, members: vec![1, 2] },
            Control::Swap { app: 3, addr: Addr::new(1, 2, 3), tag: 9, value: -4 },
            Control::Read { app: 3, addrs: vec![Addr::new(0, 1, 2)] },
            Control::ReadMeta { app: 3, indices: vec![64, 65] },
            Control::ResetMeta { app: 3, slots: vec![(64, 7)] },
            Control::ReadSlot { app: 3, index: 64 },
            Control::SwapMany {
                app: 3,
                cells: vec![(Addr::new(0, 1, 2), 7, -7), (Addr::new(1, 0, 0), 0, 0)],
            },
            Control::LastSeen,
            Control::Describe,
        ];
        for r in requests {
            let text = r.to_json().to_string();
            let back =
                Control::from_json(&serde_json::from_str(&text).expect("json")).expect("parses");
            assert_eq!(back, r, "{text}");
        }
        let replies = vec![
            ControlReply::Done,
            ControlReply::Swapped { tag: 1, value: i32::MIN },
            ControlReply::Cells(vec![(1, -1), (0, i32::MAX)]),
            ControlReply::SwappedMany(vec![(3, -3)]),
            ControlReply::Meta(vec![(1, 2, 3, u64::MAX)]),
            ControlReply::LastSeen(vec![(3, 1_700_000_000_000_000)]),
            ControlReply::Apps(vec![(entry, vec![1, 2, 3, 4])]),
            ControlReply::Described {
                node: 1,
                chain_index: 0,
                groups: 32,
                registers: 16,
                flows: 2,
                window: 4,
            },
            ControlReply::Slot {
                tag: 5,
                count: 4,
                bits: 15,
                overflow: 1 << 40,
                values: vec![-1, 2],
            },
            ControlReply::Refused("no".into()),
        ];
        for r in replies {
            let text = r.to_json().to_string();
            let back = ControlReply::from_json(&serde_json::from_str(&text).expect("json"))
                .expect("parses");
            assert_eq!(back, r, "{text}");
        }
    }

    #[test]
    fn bad_control_messages_are_refused_with_a_reason() {
        let cases = [
            (r#"[]"#, "not a JSON object"),
            (
                r#"{"op":"swap","app":3,"addr":1,"tag":2,"value":4294967296}"#,
                "\"value\" = 4294967296 does not fit 32 bits",
            ),
            (r#"{"op":"remove","app":70000}"#, "\"app\" = 70000 is out of range"),
            (r#"{"op":"remove"}"#, "missing \"app\""),
            (r#"{"op":"explode"}"#, "unknown control operation \"explode\""),
            (r#"{"op":"read","app":1,"addrs":[-1]}"#, "bad item in \"addrs\": -1"),
        ];
        for (text, why) in cases {
            let v: Value = serde_json::from_str(text).expect("json");
            assert_eq!(
                Control::from_json(&v).map_err(|e| e.to_string()),
                Err(why.to_string()),
                "{text}"
            );
        }
    }
}
