//! HPACK (`http2::hpack`, RFC 7541): the decoder on a peer's header blocks,
//! and encoder and decoder against each other.
//!
//! Input: a control byte, then a body. Control bit 0 picks the mode; bits
//! 1..=7 pick the SETTINGS_HEADER_TABLE_SIZE the decoder advertises (0 to
//! 8,128 in steps of 64).
//! * Raw (bit 0 clear): the body is header blocks, each a 2-byte length
//!   and its bytes, decoded in order, each under a list limit of 64 bytes
//!   by one decoder and of 1 MiB by another.
//! * Encoded (bit 0 set): the body is a program (`protoplane_fuzz::hpack`)
//!   of fields (name, value, how to index), block ends and table size
//!   changes, run through an `Encoder` and two `Decoder`s.
//!
//! Properties, beyond "never panics":
//! * the dynamic table never outgrows the largest size allowed (the
//!   advertised size, or the initial 4,096);
//! * fields handed out never sum past the list limit (RFC 9113 §6.5.2
//!   accounting), and a block over the limit fails with `ListTooLarge`;
//! * the list limit changes nothing else: the small-limit decoder hands
//!   out a prefix of the large-limit decoder's fields, fails with the same
//!   error when that is not `ListTooLarge`, and when it is, has decoded the
//!   block to its end (same table size), so the next block decodes the
//!   same for both; an error other than `ListTooLarge` ends the sequence;
//! * what the encoder writes decodes to the fields it was given, in order,
//!   over many blocks, across table size changes signalled as the encoder
//!   learns the peer's SETTINGS; and a decoder whose list limit is one
//!   byte short of a block fails that block with `ListTooLarge`, hands out
//!   the fields that fit, and stays in step for the blocks after it.

#![no_main]

use libfuzzer_sys::fuzz_target;
use protoplane_fuzz::hpack::{Indexing, Op, Program};
use protoplane_http2::hpack::{Decoder, Encoder, HpackError, Index, DEFAULT_TABLE_SIZE};

type Fields = Vec<(Vec<u8>, Vec<u8>)>;

const SMALL_LIST: usize = 64;
const LARGE_LIST: usize = 1 << 20;

/// Field bytes one encoded run may list (a repeated-byte string costs the
/// input 2 bytes for up to 16 KiB).
const MAX_LISTED: usize = 1 << 20;

/// RFC 7541 §4.1: the size of a field, also its header list cost.
fn cost(name: &[u8], value: &[u8]) -> usize {
    name.len() + value.len() + 32
}

fn decode(d: &mut Decoder, block: &[u8], max_list: usize) -> (Fields, Result<(), HpackError>) {
    let mut fields = Vec::new();
    let r = d.decode(block, max_list, |n, v| fields.push((n.to_vec(), v.to_vec())));
    let handed: usize = fields.iter().map(|(n, v)| cost(n, v)).sum();
    assert!(handed <= max_list, "{handed} bytes of fields under a limit of {max_list}");
    (fields, r)
}

fn check_table(d: &Decoder, advertised: usize) {
    let max = advertised.max(DEFAULT_TABLE_SIZE);
    assert!(d.table_size() <= max, "table of {} over {max}", d.table_size());
}

fn raw(advertised: usize, mut body: &[u8]) {
    let mut small = Decoder::new(advertised);
    let mut large = Decoder::new(advertised);
    while let [hi, lo, rest @ ..] = body {
        let len = usize::from(u16::from_be_bytes([*hi, *lo])).min(rest.len());
        let (block, next) = rest.split_at(len);
        body = next;
        let (few, r_small) = decode(&mut small, block, SMALL_LIST);
        let (all, r_large) = decode(&mut large, block, LARGE_LIST);
        check_table(&small, advertised);
        check_table(&large, advertised);
        assert!(all.starts_with(&few), "the small limit changed the fields");
        let total: usize = all.iter().map(|(n, v)| cost(n, v)).sum();
        match (&r_small, &r_large) {
            (Err(HpackError::ListTooLarge), Ok(()) | Err(HpackError::ListTooLarge)) => {
                assert_eq!(small.table_size(), large.table_size(), "out of step");
            }
            (Ok(()), Ok(())) => {
                assert_eq!(few, all);
                assert!(total <= SMALL_LIST);
                assert_eq!(small.table_size(), large.table_size(), "out of step");
            }
            (Err(HpackError::ListTooLarge), Err(e)) => {
                // The large decoder found a connection error in the rest
                // of the block: the small one must not have passed it.
                panic!("{e:?} with a large limit, ListTooLarge with a small one");
            }
            (a, b) => assert_eq!(a, b, "the limit changed the error"),
        }
        if r_large.is_err() {
            // A connection error: the decoder is done with.
            return;
        }
    }
}

/// Encodes a block, decodes it with a generous decoder and with one whose
/// list limit is a byte short, and checks both.
fn round_trip(
    enc_block: &[u8],
    fields: &Fields,
    exact: &mut Decoder,
    short: &mut Decoder,
    advertised: usize,
) {
    let (got, r) = decode(exact, enc_block, usize::MAX);
    assert_eq!(r, Ok(()), "our own block does not decode");
    assert!(got == *fields, "decoded {got:?}, encoded {fields:?}");
    check_table(exact, advertised);

    let total: usize = fields.iter().map(|(n, v)| cost(n, v)).sum();
    let limit = total.saturating_sub(1);
    let (few, r) = decode(short, enc_block, limit);
    if total == 0 {
        assert_eq!((few.len(), r), (0, Ok(())));
    } else {
        assert_eq!(r, Err(HpackError::ListTooLarge), "a list of {total} under {limit}");
        let mut fit = 0;
        let mut sum = 0;
        for (n, v) in fields {
            sum += cost(n, v);
            if sum > limit {
                break;
            }
            fit += 1;
        }
        assert!(few[..] == fields[..fit], "handed out {few:?} of {fields:?}");
    }
    assert_eq!(short.table_size(), exact.table_size(), "ListTooLarge left the table out of step");
}

fn encoded(advertised: usize, body: &[u8]) {
    let mut enc = Encoder::new();
    let mut exact = Decoder::new(advertised);
    let mut short = Decoder::new(advertised);
    let mut block = Vec::new();
    let mut fields: Fields = Vec::new();
    let mut open = false;
    let mut blocks = 0;
    let mut listed = 0;
    for op in Program(body) {
        match op {
            Op::Field { name, value, index } => {
                if !open {
                    enc.begin(&mut block);
                    open = true;
                }
                listed += cost(&name, &value);
                if listed > MAX_LISTED {
                    return;
                }
                let index = match index {
                    Indexing::Yes => Index::Yes,
                    Indexing::No => Index::No,
                    Indexing::Never => Index::Never,
                };
                enc.encode(&name, &value, index, &mut block);
                fields.push((name, value));
            }
            Op::End => {
                if !open {
                    // A block of no fields: only the pending size updates.
                    enc.begin(&mut block);
                }
                round_trip(&block, &fields, &mut exact, &mut short, advertised);
                block.clear();
                fields.clear();
                open = false;
                blocks += 1;
                if blocks > 64 {
                    return;
                }
            }
            Op::TableSize(n) => enc.set_max_table_size(usize::from(n) % (advertised + 1)),
        }
    }
    if open {
        round_trip(&block, &fields, &mut exact, &mut short, advertised);
    }
}

fuzz_target!(|data: &[u8]| {
    let [control, body @ ..] = data else { return };
    let advertised = usize::from(control >> 1) * 64;
    if control & 1 == 0 {
        raw(advertised, body);
    } else {
        encoded(advertised, body);
    }
});
