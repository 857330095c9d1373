//! HPACK, the header compression of HTTP/2 (RFC 7541).
//!
//! [`Decoder`] turns a complete header block into fields and [`Encoder`] does the reverse; each
//! holds the dynamic table for one direction of a connection. Both are synchronous and
//! allocation-free in steady state: the decoder hands out borrowed slices and decodes Huffman
//! strings into a scratch buffer it reuses, and the dynamic table keeps its entries' bytes in one
//! reused buffer.
//!
//! # Limits
//!
//! Everything a peer can make the decoder hold is bounded. The dynamic table's buffer stays
//! within twice the table's maximum size, which starts at the protocol's 4096 octets and which
//! the peer may change only up to the SETTINGS_HEADER_TABLE_SIZE we advertise. The scratch
//! buffer holds the Huffman-decoded strings of one field, at most 8 decoded octets per 5 coded
//! ones of the block, whose size the caller bounds (HTTP/2 bounds it by its frame and
//! CONTINUATION limits); it is given back when a block made it larger than 64 KiB. Integers are
//! bounded by 2^31 - 1. Errors are HPACK's decoding errors, which are connection errors
//! (COMPRESSION_ERROR, RFC 9113 §4.3), except [`HpackError::ListTooLarge`], which concerns one
//! stream only.

use std::collections::VecDeque;
use std::fmt;

use crate::huffman;

/// The initial size of a dynamic table, in octets: HTTP/2's initial SETTINGS_HEADER_TABLE_SIZE
/// (RFC 9113 §6.5.2).
pub const DEFAULT_TABLE_SIZE: usize = 4096;

/// The size an entry adds to its table beyond its name and value (RFC 7541 §4.1).
const ENTRY_OVERHEAD: usize = 32;

/// The largest integer accepted from a peer. No HPACK quantity is legitimately larger (a string
/// is shorter than its header block, an index or a table size far smaller), and it fits a
/// `usize` on every platform.
const MAX_INTEGER: u64 = (1 << 31) - 1;

/// The most continuation bytes of an integer: 5 give 35 bits, enough for [`MAX_INTEGER`] plus any
/// prefix (RFC 7541 §5.1 leaves the limit to the implementation).
const MAX_CONTINUATION: usize = 5;

/// The static table (RFC 7541 Appendix A); index `i` is at `STATIC[i - 1]`.
const STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),                   // 1
    (b":method", b"GET"),                   // 2
    (b":method", b"POST"),                  // 3
    (b":path", b"/"),                       // 4
    (b":path", b"/index.html"),             // 5
    (b":scheme", b"http"),                  // 6
    (b":scheme", b"https"),                 // 7
    (b":status", b"200"),                   // 8
    (b":status", b"204"),                   // 9
    (b":status", b"206"),                   // 10
    (b":status", b"304"),                   // 11
    (b":status", b"400"),                   // 12
    (b":status", b"404"),                   // 13
    (b":status", b"500"),                   // 14
    (b"accept-charset", b""),               // 15
    (b"accept-encoding", b"gzip, deflate"), // 16
    (b"accept-language", b""),              // 17
    (b"accept-ranges", b""),                // 18
    (b"accept", b""),                       // 19
    (b"access-control-allow-origin", b""),  // 20
    (b"age", b""),                          // 21
    (b"allow", b""),                        // 22
    (b"authorization", b""),                // 23
    (b"cache-control", b""),                // 24
    (b"content-disposition", b""),          // 25
    (b"content-encoding", b""),             // 26
    (b"content-language", b""),             // 27
    (b"content-length", b""),               // 28
    (b"content-location", b""),             // 29
    (b"content-range", b""),                // 30
    (b"content-type", b""),                 // 31
    (b"cookie", b""),                       // 32
    (b"date", b""),                         // 33
    (b"etag", b""),                         // 34
    (b"expect", b""),                       // 35
    (b"expires", b""),                      // 36
    (b"from", b""),                         // 37
    (b"host", b""),                         // 38
    (b"if-match", b""),                     // 39
    (b"if-modified-since", b""),            // 40
    (b"if-none-match", b""),                // 41
    (b"if-range", b""),                     // 42
    (b"if-unmodified-since", b""),          // 43
    (b"last-modified", b""),                // 44
    (b"link", b""),                         // 45
    (b"location", b""),                     // 46
    (b"max-forwards", b""),                 // 47
    (b"proxy-authenticate", b""),           // 48
    (b"proxy-authorization", b""),          // 49
    (b"range", b""),                        // 50
    (b"referer", b""),                      // 51
    (b"refresh", b""),                      // 52
    (b"retry-after", b""),                  // 53
    (b"server", b""),                       // 54
    (b"set-cookie", b""),                   // 55
    (b"strict-transport-security", b""),    // 56
    (b"transfer-encoding", b""),            // 57
    (b"user-agent", b""),                   // 58
    (b"vary", b""),                         // 59
    (b"via", b""),                          // 60
    (b"www-authenticate", b""),             // 61
];

/// An HPACK decoding error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HpackError {
    /// The block ends inside a representation.
    Truncated,
    /// An integer is above 2^31 - 1 or has more than 5 continuation bytes.
    IntegerOverflow,
    /// An index is 0 or beyond the static and dynamic tables.
    BadIndex(usize),
    /// A Huffman-coded string is invalid: it contains EOS or an incomplete code, or its padding
    /// is longer than 7 bits or not all ones (RFC 7541 §5.2).
    BadHuffman,
    /// A dynamic table size update is above the size we advertised, or follows a field
    /// representation (RFC 7541 §4.2).
    BadSizeUpdate,
    /// The decoded header list exceeds the limit given to [`Decoder::decode`]. The block was
    /// still decoded to its end, so the decoder remains usable.
    ListTooLarge,
}

impl HpackError {
    /// Whether the error ends the connection (COMPRESSION_ERROR, RFC 9113 §4.3): every error
    /// but [`HpackError::ListTooLarge`], after which the decoder is still in step with the peer
    /// and only the stream is refused.
    pub fn is_connection_error(&self) -> bool {
        !matches!(self, HpackError::ListTooLarge)
    }
}

impl fmt::Display for HpackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HpackError::Truncated => f.write_str("header block ends inside a representation"),
            HpackError::IntegerOverflow => f.write_str("HPACK integer too large"),
            HpackError::BadIndex(i) => write!(f, "HPACK index {i} out of range"),
            HpackError::BadHuffman => f.write_str("invalid Huffman-coded string"),
            HpackError::BadSizeUpdate => f.write_str("invalid dynamic table size update"),
            HpackError::ListTooLarge => f.write_str("header list larger than the limit"),
        }
    }
}

impl std::error::Error for HpackError {}

