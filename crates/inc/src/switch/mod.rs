//! The software data plane: a Tofino-class switch pipeline as a sans-IO
//! state machine.
//!
//! [`Switch::process`] takes one datagram and the time and queue depth the
//! caller observed, and returns the datagrams to send; [`Switch::control`]
//! is the control plane (the controller and server agents install and
//! remove applications, read and write registers). No sockets, no clock:
//! `protoplane switch` wraps this in a UDP loop, the simulation harness
//! calls it directly, and an XDP or P4 data plane can implement the same
//! contract.
//!
//! # The constraints it keeps
//!
//! - Memory is **register arrays of 32-bit cells** laid out over a fixed
//!   number of **stages** ([`SwitchConfig`]); a pass touches each array at
//!   most once, in stage order, with one read-modify-write (`regs.rs`
//!   enforces it at run time, see [`Stats::double_touch`]):
//!
//!   ```text
//!   stage 0        stage 1            stages 2 .. 2+G/gps      last stage
//!   app table      slot meta          register groups           applied masks
//!   seen bits      (tag,count,bits)   (tag,value) × G           overflow flags
//!   ```
//! - A packet carries at most `groups` pairs (32 by default) on one switch;
//!   pair *i* may only use a group no other pair of the packet uses. A
//!   second pair on the same group is left for the server agent.
//! - Arithmetic is 32-bit. An add that would leave the `i32` range is not
//!   applied (the register keeps an exact value) and the pair is marked
//!   overflowed; the agents redo it on the host in 64 bits.
//! - No loops over memory on the packet path, no allocation besides the
//!   output datagrams, no timers: the data plane reacts to packets only.
//!
//! # What a packet does
//!
//! - [`Kind::Add`] (`Map.addTo`): per pair, if the group's tag at the
//!   address is the pair's key, add. If every pair was applied the switch
//!   answers the client itself (an `Ack`); otherwise the packet goes on to
//!   the server agent with `mask` saying which pairs were applied. A
//!   retransmission (same flip bit in the flow's bit array) applies
//!   nothing and carries the mask stored by the first pass, so the server
//!   agent completes exactly the rest.
//! - [`Kind::Agg`] (synchronous aggregation, `Map.addTo` + `CntFwd`): the
//!   chunk's slot counts distinct contributors (a bitmap, test-and-set)
//!   and sums; at the threshold the sums go to every member of the
//!   application (multicast). A contributor that missed the result
//!   retransmits and gets it unicast while the slot still holds it. A slot
//!   that holds an older chunk is reset by the first packet of a newer one
//!   (lazy clear); a packet for a chunk older than the slot's goes to the
//!   server agent (`STALE`).
//! - [`Kind::Vote`] (`CntFwd`): the key's slot counts distinct voters
//!   (test-and-set) or accumulates values; the packet that reaches the
//!   threshold is forwarded to the destinations; every vote is answered.
//! - Anything else of an installed application (results and wide items
//!   of its server agent, acknowledgements) is forwarded to its
//!   destination: the host agents do that part in software.
//!
//! # Whom it trusts
//!
//! Nobody by default. A packet is dropped, and counted, unless
//! - its application is installed (the controller installs every
//!   application, with or without memory) and its MAC verifies with the
//!   application's key ([`crate::mac`]; [`Stats::forged`]);
//! - its source and destination are nodes of that application — its
//!   server agent or a member that joined — so the data plane relays
//!   nothing to an arbitrary port, itself included ([`Stats::refused`]);
//! - it has crossed fewer than [`MAX_HOPS`](crate::packet::MAX_HOPS) switches (no loops);
//! - a member's packet carries its flow's current incarnation (a member
//!   that restarted starts over, see [`Control::Flows`]) and, if
//!   sequenced, is not older than the flow can still retransmit (a
//!   replay);
//! - an aggregation contribution does not move its slot further ahead
//!   than twice the application's memory (a member is never more than a
//!   window ahead).

mod codec;
mod config;
mod regs;

use std::collections::HashMap;

pub use config::{ConfigError, SwitchConfig};

use crate::mac::Key;
use crate::packet::{verify, Addr, Flags, Header, Items, Kind, Packet, Pair};
use regs::{Pass, Registers};

/// Where `CntFwd` sends what reached the threshold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destinations {
    /// The application's server agent.
    Server,
    /// Every member (client) of the application.
    Members,
    /// Both.
    Both,
}

/// How `CntFwd` counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CountMode {
    /// Each distinct sender counts once (a bitmap per slot; senders are the
    /// flows of the application, at most 32).
    TestAndSet,
    /// Values are summed; the threshold applies to the sum.
    Accumulate,
}

