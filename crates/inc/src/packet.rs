//! The INC packet: what agents and the data plane exchange.
//!
//! One datagram is one packet: a fixed 32-byte header, `count` items and
//! an 8-byte MAC ([`crate::mac`]) of everything before it, keyed with the
//! application's key. Everything is big-endian, every field has a fixed
//! place, and a packet that does not parse or verify is dropped by
//! whoever receives it (it never changes state), so a switch parser needs
//! no loops beyond the item count.
//!
//! ```text
//!  0               1               2               3
//!  0 1 2 3 4 5 6 7 0 1 2 3 4 5 6 7 0 1 2 3 4 5 6 7 0 1 2 3 4 5 6 7
//! +-------------------------------+---------------+---------------+
//! |         magic 0x4e50          |    version    |     kind      |  0
//! +---------------+---------------+---------------+---------------+
//! |     flags     |     count     |            app id             |  4
//! +---------------+---------------+-------------------------------+
//! |          source node          |        destination node       |  8
//! +-------------------------------+-------------------------------+
//! |             flow              | incarnation   | hops  |  ext  | 12
//! +-------------------------------+-------------------------------+
//! |                          sequence                             | 16
//! +---------------------------------------------------------------+
//! |          aux (chunk id, vote instance, cumulative ack)        | 20
//! +---------------------------------------------------------------+
//! |                                                               | 24
//! +--           mask (applied / overflow, one bit per item)     --+
//! |                                                               | 28
//! +---------------------------------------------------------------+
//! |  items: count × 12 bytes (key, address, value)  or, for WIDE, |
//! |  count × (op u8, key length u8, key bytes, value i64)         |
//! +---------------------------------------------------------------+
//! |            MAC: SipHash-2-4 of all the bytes above            |
//! |                 (the application's key, 8 bytes)              |
//! +---------------------------------------------------------------+
//! ```
//!
//! The 16-bit word at offset 14 holds the sender's *incarnation* (high
//! byte: which life of a member this is, handed out by the controller at
//! each join, so a restarted member starts a sequence space nobody
//! confuses with its earlier one), a *hop count* (bits 4–7: every switch
//! increments it and drops a packet that has crossed more switches than a
//! chain can have) and flags (bits 0–3, [`Header::SEQUENCED`],
//! [`Header::BY_SWITCH`]).
//!
//! A *pair* item is `key` (the 32-bit logical address of a key), `addr`
//! (where the server agent put it in data-plane memory, [`Addr`]) and a
//! 32-bit `value` — exactly what a switch register holds. A *wide* item is
//! for the host-only path: the whole key and a 64-bit value, so nothing is
//! lost when a value does not fit a register or a key collides.

use std::fmt;

use crate::mac::{siphash24, Key};

/// Writes the MAC of `datagram` (everything but its last [`MAC_LEN`]
/// bytes) into its last [`MAC_LEN`] bytes.
pub fn seal(datagram: &mut [u8], key: &Key) {
    let Some(n) = datagram.len().checked_sub(MAC_LEN) else { return };
    let mac = siphash24(key, &datagram[..n]);
    datagram[n..].copy_from_slice(&mac.to_be_bytes());
}

/// Whether the MAC of `datagram` verifies with `key`.
pub fn verify(datagram: &[u8], key: &Key) -> bool {
    let Some(n) = datagram.len().checked_sub(MAC_LEN) else { return false };
    let mac = siphash24(key, &datagram[..n]);
    // Not a secret comparison that must run in constant time: a forger
    // learns nothing from the time a switch takes to drop a packet it
    // cannot see the answer to.
    datagram[n..] == mac.to_be_bytes()
}

