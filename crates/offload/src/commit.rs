//! How a decoded request reaches the application's memory (RPCAcc §IV-B).
//!
//! - [`CommitMode::FieldByField`]: the decoder writes every field straight
//!   into host memory, so each store the decoder makes is a separate
//!   transaction across the interconnect. The engine runs the real decoder
//!   over counting memory ([`Decoder::decode_counted`]): the counts are the
//!   stores it makes, not an estimate.
//! - [`CommitMode::OneShot`]: the decoder writes into an engine-private
//!   temp buffer and the engine commits it to host memory in copies of at
//!   most `temp` bytes (4 KiB by default): one transaction per copy. A
//!   value longer than the temp buffer (a large string or bytes field)
//!   does not pass through it: it is one transfer of its own, as a DMA
//!   engine streams it, and the buffer coalesces everything around it.
//!
//! Both produce the same message (blocks that encode to the same bytes;
//! their padding may differ, as large copies are placed by address), and
//! device-placed fields go to the device region either way
//! ([`Decoder::decode_placed`]): they never cross to the host.

use protoplane_schema::TableSet;
use protoplane_wire::{DecodeError, DecodeOptions, Decoder, WriteStats};

/// The temp buffer's default size.
pub const DEFAULT_TEMP: usize = 4096;

/// How decoded fields reach host memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitMode {
    /// Every store of the decoder is a host-memory transaction.
    FieldByField,
    /// Decode into a temp buffer, commit it in copies of `temp` bytes.
    OneShot {
        /// Temp buffer size (at least 64 bytes).
        temp: usize,
    },
}

impl CommitMode {
    /// One-shot with the default temp buffer.
    pub fn one_shot() -> CommitMode {
        CommitMode::OneShot { temp: DEFAULT_TEMP }
    }

    /// `field-by-field` or `one-shot`.
    pub fn name(self) -> &'static str {
        match self {
            CommitMode::FieldByField => "field-by-field",
            CommitMode::OneShot { .. } => "one-shot",
        }
    }
}

/// A decoder with its temp buffer, committing into host memory.
#[derive(Debug, Default)]
pub struct CommitDecoder {
    decoder: Decoder,
    temp: Vec<u8>,
    bulk: Vec<(usize, usize)>,
}

impl CommitDecoder {
    /// A decoder with empty scratch space.
    pub fn new() -> CommitDecoder {
        CommitDecoder::default()
    }

    /// Decodes `input` as message `type_index` into `host` (the block in
    /// the application's memory, replaced), device-placed fields into
    /// `device` when given; returns the host-memory transactions it took.
    #[allow(clippy::too_many_arguments)] // a decode's inputs and outputs
    pub fn decode(
        &mut self,
        tables: &TableSet,
        type_index: u32,
        input: &[u8],
        opts: &DecodeOptions,
        mode: CommitMode,
        host: &mut Vec<u8>,
        device: Option<&mut Vec<u8>>,
    ) -> Result<WriteStats, DecodeError> {
        match mode {
            CommitMode::FieldByField => {
                self.decoder.decode_counted(tables, type_index, input, opts, host, device, None)
            }
            CommitMode::OneShot { temp } => {
                let temp = temp.max(64);
                // The decoder's stores land in engine memory: not host
                // transactions. It notes where the values too long for the
                // temp buffer went.
                self.bulk.clear();
                self.decoder.decode_counted(
                    tables,
                    type_index,
                    input,
                    opts,
                    &mut self.temp,
                    device,
                    Some((temp + 1, &mut self.bulk)),
                )?;
                host.clear();
                host.reserve(self.temp.len());
                let mut stats = WriteStats::default();
                let mut commit = |from: usize, to: usize, whole: bool, host: &mut Vec<u8>| {
                    let part = &self.temp[from..to];
                    if whole {
                        host.extend_from_slice(part);
                        stats.writes += 1;
                    } else {
                        for chunk in part.chunks(temp) {
                            host.extend_from_slice(chunk);
                            stats.writes += 1;
                        }
                    }
                    stats.bytes += part.len() as u64;
                };
                let mut at = 0;
                for &(off, len) in &self.bulk {
                    if off < at || off + len > self.temp.len() {
                        continue;
                    }
                    commit(at, off, false, host);
                    commit(off, off + len, true, host);
                    at = off + len;
                }
                commit(at, self.temp.len(), false, host);
                Ok(stats)
            }
        }
    }
}