/// `Stream.modify`: an operation with a parameter applied to every value
/// of the application's `Add` and `Agg` packets before it is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModifyOp {
    /// `v + p` (saturating to the i32 range marks overflow like any add).
    Add,
    /// `max(v, p)`.
    Max,
    /// `min(v, p)`.
    Min,
    /// `v & p`.
    And,
    /// `v | p`.
    Or,
    /// `v << p` (p in 0..31; bits shifted out make the value overflow).
    Shl,
    /// `v >> p`, arithmetic.
    Shr,
}

impl ModifyOp {
    /// Applies the operation; `None` when the result does not fit 32 bits.
    pub fn apply(self, v: i32, p: i32) -> Option<i32> {
        Some(match self {
            ModifyOp::Add => v.checked_add(p)?,
            ModifyOp::Max => v.max(p),
            ModifyOp::Min => v.min(p),
            ModifyOp::And => v & p,
            ModifyOp::Or => v | p,
            ModifyOp::Shl => {
                let s = u32::try_from(p).ok().filter(|s| *s < 32)?;
                let r = v.checked_shl(s)?;
                if r >> s != v {
                    return None;
                }
                r
            }
            ModifyOp::Shr => v >> u32::try_from(p).ok().filter(|s| *s < 32)?,
        })
    }

    /// The same operation on the host's 64-bit values.
    pub fn apply_wide(self, v: i64, p: i32) -> i64 {
        let p64 = i64::from(p);
        match self {
            ModifyOp::Add => v.saturating_add(p64),
            ModifyOp::Max => v.max(p64),
            ModifyOp::Min => v.min(p64),
            ModifyOp::And => v & p64,
            ModifyOp::Or => v | p64,
            ModifyOp::Shl => v.checked_shl(p.clamp(0, 63) as u32).unwrap_or(0),
            ModifyOp::Shr => v >> p.clamp(0, 63),
        }
    }
}

/// One application installed in the data plane (a match-action table
/// entry, written by the controller).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppEntry {
    /// Application id.
    pub app: u16,
    /// The server agent's node.
    pub server: u16,
    /// Members (client agents' nodes): the multicast group.
    pub members: Vec<u16>,
    /// Where `CntFwd` sends.
    pub forward: Destinations,
    /// First flow id of the application.
    pub flow_base: u16,
    /// Number of flows (at most 32 when `count` is `TestAndSet`).
    pub flows: u16,
    /// First register index of the application's memory (in every group).
    pub mem_base: u32,
    /// Number of register indices.
    pub mem_len: u32,
    /// `CntFwd` threshold.
    pub threshold: u32,
    /// How `CntFwd` counts.
    pub count: CountMode,
    /// `Stream.modify`, if the filter has one.
    pub modify: Option<(ModifyOp, i32)>,
    /// The application's MAC key.
    pub key: Key,
}

/// A control-plane request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Control {
    /// Installs an application; its memory and flows must not overlap any
    /// other's. The memory and flow bits are zeroed first.
    Install(AppEntry),
    /// Removes an application and zeroes its memory and flow bits.
    Remove {
        /// Application id.
        app: u16,
    },
    /// Replaces the multicast group.
    Members {
        /// Application id.
        app: u16,
        /// The new members.
        members: Vec<u16>,
    },
    /// Reads and replaces one register group cell (tag and value) of the
    /// application's memory, atomically with respect to packets.
    Swap {
        /// Application id.
        app: u16,
        /// The cell.
        addr: Addr,
        /// New tag.
        tag: u32,
        /// New value.
        value: i32,
    },
    /// Several swaps, applied in order as one request (all refused if one
    /// cell is outside the application's memory).
    SwapMany {
        /// Application id.
        app: u16,
        /// (cell, new tag, new value).
        cells: Vec<(Addr, u32, i32)>,
    },
    /// Starts a member's flows over for its new incarnation (a join):
    /// flip bits and applied masks back to their initial state, no newest
    /// sequence number, and only packets of `incarnation` admitted from
    /// now on.
    Flows {
        /// Application id.
        app: u16,
        /// The member's flows.
        flows: Vec<u16>,
        /// The member's new incarnation.
        incarnation: u8,
    },
    /// Reads cells (tag and value).
    Read {
        /// Application id.
        app: u16,
        /// The cells.
        addrs: Vec<Addr>,
    },
    /// Reads the slot metadata (tag, count, contributor bits) at indices.
    ReadMeta {
        /// Application id.
        app: u16,
        /// Register indices.
        indices: Vec<u32>,
    },
    /// Resets slot metadata: each (index, tag) gets the tag and a zero
    /// count, zero contributor bits and no overflow flags. A vote slot must
    /// carry its key's tag before votes count there.
    ResetMeta {
        /// Application id.
        app: u16,
        /// (register index, new tag).
        slots: Vec<(u32, u32)>,
    },
    /// Reads one aggregation slot atomically: its metadata and its value
    /// in every register group of this switch.
    ReadSlot {
        /// Application id.
        app: u16,
        /// Register index.
        index: u32,
    },
    /// When the data plane last saw a packet of each application.
    LastSeen,
    /// The installed applications' table entries (for a controller that
    /// restarts: it must not hand out what a switch still holds).
    Apps,
    /// The data plane's shape (for a controller that starts after it).
    Describe,
}