/// First two bytes of every packet.
pub const MAGIC: u16 = 0x4e50;
/// Format version this crate speaks (2: the MAC trailer, incarnations
/// and hop counts).
pub const VERSION: u8 = 2;
/// Header length in bytes.
pub const HEADER_LEN: usize = 32;
/// Length of one pair item.
pub const PAIR_LEN: usize = 12;
/// Most items a packet may carry (two chained 32-pair switches hold 64;
/// the format allows a longer chain).
pub const MAX_ITEMS: usize = 128;
/// Longest key of a wide item.
pub const MAX_KEY: usize = 64;
/// Length of the MAC trailer.
pub const MAC_LEN: usize = 8;
/// Largest datagram an agent builds: header plus 128 wide items with the
/// longest keys and the MAC stays below the 64 KiB of a UDP datagram.
pub const MAX_PACKET: usize = HEADER_LEN + MAX_ITEMS * (2 + MAX_KEY + 8) + MAC_LEN;
/// Most switches a packet may cross (a chain is shorter; a packet that
/// would cross more is in a loop and is dropped).
pub const MAX_HOPS: u16 = 8;

/// What a packet asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// `Map.addTo`: add each pair's value to the key's register.
    Add = 1,
    /// A synchronous-aggregation contribution: `Map.addTo` into an
    /// aggregation slot plus `CntFwd` (count contributors, forward the sums
    /// to every member at the threshold). `aux` is the chunk id.
    Agg = 2,
    /// A `CntFwd` vote: count distinct voters per key, forward at the
    /// threshold. `aux` is the instance.
    Vote = 3,
    /// A completed aggregation chunk or a reached quorum, from the data
    /// plane or the server agent to the destinations.
    Result = 4,
    /// Acknowledges `seq` of `flow`; pairs carry address mappings
    /// (key → address) the client may use from now on.
    Ack = 5,
    /// Host-only traffic between an agent and the server agent, passed
    /// through the data plane untouched: wide items.
    Wide = 6,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Add,
            2 => Kind::Agg,
            3 => Kind::Vote,
            4 => Kind::Result,
            5 => Kind::Ack,
            6 => Kind::Wide,
            _ => return None,
        })
    }
}

/// Header flag bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Flags(pub u8);

impl Flags {
    /// The flip bit: `(seq / window) & 1` of the sender's flow, compared
    /// with the data plane's per-flow bit array to drop retransmissions it
    /// already applied.
    pub const FLIP: u8 = 1;
    /// Congestion experienced: a queue on the way was above its threshold.
    pub const ECN: u8 = 2;
    /// The data plane passed this packet on to the server agent; `mask`
    /// says which pairs it applied.
    pub const FORWARDED: u8 = 4;
    /// The data plane had seen this sequence number before.
    pub const DUP: u8 = 8;
    /// The aggregation slot has moved on to a later chunk.
    pub const STALE: u8 = 16;
    /// Some value did not fit a register (`mask` has the overflowed items
    /// of a `Result`).
    pub const OVERFLOW: u8 = 32;
    /// This vote reached its key's threshold (set by the switch that holds
    /// the key, read by the last switch of a chain).
    pub const QUORUM: u8 = 64;
    /// Every switch of the chain so far put its sums in this aggregation
    /// packet (a later switch may only emit a result when it is set).
    pub const SUMS: u8 = 128;

    /// Whether `bit` is set.
    pub fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }

    /// `self` with `bit` set.
    #[must_use]
    pub fn with(self, bit: u8) -> Flags {
        Flags(self.0 | bit)
    }
}

/// A data-plane address: which switch of a chain, which register group,
/// which index in the group.
///
/// ```text
///  31        24 23        16 15                         0
/// +------------+------------+----------------------------+
/// |   switch   |   group    |           index            |
/// +------------+------------+----------------------------+
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Addr(pub u32);

impl Addr {
    /// No data-plane address: the pair is for the server agent.
    pub const NONE: Addr = Addr(u32::MAX);

    /// Packs an address.
    pub fn new(switch: u8, group: u8, index: u16) -> Addr {
        Addr(u32::from(switch) << 24 | u32::from(group) << 16 | u32::from(index))
    }