/// Appends the HPACK integer `value` with a `prefix_bits`-bit prefix (RFC 7541 §5.1).
///
/// `first_byte_flags` supplies the bits of the first byte above the prefix (the
/// representation's pattern); its prefix bits must be zero.
#[inline]
pub(crate) fn encode_integer(
    value: usize,
    prefix_bits: u8,
    first_byte_flags: u8,
    out: &mut Vec<u8>,
) {
    debug_assert!((1..=8).contains(&prefix_bits));
    let max = (1usize << prefix_bits) - 1;
    if value < max {
        out.push(first_byte_flags | value as u8);
        return;
    }
    out.push(first_byte_flags | max as u8);
    let mut rest = value - max;
    while rest >= 0x80 {
        out.push(rest as u8 | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// Reads the HPACK integer with a `prefix_bits`-bit prefix at the start of `src` (RFC 7541
/// §5.1), ignoring the bits above the prefix. Returns the value and the bytes it took.
#[inline]
pub(crate) fn decode_integer(src: &[u8], prefix_bits: u8) -> Result<(usize, usize), HpackError> {
    debug_assert!((1..=8).contains(&prefix_bits));
    let max = ((1u16 << prefix_bits) - 1) as u8;
    let first = src.first().ok_or(HpackError::Truncated)? & max;
    if first < max {
        return Ok((usize::from(first), 1));
    }
    let mut value = u64::from(max);
    for i in 1..=MAX_CONTINUATION {
        let b = *src.get(i).ok_or(HpackError::Truncated)?;
        value += u64::from(b & 0x7f) << (7 * (i - 1));
        if b & 0x80 == 0 {
            return if value <= MAX_INTEGER {
                Ok((value as usize, i + 1))
            } else {
                Err(HpackError::IntegerOverflow)
            };
        }
    }
    Err(HpackError::IntegerOverflow)
}

/// Appends the string literal `s` (RFC 7541 §5.2), Huffman-coded when that is shorter.
fn encode_string(s: &[u8], huffman: bool, out: &mut Vec<u8>) {
    let coded = if huffman { huffman::encoded_len(s) } else { usize::MAX };
    if coded < s.len() {
        encode_integer(coded, 7, 0x80, out);
        huffman::encode(s, out);
    } else {
        encode_integer(s.len(), 7, 0x00, out);
        out.extend_from_slice(s);
    }
}

/// The entries of the static table with name `name`, as `(first, last)` indices, or
/// [`NO_MATCH`].
///
/// A `match` on the length, then on the few names of that length, each a short fixed-size
/// compare: no scan of the table.
fn static_names(name: &[u8]) -> (usize, usize) {
    match name.len() {
        3 => match name {
            b"age" => (21, 21),
            b"via" => (60, 60),
            _ => NO_MATCH,
        },
        4 => match name {
            b"date" => (33, 33),
            b"etag" => (34, 34),
            b"from" => (37, 37),
            b"host" => (38, 38),
            b"link" => (45, 45),
            b"vary" => (59, 59),
            _ => NO_MATCH,
        },
        5 => match name {
            b":path" => (4, 5),
            b"allow" => (22, 22),
            b"range" => (50, 50),
            _ => NO_MATCH,
        },
        6 => match name {
            b"accept" => (19, 19),
            b"cookie" => (32, 32),
            b"expect" => (35, 35),
            b"server" => (54, 54),
            _ => NO_MATCH,
        },
        7 => match name {
            b":method" => (2, 3),
            b":scheme" => (6, 7),
            b":status" => (8, 14),
            b"expires" => (36, 36),
            b"referer" => (51, 51),
            b"refresh" => (52, 52),
            _ => NO_MATCH,
        },
        8 => match name {
            b"if-match" => (39, 39),
            b"if-range" => (42, 42),
            b"location" => (46, 46),
            _ => NO_MATCH,
        },
        10 => match name {
            b":authority" => (1, 1),
            b"set-cookie" => (55, 55),
            b"user-agent" => (58, 58),
            _ => NO_MATCH,
        },
        11 => match name {
            b"retry-after" => (53, 53),
            _ => NO_MATCH,
        },
        12 => match name {
            b"content-type" => (31, 31),
            b"max-forwards" => (47, 47),
            _ => NO_MATCH,
        },
        13 => match name {
            b"accept-ranges" => (18, 18),
            b"authorization" => (23, 23),
            b"cache-control" => (24, 24),
            b"content-range" => (30, 30),
            b"if-none-match" => (41, 41),
            b"last-modified" => (44, 44),
            _ => NO_MATCH,
        },
        14 => match name {
            b"accept-charset" => (15, 15),
            b"content-length" => (28, 28),
            _ => NO_MATCH,
        },
        15 => match name {
            b"accept-encoding" => (16, 16),
            b"accept-language" => (17, 17),
            _ => NO_MATCH,
        },
        16 => match name {
            b"content-encoding" => (26, 26),
            b"content-language" => (27, 27),
            b"content-location" => (29, 29),
            b"www-authenticate" => (61, 61),
            _ => NO_MATCH,
        },
        17 => match name {
            b"if-modified-since" => (40, 40),
            b"transfer-encoding" => (57, 57),
            _ => NO_MATCH,
        },
        18 => match name {
            b"proxy-authenticate" => (48, 48),
            _ => NO_MATCH,
        },
        19 => match name {
            b"content-disposition" => (25, 25),
            b"if-unmodified-since" => (43, 43),
            b"proxy-authorization" => (49, 49),
            _ => NO_MATCH,
        },
        25 => match name {
            b"strict-transport-security" => (56, 56),
            _ => NO_MATCH,
        },
        27 => match name {
            b"access-control-allow-origin" => (20, 20),
            _ => NO_MATCH,
        },
        _ => NO_MATCH,
    }
}

/// The result of [`static_names`] for a name absent from the static table.
const NO_MATCH: (usize, usize) = (0, 0);

/// Looks `name: value` up in the static table: `(full match, name match)` indices.
#[inline]
fn static_lookup(name: &[u8], value: &[u8]) -> (Option<usize>, Option<usize>) {
    let (first, last) = static_names(name);
    if first == 0 {
        return (None, None);
    }
    // At most 7 values (`:status`); most names have one, empty.
    let full = (first..=last).find(|&i| STATIC[i - 1].1 == value);
    (full, Some(first))
}

/// An entry of a dynamic table: where its name and value lie in [`Table::bytes`].
#[derive(Clone, Copy, Debug)]
struct Entry {
    /// The offset of the name, followed by the value.
    at: usize,
    name_len: usize,
    value_len: usize,
}

impl Entry {
    fn size(&self) -> usize {
        self.name_len + self.value_len + ENTRY_OVERHEAD
    }
}

/// The name of an entry being inserted.
#[derive(Clone, Copy, Debug)]
enum Name<'a> {
    /// Bytes from outside the table.
    Bytes(&'a [u8]),
    /// The name of an entry of the table, `(at, len)`: it may be evicted by the insertion
    /// (RFC 7541 §4.4), so its bytes are copied before anything is reclaimed.
    Entry(usize, usize),
}

/// A dynamic table (RFC 7541 §2.3.2 and §4).
///
/// Entries' names and values live back to back in one byte buffer, oldest first, rather than
/// in a box per entry: inserting allocates nothing once the buffer has its capacity. Eviction
/// only drops the oldest entry's record and leaves its bytes as a dead prefix, reclaimed (one
/// `memmove` of the live bytes) when an insertion finds the buffer full. The buffer then gets
/// room for twice the live bytes, but no more than twice the maximum size: the bytes moved are
/// paid for by as many inserted before the next reclaim (for entries small against the table,
/// as in gRPC), and the buffer never exceeds twice the largest maximum size in effect, whatever
/// the peer sends.
#[derive(Debug)]
struct Table {
    bytes: Vec<u8>,
    /// Newest first: `entries[0]` has index 62.
    entries: VecDeque<Entry>,
    /// The sum of the entries' sizes (RFC 7541 §4.1).
    size: usize,
    /// The maximum size (RFC 7541 §4.2).
    max: usize,
}

impl Table {
    fn new(max: usize) -> Table {
        Table { bytes: Vec::new(), entries: VecDeque::new(), size: 0, max }
    }

    fn name(&self, e: Entry) -> &[u8] {
        &self.bytes[e.at..e.at + e.name_len]
    }

    fn value(&self, e: Entry) -> &[u8] {
        let start = e.at + e.name_len;
        &self.bytes[start..start + e.value_len]
    }

    /// The entry with HPACK index `index` (62 and above), if any.
    fn get(&self, index: usize) -> Option<Entry> {
        self.entries.get(index.checked_sub(STATIC.len() + 1)?).copied()
    }

    /// Sets the maximum size, evicting entries to fit (RFC 7541 §4.3).
    fn set_max(&mut self, max: usize) {
        self.max = max;
        self.evict_for(0);
        if self.entries.is_empty() {
            self.bytes.clear();
        }
    }

    /// Evicts the oldest entries until `room` more octets fit.
    fn evict_for(&mut self, room: usize) {
        while self.size + room > self.max {
            match self.entries.pop_back() {
                Some(e) => self.size -= e.size(),
                None => break,
            }
        }
    }

    /// Adds an entry (RFC 7541 §4.4): evicts to make room, or empties the table if the entry is
    /// larger than the maximum size.
    fn insert(&mut self, name: Name<'_>, value: &[u8]) {
        let name_len = match name {
            Name::Bytes(b) => b.len(),
            Name::Entry(_, len) => len,
        };
        let size = name_len + value.len() + ENTRY_OVERHEAD;
        if size > self.max {
            self.entries.clear();
            self.bytes.clear();
            self.size = 0;
            return;
        }
        let mut name = name;
        if self.bytes.len() + name_len + value.len() > self.bytes.capacity() {
            // Reclaim the dead prefix, before evicting for the new entry: a name borrowed from
            // an entry about to be evicted must stay.
            let dead = self.entries.back().map_or(self.bytes.len(), |e| e.at);
            self.bytes.drain(..dead);
            for e in &mut self.entries {
                e.at -= dead;
            }
            if let Name::Entry(at, _) = &mut name {
                *at -= dead;
            }
            // Room for twice the live bytes with the new entry, capped at twice the maximum
            // size, which holds them (at most `max` live bytes, and an entry of at most `max`).
            let live = self.bytes.len() + name_len + value.len();
            let capacity = live.saturating_mul(2).min(self.max.saturating_mul(2)).max(live);
            self.bytes.reserve_exact(capacity - self.bytes.len());
        }
        self.evict_for(size);
        let at = self.bytes.len();
        match name {
            Name::Bytes(b) => self.bytes.extend_from_slice(b),
            Name::Entry(from, len) => self.bytes.extend_from_within(from..from + len),
        }
        self.bytes.extend_from_slice(value);
        self.entries.push_front(Entry { at, name_len, value_len: value.len() });
        self.size += size;
    }

    /// Looks `name: value` up, newest first: `(full match, name match)` indices.
    ///
    /// A linear scan: gRPC connections hold a handful of entries (the authority, the paths in
    /// use, a user agent), and lengths are compared before bytes.
    fn find(&self, name: &[u8], value: &[u8]) -> (Option<usize>, Option<usize>) {
        let mut name_match = None;
        for (i, &e) in self.entries.iter().enumerate() {
            if e.name_len == name.len() && self.name(e) == name {
                let index = STATIC.len() + 1 + i;
                if e.value_len == value.len() && self.value(e) == value {
                    return (Some(index), Some(index));
                }
                name_match.get_or_insert(index);
            }
        }
        (None, name_match)
    }
}

/// Where a decoded string lies.
#[derive(Clone, Copy, Debug)]
enum Str {
    Static(&'static [u8]),
    /// `(at, len)` in the dynamic table's bytes.
    Table(usize, usize),
    /// `start..end` in the block.
    Block(usize, usize),
    /// `start..end` in the decoder's scratch buffer (a Huffman-coded literal).
    Scratch(usize, usize),
}

impl Str {
    fn bytes<'a>(self, block: &'a [u8], scratch: &'a [u8], table: &'a [u8]) -> &'a [u8] {
        match self {
            Str::Static(s) => s,
            Str::Table(at, len) => &table[at..at + len],
            Str::Block(start, end) => &block[start..end],
            Str::Scratch(start, end) => &scratch[start..end],
        }
    }
}

/// Reads the string literal at `block[pos..]`: where it lies, and the position after it.
///
/// A raw literal stays in the block; a Huffman-coded one is decoded onto the end of `scratch`.
///
/// A literal longer than the header list limit is still read, not refused: the block is
/// decoded to its end either way (see [`Decoder::decode`]), and the literal's size is bounded
/// by the block's.
fn read_string(
    block: &[u8],
    pos: usize,
    scratch: &mut Vec<u8>,
) -> Result<(Str, usize), HpackError> {
    let src = block.get(pos..).unwrap_or_default();
    let huffman = src.first().is_some_and(|b| b & 0x80 != 0);
    let (len, n) = decode_integer(src, 7)?;
    let start = pos + n;
    let end = start + len;
    let raw = block.get(start..end).ok_or(HpackError::Truncated)?;
    if huffman {
        let from = scratch.len();
        huffman::decode(raw, scratch).map_err(|_| HpackError::BadHuffman)?;
        Ok((Str::Scratch(from, scratch.len()), end))
    } else {
        Ok((Str::Block(start, end), end))
    }
}

/// The most scratch capacity a decoder keeps between blocks.
const SCRATCH_KEEP: usize = 64 << 10;

/// The decoding side of HPACK for one connection: the peer's dynamic table.
///
/// Feed it every header block the peer sends, in order, including those of streams that are
/// refused or reset: each may change the table (RFC 9113 §4.3).
#[derive(Debug)]
pub struct Decoder {
    table: Table,
    /// The SETTINGS_HEADER_TABLE_SIZE we advertise: the most a size update may ask for.
    limit: usize,
    /// Huffman-decoded name and value of the current field.
    scratch: Vec<u8>,
}

impl Decoder {
    /// A decoder for a connection on which we advertise SETTINGS_HEADER_TABLE_SIZE
    /// `max_table_size`.
    ///
    /// The dynamic table starts at the protocol's initial 4096 octets, as the peer's encoder
    /// does, and changes only with the peer's size updates (RFC 7541 §4.2), which may not
    /// exceed `max_table_size`. (Starting at any other size would put the two tables out of
    /// step: the peer evicts by the size it has signalled, not by the size we advertised.)
    pub fn new(max_table_size: usize) -> Decoder {
        Decoder {
            table: Table::new(DEFAULT_TABLE_SIZE),
            limit: max_table_size,
            scratch: Vec::new(),
        }
    }

    /// Decodes one complete header block (a HEADERS or PUSH_PROMISE fragment and its
    /// CONTINUATION fragments, concatenated), calling `field(name, value)` for every field, in
    /// order.
    ///
    /// The slices are valid only during the call. Names and values are passed as sent: HPACK
    /// does not check them against HTTP's field syntax (RFC 9113 §8.2.1 is the caller's).
    ///
    /// `max_list` bounds the header list as RFC 9113 §6.5.2 accounts it: the sum over fields of
    /// `name.len() + value.len() + 32`. Once it is exceeded, later fields are no longer passed
    /// to `field`, but the block is decoded to its end so that the dynamic table stays in step
    /// with the peer's, and `Err(ListTooLarge)` is returned: the stream is refused, the
    /// connection goes on. That holds for a single literal longer than `max_list` too.
    ///
    /// Any other error is a connection error and leaves the decoder unusable: the table may be
    /// partly updated.
    pub fn decode<F: FnMut(&[u8], &[u8])>(
        &mut self,
        block: &[u8],
        max_list: usize,
        mut field: F,
    ) -> Result<(), HpackError> {
        let mut pos = 0;
        let mut list = 0usize;
        // Size updates are allowed only before the first field (RFC 7541 §4.2).
        let mut at_start = true;
        while let Some(&first) = block.get(pos) {
            if first & 0x80 != 0 {
                // Indexed header field (RFC 7541 §6.1).
                let (index, n) = decode_integer(&block[pos..], 7)?;
                pos += n;
                at_start = false;
                let (name, value) = match index {
                    1..=61 => STATIC[index - 1],
                    _ => {
                        let e = self.table.get(index).ok_or(HpackError::BadIndex(index))?;
                        (self.table.name(e), self.table.value(e))
                    }
                };
                list = list.saturating_add(name.len() + value.len() + ENTRY_OVERHEAD);
                if list <= max_list {
                    field(name, value);
                }
                continue;
            }
            if first & 0xe0 == 0x20 {
                // Dynamic table size update (RFC 7541 §6.3).
                let (size, n) = decode_integer(&block[pos..], 5)?;
                pos += n;
                if !at_start || size > self.limit {
                    return Err(HpackError::BadSizeUpdate);
                }
                self.table.set_max(size);
                continue;
            }
            // Literal header field with incremental indexing (01, 6-bit prefix), without
            // indexing (0000) or never indexed (0001), both with a 4-bit prefix (RFC 7541 §6.2).
            at_start = false;
            let indexing = first & 0x40 != 0;
            let (index, n) = decode_integer(&block[pos..], if indexing { 6 } else { 4 })?;
            pos += n;
            self.scratch.clear();
            let name = match index {
                0 => {
                    let (name, next) = read_string(block, pos, &mut self.scratch)?;
                    pos = next;
                    name
                }
                1..=61 => Str::Static(STATIC[index - 1].0),
                _ => {
                    let e = self.table.get(index).ok_or(HpackError::BadIndex(index))?;
                    Str::Table(e.at, e.name_len)
                }
            };
            let (value, next) = read_string(block, pos, &mut self.scratch)?;
            pos = next;
            let value = value.bytes(block, &self.scratch, &[]);
            {
                let name = name.bytes(block, &self.scratch, &self.table.bytes);
                list = list.saturating_add(name.len() + value.len() + ENTRY_OVERHEAD);
                if list <= max_list {
                    field(name, value);
                }
            }
            if indexing {
                let name = match name {
                    Str::Table(at, len) => Name::Entry(at, len),
                    other => Name::Bytes(other.bytes(block, &self.scratch, &[])),
                };
                self.table.insert(name, value);
            }
        }
        if self.scratch.capacity() > SCRATCH_KEEP {
            self.scratch = Vec::new();
        }
        if list > max_list {
            return Err(HpackError::ListTooLarge);
        }
        Ok(())
    }

    /// The current size of the dynamic table in octets (RFC 7541 §4.1).
    pub fn table_size(&self) -> usize {
        self.table.size
    }
}

/// How a field that is not found whole in a table is represented (RFC 7541 §6.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Index {
    /// A literal with incremental indexing: added to the dynamic table, so that repeats of the
    /// field are a single index. For fields that recur on the connection.
    Yes,
    /// A literal without indexing: for values that change on every use (a timeout, a length).
    No,
    /// A literal that intermediaries must never index either (RFC 7541 §7.1.3): for sensitive
    /// values (credentials, cookies), which then are never found whole in a table, either, so
    /// that their compression reveals nothing about previous values.
    Never,
}

/// The encoding side of HPACK for one connection: our dynamic table, as the peer's decoder
/// holds it.
#[derive(Debug)]
pub struct Encoder {
    table: Table,
    /// Changes of the maximum table size not yet signalled: `(smallest, last)`.
    pending: Option<(usize, usize)>,
    /// Whether strings may be Huffman-coded (always, but for tests of RFC 7541's raw examples).
    huffman: bool,
}

impl Default for Encoder {
    fn default() -> Encoder {
        Encoder::new()
    }
}

impl Encoder {
    /// An encoder with the protocol's initial dynamic table size, [`DEFAULT_TABLE_SIZE`].
    pub fn new() -> Encoder {
        Encoder { table: Table::new(DEFAULT_TABLE_SIZE), pending: None, huffman: true }
    }

    /// Applies the peer's SETTINGS_HEADER_TABLE_SIZE.
    ///
    /// The encoder uses `min(n, DEFAULT_TABLE_SIZE)`: a larger table costs memory for a
    /// compression gain gRPC headers do not need. The change takes effect at the next
    /// [`begin`](Encoder::begin), which signals it; if the size shrank and then grew since the
    /// previous block, both the smallest and the final size are signalled (RFC 7541 §4.2), so
    /// that the peer evicts as we do.
    pub fn set_max_table_size(&mut self, n: usize) {
        let n = n.min(DEFAULT_TABLE_SIZE);
        self.pending = match self.pending {
            None if n == self.table.max => None,
            None => Some((n, n)),
            Some((smallest, _)) => Some((smallest.min(n), n)),
        };
    }

    /// Starts a header block: appends the pending dynamic table size updates, if any.
    ///
    /// Call it before the first [`encode`](Encoder::encode) of every block. Until then, a new
    /// size does not affect the encoding, which stays in step with the peer's table.
    pub fn begin(&mut self, out: &mut Vec<u8>) {
        if let Some((smallest, last)) = self.pending.take() {
            if smallest < last && smallest < self.table.max {
                encode_integer(smallest, 5, 0x20, out);
                self.table.set_max(smallest);
            }
            if last != self.table.max {
                encode_integer(last, 5, 0x20, out);
                self.table.set_max(last);
            }
        }
    }

    /// Appends the representation of the field `name: value` (`name` already lowercase).
    ///
    /// A field found whole in the static or the dynamic table becomes an index, except with
    /// [`Index::Never`], which is always a never-indexed literal. Otherwise the literal names
    /// its name by index when a table has it (the static table first), and is represented as
    /// `index` asks; [`Index::Yes`] falls back to a literal without indexing for a field larger
    /// than the whole table, which would only empty it. Strings are Huffman-coded when that is
    /// shorter (on a tie they are sent raw: as short, and cheaper to decode).
    ///
    /// The static table is searched by a `match` on the name; the dynamic table by a linear
    /// scan from the newest entry (see [`Index::Yes`]: gRPC indexes few fields).
    pub fn encode(&mut self, name: &[u8], value: &[u8], index: Index, out: &mut Vec<u8>) {
        let (static_full, static_name) = static_lookup(name, value);
        if index != Index::Never {
            if let Some(i) = static_full {
                encode_integer(i, 7, 0x80, out);
                return;
            }
        }
        // The dynamic table is searched for the whole field, unless it is never indexed, and
        // for the name, unless the static table has it.
        let (dynamic_full, dynamic_name) = if index == Index::Never && static_name.is_some() {
            (None, None)
        } else {
            self.table.find(name, value)
        };
        if let (Some(i), true) = (dynamic_full, index != Index::Never) {
            encode_integer(i, 7, 0x80, out);
            return;
        }
        let name_index = static_name.or(dynamic_name);
        let indexing =
            index == Index::Yes && name.len() + value.len() + ENTRY_OVERHEAD <= self.table.max;
        let (prefix, flags) = match index {
            _ if indexing => (6, 0x40),
            Index::Never => (4, 0x10),
            _ => (4, 0x00),
        };
        encode_integer(name_index.unwrap_or(0), prefix, flags, out);
        if name_index.is_none() {
            encode_string(name, self.huffman, out);
        }
        encode_string(value, self.huffman, out);
        if indexing {
            self.table.insert(Name::Bytes(name), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Fields = Vec<(Vec<u8>, Vec<u8>)>;

    const BIG: usize = 1 << 20;

    fn hex(s: &str) -> Vec<u8> {
        let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
        digits
            .chunks(2)
            .map(|p| {
                let d = |c: u8| (c as char).to_digit(16).map_or(0, |d| d as u8);
                d(p[0]) << 4 | d(p[1])
            })
            .collect()
    }

    fn owned(list: &[(&str, &str)]) -> Fields {
        list.iter().map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec())).collect()
    }

    fn decode(d: &mut Decoder, block: &[u8], max_list: usize) -> (Fields, Result<(), HpackError>) {
        let mut fields = Vec::new();
        let r = d.decode(block, max_list, |n, v| fields.push((n.to_vec(), v.to_vec())));
        (fields, r)
    }

    /// The dynamic table's entries, newest first.
    fn entries(t: &Table) -> Fields {
        t.entries.iter().map(|&e| (t.name(e).to_vec(), t.value(e).to_vec())).collect()
    }

    fn encode(e: &mut Encoder, list: &[(&str, &str)], index: Index) -> Vec<u8> {
        let mut out = Vec::new();
        e.begin(&mut out);
        for (n, v) in list {
            e.encode(n.as_bytes(), v.as_bytes(), index, &mut out);
        }
        out
    }

    /// One header block of an RFC 7541 Appendix C sequence: its encoding, its fields, and the
    /// dynamic table after it (newest first) with its size.
    struct Step<'a> {
        block: &'a str,
        fields: &'a [(&'a str, &'a str)],
        table: &'a [(&'a str, &'a str)],
        size: usize,
        /// Our encoding, where it differs from the RFC's.
        ours: Option<&'a str>,
    }

    /// Decodes each block and checks fields and table; encodes each field list with
    /// incremental indexing and checks the bytes are the RFC's.
    fn sequence(mut decoder: Decoder, mut encoder: Encoder, steps: &[Step<'_>]) {
        for (i, step) in steps.iter().enumerate() {
            let block = hex(step.block);
            assert_eq!(decode(&mut decoder, &block, BIG), (owned(step.fields), Ok(())), "{i}");
            assert_eq!(entries(&decoder.table), owned(step.table), "{i}");
            assert_eq!(decoder.table_size(), step.size, "{i}");
            let ours = step.ours.map_or_else(|| block.clone(), hex);
            assert_eq!(encode(&mut encoder, step.fields, Index::Yes), ours, "{i}");
            assert_eq!(ours.len(), block.len());
            assert_eq!(entries(&encoder.table), owned(step.table), "{i}");
            assert_eq!(encoder.table.size, step.size, "{i}");
        }
    }

    fn raw_encoder() -> Encoder {
        Encoder { huffman: false, ..Encoder::new() }
    }

    #[test]
    fn c1_integers() {
        let cases: [(usize, u8, &[u8]); 3] =
            [(10, 5, &[0x0a]), (1337, 5, &[0x1f, 0x9a, 0x0a]), (42, 8, &[0x2a])];
        for (value, prefix, bytes) in cases {
            let mut out = Vec::new();
            encode_integer(value, prefix, 0, &mut out);
            assert_eq!(out, bytes, "{value}");
            assert_eq!(decode_integer(bytes, prefix), Ok((value, bytes.len())));
        }
        // Bits above the prefix are flags, kept on encode and ignored on decode.
        let mut out = Vec::new();
        encode_integer(1337, 5, 0xe0, &mut out);
        assert_eq!(out, [0xff, 0x9a, 0x0a]);
        assert_eq!(decode_integer(&[0xea], 5), Ok((10, 1)));
        // Boundaries: 2^N - 1 takes a zero continuation byte; the largest value accepted.
        assert_eq!(decode_integer(&[0x1f, 0x00], 5), Ok((31, 2)));
        let mut out = Vec::new();
        encode_integer(MAX_INTEGER as usize, 7, 0, &mut out);
        assert_eq!(decode_integer(&out, 7), Ok((MAX_INTEGER as usize, out.len())));
        // Redundant zero continuations are valid within the 5-byte limit.
        assert_eq!(decode_integer(&[0x1f, 0x80, 0x80, 0x80, 0x80, 0x00], 5), Ok((31, 6)));
    }

    #[test]
    fn integer_errors() {
        assert_eq!(decode_integer(&[], 5), Err(HpackError::Truncated));
        assert_eq!(decode_integer(&[0x1f], 5), Err(HpackError::Truncated));
        assert_eq!(decode_integer(&[0x1f, 0x80, 0x80], 5), Err(HpackError::Truncated));
        // A sixth continuation byte.
        assert_eq!(
            decode_integer(&[0x1f, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00], 5),
            Err(HpackError::IntegerOverflow)
        );
        // 2^31 - 1 + 1.
        let mut out = Vec::new();
        encode_integer(MAX_INTEGER as usize + 1, 7, 0, &mut out);
        assert_eq!(decode_integer(&out, 7), Err(HpackError::IntegerOverflow));
        assert_eq!(
            decode_integer(&[0x7f, 0xff, 0xff, 0xff, 0xff, 0x0f], 7),
            Err(HpackError::IntegerOverflow)
        );
    }

    #[test]
    fn c2_field_representations() {
        /// The block, its field, how to encode it, and the table after it with its size.
        type Case<'a> = (&'a str, (&'a str, &'a str), Index, &'a [(&'a str, &'a str)], usize);
        let cases: [Case<'_>; 4] = [
            (
                "400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572",
                ("custom-key", "custom-header"),
                Index::Yes,
                &[("custom-key", "custom-header")],
                55,
            ),
            ("040c 2f73 616d 706c 652f 7061 7468", (":path", "/sample/path"), Index::No, &[], 0),
            (
                "1008 7061 7373 776f 7264 0673 6563 7265 74",
                ("password", "secret"),
                Index::Never,
                &[],
                0,
            ),
            ("82", (":method", "GET"), Index::Yes, &[], 0),
        ];
        for (block, field, index, table, size) in cases {
            let block = hex(block);
            let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
            assert_eq!(decode(&mut d, &block, BIG), (owned(&[field]), Ok(())));
            assert_eq!(entries(&d.table), owned(table));
            assert_eq!(d.table_size(), size);
            let mut e = raw_encoder();
            assert_eq!(encode(&mut e, &[field], index), block);
            assert_eq!(entries(&e.table), owned(table));
        }
    }

    const REQUEST1: &[(&str, &str)] = &[
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/"),
        (":authority", "www.example.com"),
    ];
    const REQUEST2: &[(&str, &str)] = &[
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/"),
        (":authority", "www.example.com"),
        ("cache-control", "no-cache"),
    ];
    const REQUEST3: &[(&str, &str)] = &[
        (":method", "GET"),
        (":scheme", "https"),
        (":path", "/index.html"),
        (":authority", "www.example.com"),
        ("custom-key", "custom-value"),
    ];
    const REQUEST_TABLE1: &[(&str, &str)] = &[(":authority", "www.example.com")];
    const REQUEST_TABLE2: &[(&str, &str)] =
        &[("cache-control", "no-cache"), (":authority", "www.example.com")];
    const REQUEST_TABLE3: &[(&str, &str)] = &[
        ("custom-key", "custom-value"),
        ("cache-control", "no-cache"),
        (":authority", "www.example.com"),
    ];

    #[test]
    fn c3_requests_without_huffman() {
        sequence(
            Decoder::new(DEFAULT_TABLE_SIZE),
            raw_encoder(),
            &[
                Step {
                    block: "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
                    fields: REQUEST1,
                    table: REQUEST_TABLE1,
                    size: 57,
                    ours: None,
                },
                Step {
                    block: "8286 84be 5808 6e6f 2d63 6163 6865",
                    fields: REQUEST2,
                    table: REQUEST_TABLE2,
                    size: 110,
                    ours: None,
                },
                Step {
                    block: "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 \
                            6c75 65",
                    fields: REQUEST3,
                    table: REQUEST_TABLE3,
                    size: 164,
                    ours: None,
                },
            ],
        );
    }

    #[test]
    fn c4_requests_with_huffman() {
        sequence(
            Decoder::new(DEFAULT_TABLE_SIZE),
            Encoder::new(),
            &[
                Step {
                    block: "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
                    fields: REQUEST1,
                    table: REQUEST_TABLE1,
                    size: 57,
                    ours: None,
                },
                Step {
                    block: "8286 84be 5886 a8eb 1064 9cbf",
                    fields: REQUEST2,
                    table: REQUEST_TABLE2,
                    size: 110,
                    ours: None,
                },
                Step {
                    block: "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
                    fields: REQUEST3,
                    table: REQUEST_TABLE3,
                    size: 164,
                    ours: None,
                },
            ],
        );
    }

    const DATE1: &str = "Mon, 21 Oct 2013 20:13:21 GMT";
    const DATE2: &str = "Mon, 21 Oct 2013 20:13:22 GMT";
    const LOCATION: &str = "https://www.example.com";
    const COOKIE: &str = "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1";
    const RESPONSE1: &[(&str, &str)] = &[
        (":status", "302"),
        ("cache-control", "private"),
        ("date", DATE1),
        ("location", LOCATION),
    ];
    const RESPONSE2: &[(&str, &str)] = &[
        (":status", "307"),
        ("cache-control", "private"),
        ("date", DATE1),
        ("location", LOCATION),
    ];
    const RESPONSE3: &[(&str, &str)] = &[
        (":status", "200"),
        ("cache-control", "private"),
        ("date", DATE2),
        ("location", LOCATION),
        ("content-encoding", "gzip"),
        ("set-cookie", COOKIE),
    ];
    const RESPONSE_TABLE1: &[(&str, &str)] = &[
        ("location", LOCATION),
        ("date", DATE1),
        ("cache-control", "private"),
        (":status", "302"),
    ];
    const RESPONSE_TABLE2: &[(&str, &str)] = &[
        (":status", "307"),
        ("location", LOCATION),
        ("date", DATE1),
        ("cache-control", "private"),
    ];
    const RESPONSE_TABLE3: &[(&str, &str)] =
        &[("set-cookie", COOKIE), ("content-encoding", "gzip"), ("date", DATE2)];

    /// C.5 and C.6 run with SETTINGS_HEADER_TABLE_SIZE 256. Here that setting is signalled as
    /// the protocol requires: the first block starts with a size update to 256 (3fe101), which
    /// our encoder emits and our decoder accepts up to its advertised 256.
    fn responses(mut encoder: Encoder, blocks: [&str; 3], ours: Option<&str>) {
        encoder.set_max_table_size(256);
        let first = format!("3fe101 {}", blocks[0]);
        sequence(
            Decoder::new(256),
            encoder,
            &[
                Step {
                    block: &first,
                    fields: RESPONSE1,
                    table: RESPONSE_TABLE1,
                    size: 222,
                    ours: None,
                },
                Step {
                    block: blocks[1],
                    fields: RESPONSE2,
                    table: RESPONSE_TABLE2,
                    size: 222,
                    ours,
                },
                Step {
                    block: blocks[2],
                    fields: RESPONSE3,
                    table: RESPONSE_TABLE3,
                    size: 215,
                    ours: None,
                },
            ],
        );
    }

    #[test]
    fn c5_responses_without_huffman() {
        responses(
            raw_encoder(),
            [
                "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 \
                 3133 2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 \
                 7861 6d70 6c65 2e63 6f6d",
                "4803 3330 37c1 c0bf",
                "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 \
                 474d 54c0 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 \
                 454f 5049 5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b 2076 \
                 6572 7369 6f6e 3d31",
            ],
            None,
        );
    }

    #[test]
    fn c6_responses_with_huffman() {
        responses(
            Encoder::new(),
            [
                "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 \
                 82a6 2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
                "4883 640e ffc1 c0bf",
                "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b \
                 d9ab 77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 \
                 0fb5 291f 9587 3160 65c0 03ed 4ee5 b106 3d50 07",
            ],
            // C.6.2 Huffman-codes "307" into 3 octets (640eff); we send it raw, as long and
            // cheaper to decode. Every other string of C.6 is shorter coded, and matches.
            Some("4803 3330 37c1 c0bf"),
        );
    }

    #[test]
    fn static_lookup_matches_the_table() {
        for (i, &(name, value)) in STATIC.iter().enumerate() {
            let first = STATIC.iter().position(|&(n, _)| n == name).map(|p| p + 1);
            let full = STATIC.iter().position(|&e| e == (name, value)).map(|p| p + 1);
            assert_eq!(static_lookup(name, value), (full, first), "{}", i + 1);
            assert_eq!(static_lookup(name, b"other"), (None, first), "{}", i + 1);
        }
        for name in [&b""[..], b"grpc-status", b"te", b"content-typ", b":Method", b"x-age"] {
            assert_eq!(static_lookup(name, b""), (None, None));
        }
    }

    #[test]
    fn every_error() {
        let cases: [(&str, usize, HpackError); 13] = [
            // Literal with indexed name, value missing; string running past the end; integer
            // cut.
            ("8241", BIG, HpackError::Truncated),
            ("4103 6162", BIG, HpackError::Truncated),
            ("ff", BIG, HpackError::Truncated),
            ("ff80 8080 8080 01", BIG, HpackError::IntegerOverflow),
            ("80", BIG, HpackError::BadIndex(0)),
            ("be", BIG, HpackError::BadIndex(62)),
            ("7f00 0161", BIG, HpackError::BadIndex(63)),
            ("1f2f 0161", BIG, HpackError::BadIndex(62)),
            // '0' (00000) then padding 000.
            ("0481 00", BIG, HpackError::BadHuffman),
            // A size update after a field; above the advertised 4096.
            ("8220", BIG, HpackError::BadSizeUpdate),
            ("3fe2 1f", BIG, HpackError::BadSizeUpdate),
            // A value of 9 octets with a list limit of 8: the list is too large, the block
            // was read to its end.
            ("0003 6162 6309 3132 3334 3536 3738 39", 8, HpackError::ListTooLarge),
            // One field of 7 + 3 + 32 octets against 41.
            ("82", 41, HpackError::ListTooLarge),
        ];
        for (block, max_list, error) in cases {
            let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
            let (_, r) = decode(&mut d, &hex(block), max_list);
            assert_eq!(r, Err(error.clone()), "{block}");
            assert_eq!(error.is_connection_error(), error != HpackError::ListTooLarge);
            assert!(!error.to_string().is_empty());
        }
        let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
        assert_eq!(decode(&mut d, &hex("82"), 42), (owned(&[(":method", "GET")]), Ok(())));
    }

    #[test]
    fn size_updates() {
        let mut d = Decoder::new(100);
        // Up to the advertised limit, several at the start of a block.
        assert_eq!(decode(&mut d, &hex("3f45 3f44"), BIG), (vec![], Ok(())));
        assert_eq!(d.table.max, 99);
        let (_, r) = decode(&mut d, &hex("3f46"), BIG);
        assert_eq!(r, Err(HpackError::BadSizeUpdate));

        // Shrinking evicts; 0 empties the table; a block of updates only is valid.
        let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
        let mut e = Encoder::new();
        let block = encode(&mut e, REQUEST3, Index::Yes);
        assert_eq!(decode(&mut d, &block, BIG).1, Ok(()));
        assert_eq!(d.table_size(), 57 + 54);
        assert_eq!(decode(&mut d, &hex("3f27"), BIG).1, Ok(())); // 70
        assert_eq!(entries(&d.table), owned(&[("custom-key", "custom-value")]));
        assert_eq!(decode(&mut d, &hex("20 3fe1 1f"), BIG).1, Ok(())); // 0, then 4096
        assert_eq!((d.table_size(), d.table.entries.len(), d.table.max), (0, 0, 4096));

        // An update in the middle of a block, even a valid size.
        let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
        let (fields, r) = decode(&mut d, &hex("3fe1 1f 82 3fe1 1f"), BIG);
        assert_eq!((fields, r), (owned(&[(":method", "GET")]), Err(HpackError::BadSizeUpdate)));
    }

    #[test]
    fn list_too_large_keeps_the_table_in_step() {
        let mut e = Encoder::new();
        let mut block = Vec::new();
        e.begin(&mut block);
        e.encode(b":method", b"POST", Index::Yes, &mut block); // static 3: 7 + 4 + 32 = 43
        e.encode(b"x-big", &[b'v'; 40], Index::Yes, &mut block); // 77: over 100
        e.encode(b"x-after", b"added", Index::Yes, &mut block); // indexed after the limit
        e.encode(b"x-plain", b"not added", Index::No, &mut block);
        let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
        let (fields, r) = decode(&mut d, &block, 100);
        assert_eq!((fields, r), (owned(&[(":method", "POST")]), Err(HpackError::ListTooLarge)));
        assert_eq!(entries(&d.table), entries(&e.table));
        assert_eq!(d.table.entries.len(), 2);
        // The next block refers to both entries added in the failed one.
        let mut next = Vec::new();
        e.begin(&mut next);
        e.encode(b"x-after", b"added", Index::Yes, &mut next);
        e.encode(b"x-big", &[b'v'; 40], Index::Yes, &mut next);
        assert_eq!(next, [0xbe, 0xbf]);
        let big = "v".repeat(40);
        assert_eq!(
            decode(&mut d, &next, BIG),
            (owned(&[("x-after", "added"), ("x-big", &big)]), Ok(()))
        );
    }

    #[test]
    fn new_entry_may_name_the_entry_it_evicts() {
        // RFC 7541 §4.4: with room for one entry, `aaa: ccc` names `aaa: b` (index 62), which
        // its insertion evicts.
        let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
        let block = hex("3f27 4003 6161 6101 62 7e03 6363 63");
        let (fields, r) = decode(&mut d, &block, BIG);
        assert_eq!((fields, r), (owned(&[("aaa", "b"), ("aaa", "ccc")]), Ok(())));
        assert_eq!(entries(&d.table), owned(&[("aaa", "ccc")]));
        assert_eq!(d.table_size(), 38);
        // Many more, reclaiming the buffer as they go.
        let mut block = hex("3f27");
        for _ in 0..1000 {
            block.extend_from_slice(&hex("7e03 6464 64"));
        }
        assert_eq!(decode(&mut d, &block, BIG).1, Ok(()));
        assert_eq!(entries(&d.table), owned(&[("aaa", "ddd")]));
        assert!(d.table.bytes.capacity() <= 2 * 70);
    }

    #[test]
    fn entry_larger_than_the_table_empties_it() {
        let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
        let mut block = hex("3f27 4003 6161 6101 62 4003 6262 62");
        block.push(50);
        block.extend_from_slice(&[b'x'; 50]);
        assert_eq!(decode(&mut d, &block, BIG).1, Ok(()));
        assert_eq!((d.table_size(), d.table.entries.len()), (0, 0));
        // The encoder instead leaves such a field out of the table.
        let mut e = Encoder::new();
        e.set_max_table_size(70);
        let mut out = Vec::new();
        e.begin(&mut out);
        e.encode(b"aaa", b"b", Index::Yes, &mut out);
        e.encode(b"bbb", &[b'x'; 50], Index::Yes, &mut out);
        assert_eq!(entries(&e.table), owned(&[("aaa", "b")]));
        assert_eq!(out[8], 0x00); // literal without indexing
        let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
        assert_eq!(decode(&mut d, &out, BIG).1, Ok(()));
        assert_eq!(entries(&d.table), entries(&e.table));
    }

    #[test]
    fn encoder_signals_table_size_changes() {
        let updates = |e: &mut Encoder| {
            let mut out = Vec::new();
            e.begin(&mut out);
            out
        };
        let mut e = Encoder::new();
        e.encode(b"x-a", b"1", Index::Yes, &mut Vec::new());
        // No change, or a larger setting (we use at most 4096): nothing to signal.
        e.set_max_table_size(DEFAULT_TABLE_SIZE);
        e.set_max_table_size(1 << 20);
        assert_eq!(updates(&mut e), [0u8; 0]);
        // Shrink: signalled once, at the next block only.
        e.set_max_table_size(256);
        assert_eq!(updates(&mut e), hex("3fe1 01"));
        assert_eq!(updates(&mut e), [0u8; 0]);
        assert_eq!(e.table.size, 36);
        // Shrink then grow between blocks: the smallest, then the final size.
        e.set_max_table_size(0);
        e.set_max_table_size(100);
        e.set_max_table_size(4096);
        assert_eq!(updates(&mut e), hex("20 3fe1 1f"));
        assert_eq!((e.table.size, e.table.max), (0, 4096));
        // Shrink then return: the table shrank, so both are signalled.
        e.set_max_table_size(1000);
        e.set_max_table_size(4096);
        assert_eq!(updates(&mut e), hex("3fc9 07 3fe1 1f"));
        // Grow then return: nothing evicted, nothing to signal.
        e.set_max_table_size(256);
        assert_eq!(updates(&mut e), hex("3fe1 01"));
        e.set_max_table_size(1000);
        e.set_max_table_size(256);
        assert_eq!(updates(&mut e), [0u8; 0]);
        e.set_max_table_size(4096);
        assert_eq!(updates(&mut e), hex("3fe1 1f"));
        // A change mid-block waits for the next begin.
        let mut out = Vec::new();
        e.begin(&mut out);
        e.encode(b"x-a", b"1", Index::Yes, &mut out);
        e.set_max_table_size(0);
        e.encode(b"x-a", b"1", Index::Yes, &mut out);
        assert_eq!(out, hex("4003 782d 6101 31 be"));
        assert_eq!(updates(&mut e), hex("20"));
        assert_eq!(e.table.size, 0);
    }

    #[test]
    fn encoder_representations() {
        let mut e = Encoder::new();
        let one = |e: &mut Encoder, n: &str, v: &str, i: Index| {
            let mut out = Vec::new();
            e.encode(n.as_bytes(), v.as_bytes(), i, &mut out);
            out
        };
        // Full static match: an index whatever the mode, but never indexed stays a literal.
        assert_eq!(one(&mut e, ":method", "GET", Index::No), [0x82]);
        assert_eq!(one(&mut e, ":status", "500", Index::Yes), [0x8e]);
        assert_eq!(one(&mut e, ":authority", "", Index::Yes), [0x81]);
        assert_eq!(one(&mut e, ":method", "GET", Index::Never), hex("1203 4745 54"));
        // Static name, new value: "PUT" stays raw (Huffman is not shorter), "/a/b/c" is coded.
        assert_eq!(one(&mut e, ":method", "PUT", Index::No), hex("0203 5055 54"));
        assert_eq!(one(&mut e, ":path", "/a/b/c", Index::No), hex("0485 606c 46c1 3f"));
        assert_eq!(e.table.size, 0);
        // Dynamic: a full match becomes an index; a name match names the entry; never indexed
        // uses only the name.
        assert_eq!(one(&mut e, "x-token", "abc", Index::Yes), hex("4086 f2b2 4fd4 b57f 821c 64"));
        assert_eq!(one(&mut e, "x-token", "abc", Index::No), [0xbe]);
        assert_eq!(one(&mut e, "x-token", "abd", Index::No), hex("0f2f 0361 6264"));
        assert_eq!(one(&mut e, "x-token", "abc", Index::Never), hex("1f2f 821c 64"));
        assert_eq!(entries(&e.table), owned(&[("x-token", "abc")]));
    }

    /// A small deterministic PRNG (xorshift64*), so the tests need no crate.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        fn bytes(&mut self, max_len: usize) -> Vec<u8> {
            let len = self.below(max_len + 1);
            let text = self.below(2) == 0;
            (0..len)
                .map(
                    |_| if text { b"abcdefghij-/.0123"[self.below(17)] } else { self.next() as u8 },
                )
                .collect()
        }
    }

    #[test]
    fn arbitrary_input_never_panics() {
        // Random bytes, and valid blocks with random bytes changed: every outcome is a result.
        let mut rng = Rng(0x0dd_ba11_cafe_f00d);
        let mut valid = Vec::new();
        let mut e = Encoder::new();
        for (n, v) in RESPONSE3.iter().chain(REQUEST3) {
            e.encode(n.as_bytes(), v.as_bytes(), Index::Yes, &mut valid);
        }
        let mut outcomes = [0usize; 2];
        for round in 0..50_000 {
            let block = if round % 2 == 0 {
                rng.bytes(64)
            } else {
                let mut b = valid.clone();
                for _ in 0..1 + rng.below(3) {
                    let i = rng.below(b.len());
                    b[i] = rng.next() as u8;
                }
                b.truncate(rng.below(b.len() + 1));
                b
            };
            let mut d = Decoder::new(1 + rng.below(2 * DEFAULT_TABLE_SIZE));
            let r = d.decode(&block, rng.below(2000), |_, _| {});
            outcomes[usize::from(r.is_ok())] += 1;
            assert!(d.table_size() <= d.table.max);
            assert!(d.table.bytes.capacity() <= 2 * d.limit.max(DEFAULT_TABLE_SIZE));
        }
        assert!(outcomes[0] > 0 && outcomes[1] > 0, "{outcomes:?}");
    }

    #[test]
    fn random_round_trip() {
        let names: [&[u8]; 10] = [
            b":path",
            b":status",
            b"content-type",
            b"grpc-status",
            b"grpc-message",
            b"grpc-timeout",
            b"user-agent",
            b"x-trace-bin",
            b":method",
            b"te",
        ];
        let values: [&[u8]; 6] = [b"", b"0", b"application/grpc", b"trailers", b"POST", b"200"];
        let mut rng = Rng(0x1234_5678_9abc_def1);
        let mut e = Encoder::new();
        let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
        let mut total = 0;
        let mut block = Vec::new();
        let mut expected: Fields = Vec::new();
        while total < 10_000 {
            if rng.below(8) == 0 {
                let sizes = [0, 40, 100, 256, 1000, 4096, 8192, rng.below(5000)];
                e.set_max_table_size(sizes[rng.below(sizes.len())]);
                if rng.below(2) == 0 {
                    e.set_max_table_size(sizes[rng.below(sizes.len())]);
                }
            }
            block.clear();
            expected.clear();
            e.begin(&mut block);
            for _ in 0..1 + rng.below(12) {
                let name = match rng.below(3) {
                    0 => names[rng.below(names.len())].to_vec(),
                    1 => STATIC[rng.below(STATIC.len())].0.to_vec(),
                    _ => rng.bytes(20),
                };
                let value = match rng.below(4) {
                    0 => values[rng.below(values.len())].to_vec(),
                    1 => rng.bytes(300),
                    _ => rng.bytes(30),
                };
                let index = [Index::Yes, Index::Yes, Index::No, Index::Never][rng.below(4)];
                e.encode(&name, &value, index, &mut block);
                expected.push((name, value));
                total += 1;
            }
            let (fields, r) = decode(&mut d, &block, BIG);
            assert_eq!(r, Ok(()));
            assert_eq!(fields, expected);
            assert_eq!(entries(&d.table), entries(&e.table));
            assert_eq!((d.table_size(), d.table.max), (e.table.size, e.table.max));
        }
        assert!(d.table.bytes.capacity() <= 2 * DEFAULT_TABLE_SIZE);
        assert!(e.table.bytes.capacity() <= 2 * DEFAULT_TABLE_SIZE);
    }
}