/// The answer to a [`Control`] request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlReply {
    /// Done.
    Done,
    /// The old tag and value of a `Swap`.
    Swapped {
        /// Tag before.
        tag: u32,
        /// Value before.
        value: i32,
    },
    /// The old tag and value of every cell of a `SwapMany`, in order.
    SwappedMany(Vec<(u32, i32)>),
    /// Cells read, in request order.
    Cells(Vec<(u32, i32)>),
    /// Metadata read, in request order: (tag, count, contributor bits,
    /// overflowed positions).
    Meta(Vec<(u32, u32, u32, u64)>),
    /// Per application id, the `now` of its last packet (0: none yet).
    LastSeen(Vec<(u16, u64)>),
    /// The answer to `Apps`, by application id: each entry and the
    /// incarnation each of its flows admits.
    Apps(Vec<(AppEntry, Vec<u8>)>),
    /// The answer to `ReadSlot`.
    Slot {
        /// The chunk the slot holds.
        tag: u32,
        /// Contributions counted.
        count: u32,
        /// Contributor bits.
        bits: u32,
        /// Overflowed positions.
        overflow: u64,
        /// The value of every register group, in group order.
        values: Vec<i32>,
    },
    /// The answer to `Describe`.
    Described {
        /// The switch's node.
        node: u16,
        /// Position in the chain.
        chain_index: u8,
        /// Register groups.
        groups: u8,
        /// Cells per register array.
        registers: u32,
        /// Flows the bit arrays hold.
        flows: u16,
        /// Flow window.
        window: u32,
    },
    /// Refused, and why.
    Refused(String),
}

/// Counters (for tests, `bench inc` and the switch's status line).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Datagrams processed.
    pub packets: u64,
    /// Datagrams that were not INC packets (dropped).
    pub malformed: u64,
    /// Packets of applications not installed (dropped).
    pub not_admitted: u64,
    /// Packets whose MAC did not verify (dropped).
    pub forged: u64,
    /// Packets of an installed application dropped by a rule: a source or
    /// destination that is not one of its nodes, too many hops, an old
    /// incarnation, a replayed sequence number, a chunk too far ahead.
    pub refused: u64,
    /// Pairs added to registers.
    pub applied: u64,
    /// Pairs left for the server agent (tag mismatch, group conflict,
    /// address outside the application's memory).
    pub missed: u64,
    /// Adds refused because the sum left the 32-bit range.
    pub overflowed: u64,
    /// Retransmissions recognized by the flip bit or a contributor bit.
    pub duplicates: u64,
    /// Acks the switch sent itself.
    pub acks: u64,
    /// Results multicast (or unicast to a late contributor).
    pub results: u64,
    /// Packets passed on to the server agent.
    pub forwarded: u64,
    /// Packets marked with ECN.
    pub ecn_marked: u64,
    /// A pass touched a register array twice: a bug in this pipeline.
    pub double_touch: u64,
}

/// The data plane.
#[derive(Debug)]
pub struct Switch {
    config: SwitchConfig,
    regs: Registers,
    apps: HashMap<u16, AppEntry>,
    last_seen: HashMap<u16, u64>,
    stats: Stats,
}

/// A datagram to send: to which node, and the bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Emit {
    /// Destination node.
    pub dst: u16,
    /// The datagram.
    pub bytes: Vec<u8>,
}