    /// Switch of the chain (0 is the first).
    pub fn switch(self) -> u8 {
        (self.0 >> 24) as u8
    }

    /// Register group.
    pub fn group(self) -> u8 {
        (self.0 >> 16) as u8
    }

    /// Index within the group.
    pub fn index(self) -> u16 {
        self.0 as u16
    }

    /// Whether this is [`Addr::NONE`].
    pub fn is_none(self) -> bool {
        self == Addr::NONE
    }
}

impl fmt::Debug for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_none() {
            f.write_str("Addr(none)")
        } else {
            write!(f, "Addr({}/{}/{})", self.switch(), self.group(), self.index())
        }
    }
}

/// One key/value pair as the data plane sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pair {
    /// Logical address of the key (its 32-bit hash, or an array position).
    pub key: u32,
    /// Where the key lives in data-plane memory, or [`Addr::NONE`].
    pub addr: Addr,
    /// The 32-bit value (quantized for floats).
    pub value: i32,
}

/// What a wide item asks of the server agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WideOp {
    /// Add `value` to `key` in the server agent's map (also: register the
    /// key and ask for a data-plane address).
    Add = 1,
    /// Read `key`; the reply carries the value.
    Get = 2,
    /// A reply to [`WideOp::Get`].
    Value = 3,
    /// A vote for `key` (the instance's value) the data plane could not take.
    Vote = 4,
    /// An aggregation position the data plane could not add (overflow):
    /// `key` is the position, the packet's `aux` the chunk.
    AggPart = 5,
    /// The exact sum of an overflowed aggregation position.
    AggFix = 6,
    /// Clear the map (`Map.clear`).
    Clear = 7,
    /// From the server agent: vote on instance `key` (4 bytes, then the
    /// 4-byte address of its slot) for `value`.
    Propose = 8,
    /// An aggregation chunk (`key`, 4 bytes) is backed up on the server
    /// agent and its slot may be reused (the `copy` clear policy); from a
    /// member, a request for that notice.
    Release = 9,
    /// From a member: it heard of the commit of instance `key` (4 bytes).
    /// The server agent sends each commit notice again to the members that
    /// did not say so (a notice can be lost).
    CommitAck = 10,
    /// The data plane is gone. From the server agent to a member: send
    /// everything to me directly from now on (`value` 0), and give me your
    /// account ([`WideOp::Account`]) once everything you sent before is
    /// acknowledged (`value` 2), or: the data plane held values that cannot
    /// be rebuilt, every call fails (`value` 1).
    /// From a member that hears nothing through the switch, sent to the
    /// server agent directly: are you still there, and where do I send?
    Fallback = 11,
    /// From the server agent after the data plane is gone: send your
    /// contribution to chunk `key` (4 bytes) again (it is missing here).
    AggResend = 12,
    /// A member is alive (sent while it aggregates, see the server
    /// agent's leases); from the server agent, `key` (2 bytes) names a
    /// member whose lease ran out.
    Alive = 13,
    /// A member's *account*: what the data plane applied of its `Map.addTo`
    /// pairs, summed per logical key (`key`, 4 bytes). Sent when it leaves
    /// and when the data plane is lost; the packet's `aux` is the batch's
    /// index (low 16 bits) and the number of batches (high 16 bits). From
    /// the server agent, the batch `value` arrived (see
    /// [`crate::server::ServerAgent::data_plane_lost`]).
    Account = 14,
    /// From the server agent, under `MemberLoss: continue`: synchronous
    /// aggregation goes on without the members a lease was lost for. `key`
    /// (22 bytes, big-endian): the regroup's index (u16), the members lost
    /// (u64 bits), the shift of chunk ids from then on (u32), the number of
    /// blocks (u16), this block's first chunk (u32) and 2 bytes of zero;
    /// `value`: the chunks of the block the lost members had finished
    /// (bit *i* is chunk first + *i*). A member's heartbeat carries in its
    /// `value` the regroups it has applied.
    Regroup = 15,
}

impl WideOp {
    fn from_u8(v: u8) -> Option<WideOp> {
        Some(match v {
            1 => WideOp::Add,
            2 => WideOp::Get,
            3 => WideOp::Value,
            4 => WideOp::Vote,
            5 => WideOp::AggPart,
            6 => WideOp::AggFix,
            7 => WideOp::Clear,
            8 => WideOp::Propose,
            9 => WideOp::Release,
            10 => WideOp::CommitAck,
            11 => WideOp::Fallback,
            12 => WideOp::AggResend,
            13 => WideOp::Alive,
            14 => WideOp::Account,
            15 => WideOp::Regroup,
            _ => return None,
        })
    }
}

/// One host-only item: a whole key and a 64-bit value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Wide {
    /// What to do.
    pub op: WideOp,
    /// The key's bytes (at most [`MAX_KEY`]).
    pub key: Vec<u8>,
    /// The value.
    pub value: i64,
}

/// The items of a packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Items {
    /// Register-sized pairs (every kind but [`Kind::Wide`]).
    Pairs(Vec<Pair>),
    /// Host-only items ([`Kind::Wide`]).
    Wide(Vec<Wide>),
}

/// The fixed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What the packet asks for.
    pub kind: Kind,
    /// Flag bits.
    pub flags: Flags,
    /// Application id (from the controller).
    pub app: u16,
    /// Sending node.
    pub src: u16,
    /// Node the packet is for (the data plane routes on it).
    pub dst: u16,
    /// Flow id, global to the data plane (the controller hands out ranges).
    pub flow: u16,
    /// Extension flags ([`Header::SEQUENCED`]).
    pub ext: u16,
    /// Sequence number within the flow.
    pub seq: u32,
    /// Chunk id, vote instance or cumulative acknowledgement (by kind).
    pub aux: u32,
    /// One bit per item (the first 64): applied by the data plane, or
    /// overflowed.
    pub mask: u64,
}

/// A parsed packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    /// The header.
    pub header: Header,
    /// The items.
    pub items: Items,
}

/// Why bytes are not a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PacketError {
    /// Fewer bytes than the header or than the items need.
    Truncated,
    /// Bytes left over after the last item.
    Trailing,
    /// Not our magic number or version.
    NotInc,
    /// Unknown packet kind.
    Kind(u8),
    /// Unknown wide operation.
    WideOp(u8),
    /// More items than [`MAX_ITEMS`].
    TooManyItems(u8),
    /// A wide key longer than [`MAX_KEY`].
    KeyTooLong(u8),
    /// The MAC does not verify with the application's key.
    BadMac,
}

impl fmt::Display for PacketError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PacketError::Truncated => f.write_str("truncated packet"),
            PacketError::Trailing => f.write_str("bytes after the last item"),
            PacketError::NotInc => f.write_str("not an INC packet (magic or version)"),
            PacketError::Kind(k) => write!(f, "unknown packet kind {k}"),
            PacketError::WideOp(o) => write!(f, "unknown wide operation {o}"),
            PacketError::TooManyItems(n) => write!(f, "{n} items (at most {MAX_ITEMS})"),
            PacketError::KeyTooLong(n) => write!(f, "key of {n} bytes (at most {MAX_KEY})"),
            PacketError::BadMac => f.write_str("the MAC does not verify"),
        }
    }
}

impl std::error::Error for PacketError {}