impl Switch {
    /// A data plane with empty memory and no applications.
    pub fn new(config: SwitchConfig) -> Result<Switch, ConfigError> {
        config.validate()?;
        let regs = Registers::new(&config);
        Ok(Switch {
            config,
            regs,
            apps: HashMap::new(),
            last_seen: HashMap::new(),
            stats: Stats::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SwitchConfig {
        &self.config
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The installed applications.
    pub fn apps(&self) -> impl Iterator<Item = &AppEntry> {
        self.apps.values()
    }

    /// Handles one control request.
    pub fn control(&mut self, request: Control) -> ControlReply {
        match request {
            Control::Install(entry) => self.install(entry),
            Control::Remove { app } => match self.apps.remove(&app) {
                Some(entry) => {
                    self.regs.zero_app(&entry, &self.config);
                    self.last_seen.remove(&app);
                    ControlReply::Done
                }
                None => ControlReply::Refused(format!("application {app} is not installed")),
            },
            Control::Flows { app, flows, incarnation } => match self.apps.get(&app) {
                Some(entry) => {
                    if let Some(f) = flows
                        .iter()
                        .find(|f| **f < entry.flow_base || **f - entry.flow_base >= entry.flows)
                    {
                        return ControlReply::Refused(format!(
                            "flow {f} is not one of application {app}'s"
                        ));
                    }
                    self.regs.reset_flows(flows, incarnation);
                    ControlReply::Done
                }
                None => ControlReply::Refused(format!("application {app} is not installed")),
            },
            Control::Apps => {
                let mut apps: Vec<(AppEntry, Vec<u8>)> = self
                    .apps
                    .values()
                    .map(|e| {
                        (e.clone(), self.regs.incarnations(e.flow_base..e.flow_base + e.flows))
                    })
                    .collect();
                apps.sort_unstable_by_key(|(e, _)| e.app);
                ControlReply::Apps(apps)
            }
            Control::Members { app, members } => match self.apps.get_mut(&app) {
                Some(entry) => {
                    entry.members = members;
                    ControlReply::Done
                }
                None => ControlReply::Refused(format!("application {app} is not installed")),
            },
            Control::Swap { app, addr, tag, value } => match self.cell_of(app, addr) {
                Ok((g, i)) => {
                    let (old_tag, old_value) = self.regs.group_swap(g, i, tag, value);
                    ControlReply::Swapped { tag: old_tag, value: old_value }
                }
                Err(why) => ControlReply::Refused(why),
            },
            Control::SwapMany { app, cells } => {
                let mut at = Vec::with_capacity(cells.len());
                for (addr, _, _) in &cells {
                    match self.cell_of(app, *addr) {
                        Ok(c) => at.push(c),
                        Err(why) => return ControlReply::Refused(why),
                    }
                }
                let old = at
                    .iter()
                    .zip(&cells)
                    .map(|((g, i), (_, tag, value))| self.regs.group_swap(*g, *i, *tag, *value));
                ControlReply::SwappedMany(old.collect())
            }
            Control::Read { app, addrs } => {
                let mut cells = Vec::with_capacity(addrs.len());
                for addr in addrs {
                    match self.cell_of(app, addr) {
                        Ok((g, i)) => cells.push(self.regs.group_read(g, i)),
                        Err(why) => return ControlReply::Refused(why),
                    }
                }
                ControlReply::Cells(cells)
            }
            Control::ReadMeta { app, indices } => {
                if let Err(why) = self.indices_of(app, indices.iter().copied()) {
                    return ControlReply::Refused(why);
                }
                ControlReply::Meta(
                    indices.iter().map(|i| self.regs.meta_read(*i as usize)).collect(),
                )
            }
            Control::ReadSlot { app, index } => {
                if let Err(why) = self.indices_of(app, std::iter::once(index)) {
                    return ControlReply::Refused(why);
                }
                let (tag, count, bits, overflow) = self.regs.meta_read(index as usize);
                let values = self.regs.slot_values(index as usize);
                ControlReply::Slot { tag, count, bits, overflow, values }
            }
            Control::ResetMeta { app, slots } => {
                if let Err(why) = self.indices_of(app, slots.iter().map(|s| s.0)) {
                    return ControlReply::Refused(why);
                }
                for (i, tag) in slots {
                    self.regs.meta_reset(i as usize, tag);
                }
                ControlReply::Done
            }
            Control::Describe => ControlReply::Described {
                node: self.config.node,
                chain_index: self.config.chain_index,
                groups: self.config.groups,
                registers: self.config.registers,
                flows: self.config.flows,
                window: self.config.window,
            },
            Control::LastSeen => {
                let mut seen: Vec<(u16, u64)> = self
                    .apps
                    .keys()
                    .map(|a| (*a, self.last_seen.get(a).copied().unwrap_or(0)))
                    .collect();
                seen.sort_unstable();
                ControlReply::LastSeen(seen)
            }
        }
    }

    fn install(&mut self, entry: AppEntry) -> ControlReply {
        let c = &self.config;
        if self.apps.contains_key(&entry.app) {
            return ControlReply::Refused(format!(
                "application {} is already installed",
                entry.app
            ));
        }
        let mem_end = u64::from(entry.mem_base) + u64::from(entry.mem_len);
        if mem_end > u64::from(c.registers) {
            return ControlReply::Refused(format!(
                "memory {}..{mem_end} beyond the {} registers of a group",
                entry.mem_base, c.registers
            ));
        }
        let flow_end = u32::from(entry.flow_base) + u32::from(entry.flows);
        if flow_end > u32::from(c.flows) {
            return ControlReply::Refused(format!(
                "flows {}..{flow_end} beyond the data plane's {} flows",
                entry.flow_base, c.flows
            ));
        }
        if entry.count == CountMode::TestAndSet && entry.flows > 32 {
            return ControlReply::Refused(format!(
                "{} flows: test-and-set counting holds 32",
                entry.flows
            ));
        }
        for other in self.apps.values() {
            let mem_overlap = entry.mem_len > 0
                && other.mem_len > 0
                && entry.mem_base < other.mem_base + other.mem_len
                && other.mem_base < entry.mem_base + entry.mem_len;
            let flow_overlap = entry.flows > 0
                && other.flows > 0
                && entry.flow_base < other.flow_base + other.flows
                && other.flow_base < entry.flow_base + entry.flows;
            if mem_overlap || flow_overlap {
                return ControlReply::Refused(format!(
                    "application {} overlaps application {} ({})",
                    entry.app,
                    other.app,
                    if mem_overlap { "memory" } else { "flows" }
                ));
            }
        }
        self.regs.zero_app(&entry, &self.config);
        self.apps.insert(entry.app, entry);
        ControlReply::Done
    }

    /// Checks that every index is in `app`'s memory.
    fn indices_of(&self, app: u16, mut indices: impl Iterator<Item = u32>) -> Result<(), String> {
        let entry =
            self.apps.get(&app).ok_or_else(|| format!("application {app} is not installed"))?;
        match indices.find(|i| !in_memory(entry, *i)) {
            Some(bad) => Err(format!("index {bad} is outside application {app}'s memory")),
            None => Ok(()),
        }
    }

    /// The (group, index) of `addr` if it is in `app`'s memory on this switch.
    fn cell_of(&self, app: u16, addr: Addr) -> Result<(usize, usize), String> {
        let entry =
            self.apps.get(&app).ok_or_else(|| format!("application {app} is not installed"))?;
        if addr.switch() != self.config.chain_index || addr.group() >= self.config.groups {
            return Err(format!(
                "{addr:?} is not a register group of switch {}",
                self.config.chain_index
            ));
        }
        if !in_memory(entry, u32::from(addr.index())) {
            return Err(format!("{addr:?} is outside application {app}'s memory"));
        }
        Ok((usize::from(addr.group()), usize::from(addr.index())))
    }

    /// Processes one datagram received at `now` (any monotonic unit the
    /// caller chooses; it is only stored as the last-seen time) while
    /// `queue_depth` datagrams waited behind it, and appends what to send.
    pub fn process(&mut self, now: u64, queue_depth: u32, datagram: &[u8], out: &mut Vec<Emit>) {
        self.stats.packets += 1;
        let Ok((h, _)) = Header::decode(datagram) else {
            self.stats.malformed += 1;
            return;
        };
        // The entry leaves the table for the pass (the pass borrows the
        // switch mutably) and goes back after it.
        let Some(entry) = self.apps.remove(&h.app) else {
            self.stats.not_admitted += 1;
            return;
        };
        self.admitted(now, queue_depth, datagram, &entry, out);
        self.apps.insert(h.app, entry);
    }

    fn admitted(
        &mut self,
        now: u64,
        queue_depth: u32,
        datagram: &[u8],
        entry: &AppEntry,
        out: &mut Vec<Emit>,
    ) {
        if !verify(datagram, &entry.key) {
            self.stats.forged += 1;
            return;
        }
        let Ok(mut packet) = Packet::decode(datagram) else {
            self.stats.malformed += 1;
            return;
        };
        let h = &mut packet.header;
        let node = |n: u16| n == entry.server || entry.members.contains(&n);
        if !h.hop() || !node(h.src) || !node(h.dst) || h.src == h.dst {
            self.stats.refused += 1;
            return;
        }
        let mut pass = Pass::default();
        let from_member = h.src != entry.server;
        if from_member {
            let in_range = h.flow >= entry.flow_base && h.flow - entry.flow_base < entry.flows;
            let seq = (h.ext & Header::SEQUENCED != 0).then_some(h.seq);
            if !in_range || self.regs.flow_check(&mut pass, h.flow, h.incarnation(), seq).is_err() {
                self.stats.refused += 1;
                return;
            }
        }
        if queue_depth > self.config.ecn_threshold {
            h.flags = h.flags.with(Flags::ECN);
            self.stats.ecn_marked += 1;
        }
        let computes = from_member && matches!(h.kind, Kind::Add | Kind::Agg | Kind::Vote);
        if computes {
            self.last_seen.insert(entry.app, now);
        }
        if from_member && h.kind == Kind::Wide && h.ext & Header::SEQUENCED != 0 {
            // A host-only packet still takes its sequence number's flip-bit
            // slot: otherwise a later packet with the same slot and flip
            // would look like a retransmission of an older one.
            let dup = self.seen(&mut pass, &packet.header);
            let slot = self.seen_slot(&packet.header);
            self.regs.applied_mask(&mut pass, slot, dup, 0);
        }
        if !computes {
            let to = self.config.next_hop.unwrap_or(packet.header.dst);
            out.push(Emit { dst: to, bytes: packet.seal(&entry.key) });
            self.stats.double_touch += u64::from(pass.double_touch);
            return;
        }
        match packet.header.kind {
            Kind::Add => self.add(entry, &mut pass, packet, out),
            Kind::Agg => self.agg(entry, &mut pass, packet, out),
            Kind::Vote => self.vote(entry, &mut pass, packet, out),
            _ => {}
        }
        self.stats.double_touch += u64::from(pass.double_touch);
    }

    /// Sends `packet` on: to the next switch of the chain if there is one,
    /// else to `dst`.
    fn pass_on(&mut self, entry: &AppEntry, packet: &Packet, dst: u16, out: &mut Vec<Emit>) {
        let to = self.config.next_hop.unwrap_or(dst);
        out.push(Emit { dst: to, bytes: packet.seal(&entry.key) });
    }

    fn is_last(&self) -> bool {
        self.config.next_hop.is_none()
    }

    /// The flip-bit test of stage 0: `true` if this `(flow, seq)` was
    /// already processed. Stores the packet's flip bit otherwise.
    fn seen(&mut self, pass: &mut Pass, h: &Header) -> bool {
        let slot = self.seen_slot(h);
        let flip = h.flags.has(Flags::FLIP);
        self.regs.seen_test_and_store(pass, slot, flip)
    }

    fn seen_slot(&self, h: &Header) -> usize {
        usize::from(h.flow) * self.config.window as usize + (h.seq % self.config.window) as usize
    }

    fn add(&mut self, entry: &AppEntry, pass: &mut Pass, mut packet: Packet, out: &mut Vec<Emit>) {
        let dup = self.seen(pass, &packet.header);
        let mine = self.config.chain_index;
        let mut applied: u64 = 0;
        if dup {
            self.stats.duplicates += 1;
            packet.header.flags = packet.header.flags.with(Flags::DUP);
        } else if let Items::Pairs(pairs) = &mut packet.items {
            let mut groups_used: u64 = 0;
            for (i, p) in pairs.iter_mut().enumerate().take(64) {
                if p.addr.is_none() || p.addr.switch() != mine {
                    continue;
                }
                let g = p.addr.group();
                let fresh = g < self.config.groups && groups_used & (1 << g) == 0;
                if !fresh || !in_memory(entry, u32::from(p.addr.index())) {
                    self.stats.missed += 1;
                    continue;
                }
                groups_used |= 1 << g;
                let Some(v) = modified(entry, p.value) else {
                    self.stats.overflowed += 1;
                    continue;
                };
                match self.regs.group_add(
                    pass,
                    usize::from(g),
                    usize::from(p.addr.index()),
                    p.key,
                    v,
                ) {
                    GroupAdd::Added(_) => {
                        applied |= 1u64 << i;
                        self.stats.applied += 1;
                    }
                    GroupAdd::Overflow => self.stats.overflowed += 1,
                    GroupAdd::Miss => self.stats.missed += 1,
                }
            }
        }
        // Last stage: remember what this pass applied, or recall what the
        // first pass did.
        let slot = self.seen_slot(&packet.header);
        let applied = self.regs.applied_mask(pass, slot, dup, applied);
        packet.header.mask |= applied;
        let n = packet.pair_items().len();
        let all = if n >= 64 { u64::MAX } else { (1u64 << n) - 1 };
        if !self.is_last() {
            self.pass_on(entry, &packet, packet.header.dst, out);
        } else if n <= 64 && packet.header.mask == all {
            self.ack(entry, &packet, out);
        } else {
            packet.header.flags = packet.header.flags.with(Flags::FORWARDED);
            self.stats.forwarded += 1;
            out.push(Emit { dst: packet.header.dst, bytes: packet.seal(&entry.key) });
        }
    }

    /// Answers the sender of `packet` with an `Ack` for its sequence number.
    fn ack(&mut self, entry: &AppEntry, packet: &Packet, out: &mut Vec<Emit>) {
        let h = &packet.header;
        let mut a = Header::new(Kind::Ack, h.app, h.dst, h.src);
        a.flow = h.flow;
        a.seq = h.seq;
        a.aux = h.aux;
        a.flags = Flags(h.flags.0 & Flags::ECN);
        a.mask = h.mask;
        a.ext = (h.ext & 0xff00) | Header::BY_SWITCH;
        self.stats.acks += 1;
        out.push(Emit { dst: h.src, bytes: Packet::pairs(a, Vec::new()).seal(&entry.key) });
    }

    fn agg(&mut self, entry: &AppEntry, pass: &mut Pass, mut packet: Packet, out: &mut Vec<Emit>) {
        let mine = self.config.chain_index;
        let chunk = packet.header.aux;
        let member = u32::from(packet.header.flow - entry.flow_base);
        if packet.header.flags.has(Flags::STALE) {
            // An earlier switch of the chain has moved on: only the server
            // agent may answer.
            if self.is_last() {
                packet.header.flags = packet.header.flags.with(Flags::FORWARDED);
                self.stats.forwarded += 1;
                out.push(Emit { dst: entry.server, bytes: packet.seal(&entry.key) });
            } else {
                self.pass_on(entry, &packet, packet.header.dst, out);
            }
            return;
        }
        // Packets may reach this switch in another order than they left the
        // previous one, so "complete here" does not imply "complete there":
        // a result needs every earlier switch's sums in the packet.
        let prior_sums = mine == 0 || packet.header.flags.has(Flags::SUMS);
        let Items::Pairs(pairs) = &mut packet.items else { return };
        // Every pair of this switch must use the same slot index and the
        // group of its position; otherwise the packet is for the host.
        let mut slot: Option<u16> = None;
        let mut malformed = false;
        for (i, p) in pairs.iter().enumerate() {
            if p.addr.switch() != mine || p.addr.is_none() {
                continue;
            }
            let ok_group = usize::from(p.addr.group()) == i % usize::from(self.config.groups)
                && i / usize::from(self.config.groups) == usize::from(mine);
            malformed |= !ok_group || slot.is_some_and(|s| s != p.addr.index());
            slot = Some(p.addr.index());
        }
        let Some(slot) = slot.filter(|s| !malformed && in_memory(entry, u32::from(*s))) else {
            self.stats.missed += 1;
            if self.is_last() {
                packet.header.flags = packet.header.flags.with(Flags::FORWARDED);
                self.stats.forwarded += 1;
                out.push(Emit { dst: entry.server, bytes: packet.seal(&entry.key) });
            } else {
                self.pass_on(entry, &packet, packet.header.dst, out);
            }
            return;
        };
        let slot = usize::from(slot);
        let reach = entry.mem_len.saturating_mul(2);
        let meta = self.regs.meta_contribute(pass, slot, chunk, member, reach);
        let mut overflow: u64 = 0;
        let complete_after = meta.count >= entry.threshold;
        match meta.outcome {
            Contribution::TooFar => {
                self.stats.refused += 1;
                return;
            }
            Contribution::Stale => {
                self.stats.missed += 1;
                packet.header.flags = packet.header.flags.with(Flags::STALE);
                if self.is_last() {
                    packet.header.flags = packet.header.flags.with(Flags::FORWARDED);
                    self.stats.forwarded += 1;
                    out.push(Emit { dst: entry.server, bytes: packet.seal(&entry.key) });
                } else {
                    self.pass_on(entry, &packet, packet.header.dst, out);
                }
                return;
            }
            Contribution::New { reset } => {
                for (i, p) in pairs.iter_mut().enumerate() {
                    if p.addr.switch() != mine || p.addr.is_none() {
                        continue;
                    }
                    let g = usize::from(p.addr.group());
                    let v = modified(entry, p.value);
                    let r = match v {
                        Some(v) => self.regs.slot_add(pass, g, slot, reset, v),
                        None => {
                            // Touch nothing but keep a reset slot exact.
                            self.regs.slot_add(pass, g, slot, reset, 0);
                            None
                        }
                    };
                    match r {
                        Some(sum) => {
                            self.stats.applied += 1;
                            if complete_after {
                                p.value = sum;
                            }
                        }
                        None => {
                            self.stats.overflowed += 1;
                            overflow |= 1u64 << (i % 64);
                        }
                    }
                }
            }
            Contribution::Duplicate => {
                self.stats.duplicates += 1;
                packet.header.flags = packet.header.flags.with(Flags::DUP);
                if complete_after {
                    for p in
                        pairs.iter_mut().filter(|p| p.addr.switch() == mine && !p.addr.is_none())
                    {
                        p.value = self.regs.slot_read(pass, usize::from(p.addr.group()), slot);
                    }
                }
            }
        }
        let ovf = self.regs.overflow_flags(
            pass,
            slot,
            matches!(meta.outcome, Contribution::New { reset: true }),
            overflow,
        );
        if !self.is_last() {
            packet.header.flags = Flags(packet.header.flags.0 & !Flags::SUMS);
            if complete_after && prior_sums {
                packet.header.mask |= ovf;
                packet.header.flags = packet.header.flags.with(Flags::SUMS);
            }
            self.pass_on(entry, &packet, packet.header.dst, out);
            return;
        }
        let newly_complete =
            matches!(meta.outcome, Contribution::New { .. }) && meta.count == entry.threshold;
        if !complete_after
            || !prior_sums
            || !(newly_complete || matches!(meta.outcome, Contribution::Duplicate))
        {
            // Counted (or a duplicate of an incomplete chunk): consumed.
            return;
        }
        packet.header.mask |= ovf;
        let mut r = packet.header;
        r.kind = Kind::Result;
        r.src = self.config.node;
        r.flags = Flags(packet.header.flags.0 & (Flags::ECN | Flags::DUP));
        // (SUMS is cleared: it only means something on the way through a chain.)
        if r.mask != 0 {
            r.flags = r.flags.with(Flags::OVERFLOW);
        }
        let result = Packet { header: r, items: packet.items };
        self.stats.results += 1;
        if newly_complete {
            self.multicast(entry, &result, out);
        } else {
            let mut unicast = result;
            unicast.header.dst = packet.header.src;
            out.push(Emit { dst: packet.header.src, bytes: unicast.seal(&entry.key) });
        }
    }

    /// Sends `packet` to the `CntFwd` destinations of `entry`.
    fn multicast(&mut self, entry: &AppEntry, packet: &Packet, out: &mut Vec<Emit>) {
        let mut dsts: Vec<u16> = Vec::new();
        if matches!(entry.forward, Destinations::Members | Destinations::Both) {
            dsts.extend(&entry.members);
        }
        if matches!(entry.forward, Destinations::Server | Destinations::Both) {
            dsts.push(entry.server);
        }
        let mut p = packet.clone();
        for d in dsts {
            p.header.dst = d;
            out.push(Emit { dst: d, bytes: p.seal(&entry.key) });
        }
    }

    fn vote(&mut self, entry: &AppEntry, pass: &mut Pass, mut packet: Packet, out: &mut Vec<Emit>) {
        let dup = self.seen(pass, &packet.header);
        let mine = self.config.chain_index;
        let member = u32::from(packet.header.flow - entry.flow_base);
        let mut counted = false;
        let mut reached = false;
        let pair: Option<Pair> = packet.pair_items().first().copied();
        if let Some(p) = pair.filter(|p| !p.addr.is_none() && p.addr.switch() == mine) {
            if !in_memory(entry, u32::from(p.addr.index())) {
                self.stats.missed += 1;
            } else if dup {
                self.stats.duplicates += 1;
                // The first pass decided; the stored mask says whether it counted.
            } else {
                let weight = match entry.count {
                    CountMode::TestAndSet => 1,
                    CountMode::Accumulate => u32::try_from(p.value).unwrap_or(0),
                };
                let r = self.regs.meta_vote(
                    pass,
                    usize::from(p.addr.index()),
                    p.key,
                    member,
                    weight,
                    entry.count,
                );
                match r {
                    Some((fresh, count)) => {
                        counted = true;
                        reached =
                            fresh && count >= entry.threshold && count - weight < entry.threshold;
                        self.stats.applied += 1;
                    }
                    None => self.stats.missed += 1,
                }
            }
        }
        let slot = self.seen_slot(&packet.header);
        let mask = self.regs.applied_mask(pass, slot, dup, u64::from(counted));
        packet.header.mask |= mask;
        if dup {
            packet.header.flags = packet.header.flags.with(Flags::DUP);
        }
        if reached {
            packet.header.flags = packet.header.flags.with(Flags::QUORUM);
        }
        if !self.is_last() {
            self.pass_on(entry, &packet, packet.header.dst, out);
            return;
        }
        let reached = packet.header.flags.has(Flags::QUORUM);
        if packet.header.mask & 1 == 1 || pair.is_none() {
            if reached {
                let mut r = packet.header;
                r.kind = Kind::Result;
                r.src = self.config.node;
                r.flags = Flags(packet.header.flags.0 & (Flags::ECN | Flags::QUORUM));
                let result = Packet { header: r, items: packet.items.clone() };
                self.stats.results += 1;
                self.multicast(entry, &result, out);
            }
            self.ack(entry, &packet, out);
        } else {
            packet.header.flags = packet.header.flags.with(Flags::FORWARDED);
            self.stats.forwarded += 1;
            out.push(Emit { dst: packet.header.dst, bytes: packet.seal(&entry.key) });
        }
    }
}

fn in_memory(entry: &AppEntry, index: u32) -> bool {
    index >= entry.mem_base && index - entry.mem_base < entry.mem_len
}

fn modified(entry: &AppEntry, v: i32) -> Option<i32> {
    match entry.modify {
        Some((op, p)) => op.apply(v, p),
        None => Some(v),
    }
}

/// What a group add did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GroupAdd {
    Added(i32),
    Overflow,
    Miss,
}

/// What a contribution did to an aggregation slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Contribution {
    /// Counted; `reset` if it started the slot over for a newer chunk.
    New { reset: bool },
    /// This contributor had already been counted for this chunk.
    Duplicate,
    /// The slot holds a newer chunk.
    Stale,
    /// The chunk is further ahead of the slot's than any member can be.
    TooFar,
}

#[derive(Clone, Copy, Debug)]
struct MetaOutcome {
    outcome: Contribution,
    count: u32,
}

#[cfg(test)]
mod tests;