/// Reads big-endian integers off the front of a slice.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], PacketError> {
        let (head, rest) = self.0.split_first_chunk::<N>().ok_or(PacketError::Truncated)?;
        self.0 = rest;
        Ok(*head)
    }
    fn u8(&mut self) -> Result<u8, PacketError> {
        Ok(self.take::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, PacketError> {
        Ok(u16::from_be_bytes(self.take()?))
    }
    fn u32(&mut self) -> Result<u32, PacketError> {
        Ok(u32::from_be_bytes(self.take()?))
    }
    fn bytes(&mut self, n: usize) -> Result<&[u8], PacketError> {
        if self.0.len() < n {
            return Err(PacketError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
}

impl Header {
    /// `ext` bit: `seq` is in the flow's sequence space (the sender numbers
    /// the packet and retransmits it until acknowledged). Every sequenced
    /// packet of a flow — host-only ones too — passes through the data
    /// plane's flip-bit slot for its number, so the slot always holds the
    /// flip of the flow's latest packet with that number.
    pub const SEQUENCED: u16 = 1;

    /// `ext` bit: a switch made this acknowledgement on the server agent's
    /// behalf (every pair applied). After the data plane is lost a member
    /// takes no such acknowledgement: the server agent may have added the
    /// packet itself since (see [`crate::server`]'s `accounts`).
    pub const BY_SWITCH: u16 = 2;

    /// The sender's incarnation (`ext` bits 8–15).
    pub fn incarnation(&self) -> u8 {
        (self.ext >> 8) as u8
    }

    /// Sets the incarnation.
    pub fn set_incarnation(&mut self, i: u8) {
        self.ext = (self.ext & 0x00ff) | (u16::from(i) << 8);
    }

    /// Switches this packet has crossed (`ext` bits 4–7).
    pub fn hops(&self) -> u16 {
        (self.ext >> 4) & 0xf
    }

    /// Counts one more switch; `false` (and unchanged) when the packet has
    /// crossed [`MAX_HOPS`] already.
    pub fn hop(&mut self) -> bool {
        let h = self.hops();
        if h >= MAX_HOPS {
            return false;
        }
        self.ext = (self.ext & !0x00f0) | ((h + 1) << 4);
        true
    }

    /// A header with every other field zero.
    pub fn new(kind: Kind, app: u16, src: u16, dst: u16) -> Header {
        Header {
            kind,
            flags: Flags::default(),
            app,
            src,
            dst,
            flow: 0,
            ext: 0,
            seq: 0,
            aux: 0,
            mask: 0,
        }
    }

    /// Parses only the header (a data plane reads this much before it
    /// decides what to do with the rest).
    pub fn decode(bytes: &[u8]) -> Result<(Header, u8), PacketError> {
        let mut r = Reader(bytes);
        if r.u16()? != MAGIC || r.u8()? != VERSION {
            return Err(PacketError::NotInc);
        }
        let kind_byte = r.u8()?;
        let kind = Kind::from_u8(kind_byte).ok_or(PacketError::Kind(kind_byte))?;
        let flags = Flags(r.u8()?);
        let count = r.u8()?;
        let header = Header {
            kind,
            flags,
            app: r.u16()?,
            src: r.u16()?,
            dst: r.u16()?,
            flow: r.u16()?,
            ext: r.u16()?,
            seq: r.u32()?,
            aux: r.u32()?,
            mask: u64::from_be_bytes(r.take()?),
        };
        if usize::from(count) > MAX_ITEMS {
            return Err(PacketError::TooManyItems(count));
        }
        Ok((header, count))
    }

    fn encode(&self, count: u8, out: &mut Vec<u8>) {
        out.extend_from_slice(&MAGIC.to_be_bytes());
        out.push(VERSION);
        out.push(self.kind as u8);
        out.push(self.flags.0);
        out.push(count);
        for v in [self.app, self.src, self.dst, self.flow, self.ext] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        for v in [self.seq, self.aux] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        out.extend_from_slice(&self.mask.to_be_bytes());
    }
}

impl Packet {
    /// A packet of pairs.
    pub fn pairs(header: Header, pairs: Vec<Pair>) -> Packet {
        Packet { header, items: Items::Pairs(pairs) }
    }

    /// A packet of wide items (`header.kind` should be [`Kind::Wide`]).
    pub fn wide(header: Header, items: Vec<Wide>) -> Packet {
        Packet { header, items: Items::Wide(items) }
    }

    /// The pairs, or an empty slice for a wide packet.
    pub fn pair_items(&self) -> &[Pair] {
        match &self.items {
            Items::Pairs(p) => p,
            Items::Wide(_) => &[],
        }
    }

    /// The wide items, or an empty slice for a packet of pairs.
    pub fn wide_items(&self) -> &[Wide] {
        match &self.items {
            Items::Wide(w) => w,
            Items::Pairs(_) => &[],
        }
    }

    /// Parses a whole datagram.
    pub fn decode(bytes: &[u8]) -> Result<Packet, PacketError> {
        let (header, count) = Header::decode(bytes)?;
        let mut r = Reader(&bytes[HEADER_LEN..]);
        let items = if header.kind == Kind::Wide {
            let mut items = Vec::with_capacity(usize::from(count));
            for _ in 0..count {
                let op_byte = r.u8()?;
                let op = WideOp::from_u8(op_byte).ok_or(PacketError::WideOp(op_byte))?;
                let len = r.u8()?;
                if usize::from(len) > MAX_KEY {
                    return Err(PacketError::KeyTooLong(len));
                }
                let key = r.bytes(usize::from(len))?.to_vec();
                let value = i64::from_be_bytes(r.take()?);
                items.push(Wide { op, key, value });
            }
            Items::Wide(items)
        } else {
            let mut pairs = Vec::with_capacity(usize::from(count));
            for _ in 0..count {
                let key = r.u32()?;
                let addr = Addr(r.u32()?);
                let value = r.u32()? as i32;
                pairs.push(Pair { key, addr, value });
            }
            Items::Pairs(pairs)
        };
        match r.0.len() {
            MAC_LEN => Ok(Packet { header, items }),
            n if n < MAC_LEN => Err(PacketError::Truncated),
            _ => Err(PacketError::Trailing),
        }
    }

    /// Parses a datagram whose MAC verifies with `key`.
    pub fn open(bytes: &[u8], key: &Key) -> Result<Packet, PacketError> {
        let p = Packet::decode(bytes)?;
        if !verify(bytes, key) {
            return Err(PacketError::BadMac);
        }
        Ok(p)
    }

    /// The packet as a datagram sealed with `key`.
    pub fn seal(&self, key: &Key) -> Vec<u8> {
        let mut out = self.to_bytes();
        seal(&mut out, key);
        out
    }

    /// Bytes [`Packet::encode`] writes.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN
            + MAC_LEN
            + match &self.items {
                Items::Pairs(p) => p.len() * PAIR_LEN,
                Items::Wide(w) => w.iter().map(|i| 2 + i.key.len() + 8).sum(),
            }
    }

    /// Appends the packet to `out`, with a zero MAC ([`seal`] writes the
    /// real one; [`Packet::seal`] does both).
    ///
    /// # Panics
    /// If the packet has more than [`MAX_ITEMS`] items or a key longer than
    /// [`MAX_KEY`]: agents never build such packets, so this is a bug.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let count = match &self.items {
            Items::Pairs(p) => p.len(),
            Items::Wide(w) => w.len(),
        };
        assert!(count <= MAX_ITEMS, "packet with {count} items");
        out.reserve(self.encoded_len());
        self.header.encode(count as u8, out);
        match &self.items {
            Items::Pairs(pairs) => {
                for p in pairs {
                    out.extend_from_slice(&p.key.to_be_bytes());
                    out.extend_from_slice(&p.addr.0.to_be_bytes());
                    out.extend_from_slice(&p.value.to_be_bytes());
                }
            }
            Items::Wide(items) => {
                for i in items {
                    assert!(i.key.len() <= MAX_KEY, "wide key of {} bytes", i.key.len());
                    out.push(i.op as u8);
                    out.push(i.key.len() as u8);
                    out.extend_from_slice(&i.key);
                    out.extend_from_slice(&i.value.to_be_bytes());
                }
            }
        }
        out.extend_from_slice(&[0; MAC_LEN]);
    }

    /// The packet as a fresh datagram with a zero MAC (what tests and the
    /// fuzz targets forge; the agents and the switch send [`Packet::seal`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        self.encode(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_packet_matches_its_test_vector() {
        let mut h = Header::new(Kind::Add, 7, 2, 1);
        h.flags = Flags(Flags::FLIP);
        h.flow = 3;
        h.ext = 16;
        h.seq = 0x0102_0304;
        h.aux = 9;
        h.mask = 0b11;
        let p = Packet::pairs(
            h,
            vec![Pair { key: 0xdead_beef, addr: Addr::new(0, 5, 300), value: -2 }],
        );
        let bytes = p.to_bytes();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "4e50020101010007000200010003001001020304000000090000000000000003\
             deadbeef0005012cfffffffe0000000000000000"
        );
        assert_eq!(Packet::decode(&bytes), Ok(p));
    }

    #[test]
    fn a_sealed_packet_opens_with_its_key_only() {
        let key = Key([7; 16]);
        let mut h = Header::new(Kind::Add, 7, 2, 1);
        h.set_incarnation(3);
        assert!(h.hop());
        assert_eq!((h.incarnation(), h.hops(), h.ext & Header::SEQUENCED), (3, 1, 0));
        let p = Packet::pairs(h, vec![Pair { key: 1, addr: Addr::NONE, value: 5 }]);
        let sealed = p.seal(&key);
        assert_eq!(Packet::open(&sealed, &key), Ok(p.clone()));
        assert_eq!(Packet::open(&sealed, &Key([8; 16])), Err(PacketError::BadMac));
        assert_eq!(Packet::open(&p.to_bytes(), &key), Err(PacketError::BadMac));
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 0x10;
            assert!(Packet::open(&bad, &key).is_err(), "byte {i} changed and still opened");
        }
        let mut far = h;
        for _ in 1..MAX_HOPS {
            assert!(far.hop());
        }
        assert!(!far.hop(), "no hop past MAX_HOPS");
        assert_eq!(far.hops(), MAX_HOPS);
    }

    #[test]
    fn a_wide_packet_round_trips_and_rejects_long_keys() {
        let h = Header::new(Kind::Wide, 1, 2, 3);
        let p =
            Packet::wide(h, vec![Wide { op: WideOp::Add, key: b"word".to_vec(), value: 1 << 40 }]);
        let mut bytes = p.to_bytes();
        assert_eq!(bytes.len(), p.encoded_len());
        assert_eq!(Packet::decode(&bytes), Ok(p));
        bytes[HEADER_LEN + 1] = 65;
        assert_eq!(Packet::decode(&bytes), Err(PacketError::KeyTooLong(65)));
    }

    #[test]
    fn malformed_packets_are_errors() {
        let p = Packet::pairs(Header::new(Kind::Agg, 1, 2, 3), vec![]);
        let good = p.to_bytes();
        assert_eq!(Packet::decode(&good[..HEADER_LEN - 1]), Err(PacketError::Truncated));
        let mut bad = good.clone();
        bad[3] = 99;
        assert_eq!(Packet::decode(&bad), Err(PacketError::Kind(99)));
        let mut bad = good.clone();
        bad[0] = 0;
        assert_eq!(Packet::decode(&bad), Err(PacketError::NotInc));
        let mut bad = good.clone();
        bad[5] = 1;
        assert_eq!(Packet::decode(&bad), Err(PacketError::Truncated));
        assert_eq!(Packet::decode(&good[..good.len() - 1]), Err(PacketError::Truncated));
        let mut bad = good;
        bad.push(0);
        assert_eq!(Packet::decode(&bad), Err(PacketError::Trailing));
    }
}
