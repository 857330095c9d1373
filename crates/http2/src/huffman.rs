//! The Huffman code of HPACK (RFC 7541 §5.2 and Appendix B).
//!
//! Encoding shifts each symbol's code into a 64-bit accumulator and writes whole bytes, padding
//! the last one with the most significant bits of EOS (all ones).
//!
//! Decoding is table-driven rather than a walk of the code tree. The next [`FAST_BITS`] bits of
//! input index a 4 KiB table that gives the symbol and code length of every code of at most 11
//! bits: all letters, digits and the punctuation of URLs, content types and base64, i.e. every
//! character of typical gRPC headers costs one lookup. Longer codes (rare bytes, and EOS) are
//! resolved with the canonical structure of the code: the codes of one length are consecutive
//! integers, so a code of length `l` is recognised by one subtraction and compare per length,
//! at most 19 of them. Both tables are computed at compile time from [`CODES`].
//!
//! Input enters a 64-bit accumulator 8 bytes at a time; the last few bytes are read from a copy
//! followed by ones, so the end of the input needs no code path of its own beyond the check of
//! the padding.

/// The code of each symbol, `(code, length in bits)`, code right-aligned; symbol 256 is EOS.
///
/// RFC 7541 Appendix B, one entry per symbol. The tests check that the code is complete and
/// canonical, and encode and decode the strings of RFC 7541 Appendix C with it.
pub(crate) const CODES: [(u32, u8); 257] = [
    (0x1ff8, 13),     // (0)
    (0x7fffd8, 23),   // (1)
    (0xfffffe2, 28),  // (2)
    (0xfffffe3, 28),  // (3)
    (0xfffffe4, 28),  // (4)
    (0xfffffe5, 28),  // (5)
    (0xfffffe6, 28),  // (6)
    (0xfffffe7, 28),  // (7)
    (0xfffffe8, 28),  // (8)
    (0xffffea, 24),   // (9)
    (0x3ffffffc, 30), // (10)
    (0xfffffe9, 28),  // (11)
    (0xfffffea, 28),  // (12)
    (0x3ffffffd, 30), // (13)
    (0xfffffeb, 28),  // (14)
    (0xfffffec, 28),  // (15)
    (0xfffffed, 28),  // (16)
    (0xfffffee, 28),  // (17)
    (0xfffffef, 28),  // (18)
    (0xffffff0, 28),  // (19)
    (0xffffff1, 28),  // (20)
    (0xffffff2, 28),  // (21)
    (0x3ffffffe, 30), // (22)
    (0xffffff3, 28),  // (23)
    (0xffffff4, 28),  // (24)
    (0xffffff5, 28),  // (25)
    (0xffffff6, 28),  // (26)
    (0xffffff7, 28),  // (27)
    (0xffffff8, 28),  // (28)
    (0xffffff9, 28),  // (29)
    (0xffffffa, 28),  // (30)
    (0xffffffb, 28),  // (31)
    (0x14, 6),        // (32) ' '
    (0x3f8, 10),      // (33) '!'
    (0x3f9, 10),      // (34) '"'
    (0xffa, 12),      // (35) '#'
    (0x1ff9, 13),     // (36) '$'
    (0x15, 6),        // (37) '%'
    (0xf8, 8),        // (38) '&'
    (0x7fa, 11),      // (39) '\''
    (0x3fa, 10),      // (40) '('
    (0x3fb, 10),      // (41) ')'
    (0xf9, 8),        // (42) '*'
    (0x7fb, 11),      // (43) '+'
    (0xfa, 8),        // (44) ','
    (0x16, 6),        // (45) '-'
    (0x17, 6),        // (46) '.'
    (0x18, 6),        // (47) '/'
    (0x0, 5),         // (48) '0'
    (0x1, 5),         // (49) '1'
    (0x2, 5),         // (50) '2'
    (0x19, 6),        // (51) '3'
    (0x1a, 6),        // (52) '4'
    (0x1b, 6),        // (53) '5'
    (0x1c, 6),        // (54) '6'
    (0x1d, 6),        // (55) '7'
    (0x1e, 6),        // (56) '8'
    (0x1f, 6),        // (57) '9'
    (0x5c, 7),        // (58) ':'
    (0xfb, 8),        // (59) ';'
    (0x7ffc, 15),     // (60) '<'
    (0x20, 6),        // (61) '='
    (0xffb, 12),      // (62) '>'
    (0x3fc, 10),      // (63) '?'
    (0x1ffa, 13),     // (64) '@'
    (0x21, 6),        // (65) 'A'
    (0x5d, 7),        // (66) 'B'
    (0x5e, 7),        // (67) 'C'
    (0x5f, 7),        // (68) 'D'
    (0x60, 7),        // (69) 'E'
    (0x61, 7),        // (70) 'F'
    (0x62, 7),        // (71) 'G'
    (0x63, 7),        // (72) 'H'
    (0x64, 7),        // (73) 'I'
    (0x65, 7),        // (74) 'J'
    (0x66, 7),        // (75) 'K'
    (0x67, 7),        // (76) 'L'
    (0x68, 7),        // (77) 'M'
    (0x69, 7),        // (78) 'N'
    (0x6a, 7),        // (79) 'O'
    (0x6b, 7),        // (80) 'P'
    (0x6c, 7),        // (81) 'Q'
    (0x6d, 7),        // (82) 'R'
    (0x6e, 7),        // (83) 'S'
    (0x6f, 7),        // (84) 'T'
    (0x70, 7),        // (85) 'U'
    (0x71, 7),        // (86) 'V'
    (0x72, 7),        // (87) 'W'
    (0xfc, 8),        // (88) 'X'
    (0x73, 7),        // (89) 'Y'
    (0xfd, 8),        // (90) 'Z'
    (0x1ffb, 13),     // (91) '['
    (0x7fff0, 19),    // (92) '\\'
    (0x1ffc, 13),     // (93) ']'
    (0x3ffc, 14),     // (94) '^'
    (0x22, 6),        // (95) '_'
    (0x7ffd, 15),     // (96) '`'
    (0x3, 5),         // (97) 'a'
    (0x23, 6),        // (98) 'b'
    (0x4, 5),         // (99) 'c'
    (0x24, 6),        // (100) 'd'
    (0x5, 5),         // (101) 'e'
    (0x25, 6),        // (102) 'f'
    (0x26, 6),        // (103) 'g'
    (0x27, 6),        // (104) 'h'
    (0x6, 5),         // (105) 'i'
    (0x74, 7),        // (106) 'j'
    (0x75, 7),        // (107) 'k'
    (0x28, 6),        // (108) 'l'
    (0x29, 6),        // (109) 'm'
    (0x2a, 6),        // (110) 'n'
    (0x7, 5),         // (111) 'o'
    (0x2b, 6),        // (112) 'p'
    (0x76, 7),        // (113) 'q'
    (0x2c, 6),        // (114) 'r'
    (0x8, 5),         // (115) 's'
    (0x9, 5),         // (116) 't'
    (0x2d, 6),        // (117) 'u'
    (0x77, 7),        // (118) 'v'
    (0x78, 7),        // (119) 'w'
    (0x79, 7),        // (120) 'x'
    (0x7a, 7),        // (121) 'y'
    (0x7b, 7),        // (122) 'z'
    (0x7ffe, 15),     // (123) '{'
    (0x7fc, 11),      // (124) '|'
    (0x3ffd, 14),     // (125) '}'
    (0x1ffd, 13),     // (126) '~'
    (0xffffffc, 28),  // (127)
    (0xfffe6, 20),    // (128)
    (0x3fffd2, 22),   // (129)
    (0xfffe7, 20),    // (130)
    (0xfffe8, 20),    // (131)
    (0x3fffd3, 22),   // (132)
    (0x3fffd4, 22),   // (133)
    (0x3fffd5, 22),   // (134)
    (0x7fffd9, 23),   // (135)
    (0x3fffd6, 22),   // (136)
    (0x7fffda, 23),   // (137)
    (0x7fffdb, 23),   // (138)
    (0x7fffdc, 23),   // (139)
    (0x7fffdd, 23),   // (140)
    (0x7fffde, 23),   // (141)
    (0xffffeb, 24),   // (142)
    (0x7fffdf, 23),   // (143)
    (0xffffec, 24),   // (144)
    (0xffffed, 24),   // (145)
    (0x3fffd7, 22),   // (146)
    (0x7fffe0, 23),   // (147)
    (0xffffee, 24),   // (148)
    (0x7fffe1, 23),   // (149)
    (0x7fffe2, 23),   // (150)
    (0x7fffe3, 23),   // (151)
    (0x7fffe4, 23),   // (152)
    (0x1fffdc, 21),   // (153)
    (0x3fffd8, 22),   // (154)
    (0x7fffe5, 23),   // (155)
    (0x3fffd9, 22),   // (156)
    (0x7fffe6, 23),   // (157)
    (0x7fffe7, 23),   // (158)
    (0xffffef, 24),   // (159)
    (0x3fffda, 22),   // (160)
    (0x1fffdd, 21),   // (161)
    (0xfffe9, 20),    // (162)
    (0x3fffdb, 22),   // (163)
    (0x3fffdc, 22),   // (164)
    (0x7fffe8, 23),   // (165)
    (0x7fffe9, 23),   // (166)
    (0x1fffde, 21),   // (167)
    (0x7fffea, 23),   // (168)
    (0x3fffdd, 22),   // (169)
    (0x3fffde, 22),   // (170)
    (0xfffff0, 24),   // (171)
    (0x1fffdf, 21),   // (172)
    (0x3fffdf, 22),   // (173)
    (0x7fffeb, 23),   // (174)
    (0x7fffec, 23),   // (175)
    (0x1fffe0, 21),   // (176)
    (0x1fffe1, 21),   // (177)
    (0x3fffe0, 22),   // (178)
    (0x1fffe2, 21),   // (179)
    (0x7fffed, 23),   // (180)
    (0x3fffe1, 22),   // (181)
    (0x7fffee, 23),   // (182)
    (0x7fffef, 23),   // (183)
    (0xfffea, 20),    // (184)
    (0x3fffe2, 22),   // (185)
    (0x3fffe3, 22),   // (186)
    (0x3fffe4, 22),   // (187)
    (0x7ffff0, 23),   // (188)
    (0x3fffe5, 22),   // (189)
    (0x3fffe6, 22),   // (190)
    (0x7ffff1, 23),   // (191)
    (0x3ffffe0, 26),  // (192)
    (0x3ffffe1, 26),  // (193)
    (0xfffeb, 20),    // (194)
    (0x7fff1, 19),    // (195)
    (0x3fffe7, 22),   // (196)
    (0x7ffff2, 23),   // (197)
    (0x3fffe8, 22),   // (198)
    (0x1ffffec, 25),  // (199)
    (0x3ffffe2, 26),  // (200)
    (0x3ffffe3, 26),  // (201)
    (0x3ffffe4, 26),  // (202)
    (0x7ffffde, 27),  // (203)
    (0x7ffffdf, 27),  // (204)
    (0x3ffffe5, 26),  // (205)
    (0xfffff1, 24),   // (206)
    (0x1ffffed, 25),  // (207)
    (0x7fff2, 19),    // (208)
    (0x1fffe3, 21),   // (209)
    (0x3ffffe6, 26),  // (210)
    (0x7ffffe0, 27),  // (211)
    (0x7ffffe1, 27),  // (212)
    (0x3ffffe7, 26),  // (213)
    (0x7ffffe2, 27),  // (214)
    (0xfffff2, 24),   // (215)
    (0x1fffe4, 21),   // (216)
    (0x1fffe5, 21),   // (217)
    (0x3ffffe8, 26),  // (218)
    (0x3ffffe9, 26),  // (219)
    (0xffffffd, 28),  // (220)
    (0x7ffffe3, 27),  // (221)
    (0x7ffffe4, 27),  // (222)
    (0x7ffffe5, 27),  // (223)
    (0xfffec, 20),    // (224)
    (0xfffff3, 24),   // (225)
    (0xfffed, 20),    // (226)
    (0x1fffe6, 21),   // (227)
    (0x3fffe9, 22),   // (228)
    (0x1fffe7, 21),   // (229)
    (0x1fffe8, 21),   // (230)
    (0x7ffff3, 23),   // (231)
    (0x3fffea, 22),   // (232)
    (0x3fffeb, 22),   // (233)
    (0x1ffffee, 25),  // (234)
    (0x1ffffef, 25),  // (235)
    (0xfffff4, 24),   // (236)
    (0xfffff5, 24),   // (237)
    (0x3ffffea, 26),  // (238)
    (0x7ffff4, 23),   // (239)
    (0x3ffffeb, 26),  // (240)
    (0x7ffffe6, 27),  // (241)
    (0x3ffffec, 26),  // (242)
    (0x3ffffed, 26),  // (243)
    (0x7ffffe7, 27),  // (244)
    (0x7ffffe8, 27),  // (245)
    (0x7ffffe9, 27),  // (246)
    (0x7ffffea, 27),  // (247)
    (0x7ffffeb, 27),  // (248)
    (0xffffffe, 28),  // (249)
    (0x7ffffec, 27),  // (250)
    (0x7ffffed, 27),  // (251)
    (0x7ffffee, 27),  // (252)
    (0x7ffffef, 27),  // (253)
    (0x7fffff0, 27),  // (254)
    (0x3ffffee, 26),  // (255)
    (0x3fffffff, 30), // (256) EOS
];

/// The end-of-string symbol, which never appears in a valid string (RFC 7541 §5.2).
const EOS: usize = 256;

/// The longest code, in bits.
const MAX_LEN: usize = 30;

/// The number of input bits resolved by one lookup in [`FAST`].
const FAST_BITS: u32 = 11;

/// For every `FAST_BITS`-bit prefix of the input: `length << 9 | symbol` of the code it starts
/// with, or 0 when that code is longer than `FAST_BITS` bits.
static FAST: [u16; 1 << FAST_BITS] = fast_table();

/// The canonical layout of the code: for each length, the first code and the number of codes.
static CANONICAL: Canonical = canonical();

/// Codes grouped by length (see [`CANONICAL`]).
#[derive(Debug)]
struct Canonical {
    /// The smallest code of each length (index = length).
    first: [u32; MAX_LEN + 1],
    /// The number of codes of each length.
    count: [u32; MAX_LEN + 1],
    /// Where the symbols of each length start in `symbols`.
    start: [u16; MAX_LEN + 1],
    /// The symbols ordered by (length, code).
    symbols: [u16; 257],
}

const fn fast_table() -> [u16; 1 << FAST_BITS] {
    let mut table = [0u16; 1 << FAST_BITS];
    let mut sym = 0;
    while sym < CODES.len() {
        let (code, len) = CODES[sym];
        if len as u32 <= FAST_BITS {
            let spare = FAST_BITS - len as u32;
            let base = (code << spare) as usize;
            let mut i = 0;
            while i < 1 << spare {
                table[base + i] = (len as u16) << 9 | sym as u16;
                i += 1;
            }
        }
        sym += 1;
    }
    table
}

const fn canonical() -> Canonical {
    let mut c = Canonical {
        first: [0; MAX_LEN + 1],
        count: [0; MAX_LEN + 1],
        start: [0; MAX_LEN + 1],
        symbols: [0; 257],
    };
    let mut sym = 0;
    while sym < CODES.len() {
        c.count[CODES[sym].1 as usize] += 1;
        sym += 1;
    }
    let mut len = 1;
    while len <= MAX_LEN {
        c.start[len] = c.start[len - 1] + c.count[len - 1] as u16;
        len += 1;
    }
    // Within a length, symbol order is code order and the codes are consecutive (RFC 7541's
    // code is canonical). The decoder relies on it; this checks it at compile time.
    let mut len = 1;
    while len <= MAX_LEN {
        let mut k = 0;
        let mut sym = 0;
        while sym < CODES.len() {
            let (code, l) = CODES[sym];
            if l as usize == len {
                if k == 0 {
                    c.first[len] = code;
                }
                assert!(code == c.first[len] + k, "RFC 7541 Appendix B code is canonical");
                c.symbols[c.start[len] as usize + k as usize] = sym as u16;
                k += 1;
            }
            sym += 1;
        }
        len += 1;
    }
    c
}

/// A Huffman-coded string is invalid: it contains EOS, ends inside a code, or is padded with more
/// than 7 bits or with bits that are not all ones (RFC 7541 §5.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InvalidHuffman;

/// The length in bytes of `src` once Huffman-coded, padding included.
#[inline]
pub(crate) fn encoded_len(src: &[u8]) -> usize {
    let bits: usize = src.iter().map(|&b| usize::from(CODES[usize::from(b)].1)).sum();
    bits.div_ceil(8)
}

/// Appends the Huffman coding of `src` to `dst`, padded with ones to a byte boundary.
pub(crate) fn encode(src: &[u8], dst: &mut Vec<u8>) {
    dst.reserve(encoded_len(src));
    // The pending bits are the low `n` bits of `acc`; higher bits are stale and shift out.
    let mut acc: u64 = 0;
    let mut n: u32 = 0;
    for &b in src {
        let (code, len) = CODES[usize::from(b)];
        acc = acc << len | u64::from(code);
        n += u32::from(len);
        // n < 32 + 30 here, so nothing pending is lost from the 64-bit accumulator.
        if n >= 32 {
            n -= 32;
            dst.extend_from_slice(&((acc >> n) as u32).to_be_bytes());
        }
    }
    while n >= 8 {
        n -= 8;
        dst.push((acc >> n) as u8);
    }
    if n > 0 {
        // The remaining n bits, then 8 - n one bits of EOS as padding.
        dst.push((acc << (8 - n)) as u8 | 0xff >> n);
    }
}

/// Appends the decoding of the Huffman-coded `src` to `dst`.
///
/// On error `dst` holds a partial decoding. The output is at most `src.len() * 8 / 5` bytes
/// (the shortest code has 5 bits), reserved up front.
pub(crate) fn decode(src: &[u8], dst: &mut Vec<u8>) -> Result<(), InvalidHuffman> {
    dst.reserve(src.len() * 8 / 5);
    // Unconsumed input bits, left-aligned: the next code starts at bit 63. Bits below the
    // `nbits` counted ones are either zero or the true bits that follow, at their place.
    let mut acc: u64 = 0;
    let mut nbits: u32 = 0;
    let mut pos = 0;
    // While 8 bytes remain, refill without a loop (OR in the next 8 bytes and count the whole
    // ones that fit; the bits of a partly fitting byte go to their place too, and a later
    // refill ORs the same bits again). Then at least 56 bits are available, more than any
    // code, so a code is always complete and EOS is always an error.
    while let Some(word) = src.get(pos..pos + 8) {
        let mut be = [0; 8];
        be.copy_from_slice(word);
        acc |= u64::from_be_bytes(be) >> nbits;
        pos += (63 - nbits as usize) >> 3;
        nbits |= 56;
        let (sym, len) = next_code(acc);
        if sym == EOS {
            return Err(InvalidHuffman);
        }
        dst.push(sym as u8);
        acc <<= len;
        nbits -= len;
    }
    // The last bytes (fewer than 8) the same way, from a copy followed by ones.
    let rest = &src[pos..];
    // The refills read at most 22 bytes into `tail` (fewer than 120 bits are left), and
    // ones beyond it.
    let mut tail = [0xff; 32];
    tail[..rest.len()].copy_from_slice(rest);
    let mut left = nbits + 8 * rest.len() as u32;
    let mut pos = 0;
    while left > 0 {
        if left < 8 && acc >> (64 - left) == (1 << left) - 1 {
            // Padding: fewer than 8 bits, all ones (the most significant bits of EOS). No code
            // is all ones but EOS, so these cannot be one.
            return Ok(());
        }
        let word = tail.get(pos..pos + 8).map_or(u64::MAX, |w| {
            let mut be = [0; 8];
            be.copy_from_slice(w);
            u64::from_be_bytes(be)
        });
        acc |= word >> nbits;
        pos += (63 - nbits as usize) >> 3;
        nbits |= 56;
        let (sym, len) = next_code(acc);
        if len > left || sym == EOS {
            // The input ends inside a code (or in too long or invalid padding), or has EOS.
            return Err(InvalidHuffman);
        }
        dst.push(sym as u8);
        acc <<= len;
        nbits -= len;
        left -= len;
    }
    Ok(())
}

/// Decodes the code at the top of `bits`: `(symbol, length)`.
#[inline(always)]
fn next_code(bits: u64) -> (usize, u32) {
    let entry = FAST[(bits >> (64 - FAST_BITS)) as usize];
    if entry != 0 {
        (usize::from(entry & 0x1ff), u32::from(entry >> 9))
    } else {
        long_code(bits)
    }
}

/// Decodes the code longer than `FAST_BITS` at the top of `bits`: `(symbol, length)`.
#[cold]
fn long_code(bits: u64) -> (usize, u32) {
    let c = &CANONICAL;
    for len in FAST_BITS as usize + 1..=MAX_LEN {
        let code = (bits >> (64 - len)) as u32;
        let k = code.wrapping_sub(c.first[len]);
        if k < c.count[len] {
            return (usize::from(c.symbols[usize::from(c.start[len]) + k as usize]), len as u32);
        }
    }
    // The code is complete (RFC 7541 Appendix B: every 30-bit string starts with a code), so
    // this is never reached; were it, EOS makes the caller reject the string.
    (EOS, MAX_LEN as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn decoded(src: &[u8]) -> Result<Vec<u8>, InvalidHuffman> {
        let mut out = Vec::new();
        decode(src, &mut out).map(|()| out)
    }

    fn encoded(src: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode(src, &mut out);
        assert_eq!(out.len(), encoded_len(src));
        out
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
    }

    #[test]
    fn code_is_complete_prefix_free_and_canonical() {
        // Kraft sum exactly 1: no bit string is left undecodable (RFC 7541 Appendix B).
        let kraft: u64 = CODES.iter().map(|&(_, len)| 1u64 << (MAX_LEN - usize::from(len))).sum();
        assert_eq!(kraft, 1 << MAX_LEN);
        // Canonical: in (length, symbol) order, each code is the previous plus one, shifted to
        // its length. This makes the code prefix-free and is what `long_code` relies on.
        let mut order: Vec<usize> = (0..CODES.len()).collect();
        order.sort_by_key(|&s| (CODES[s].1, s));
        let mut expected = 0u32;
        let mut prev_len = CODES[order[0]].1;
        for (k, &s) in order.iter().enumerate() {
            let (code, len) = CODES[s];
            if k > 0 {
                expected = (expected + 1) << (len - prev_len);
            }
            assert_eq!(code, expected, "symbol {s}");
            assert!(code < 1 << len);
            prev_len = len;
        }
        assert_eq!(CODES[EOS], ((1 << 30) - 1, 30));
    }

    #[test]
    fn tables_agree_with_codes() {
        for (sym, &(code, len)) in CODES.iter().enumerate() {
            let bits = u64::from(code) << (64 - u32::from(len));
            let entry = FAST[(bits >> (64 - FAST_BITS)) as usize];
            if u32::from(len) <= FAST_BITS {
                assert_eq!(entry, u16::from(len) << 9 | sym as u16);
            } else {
                assert_eq!(entry, 0);
                // Whatever follows the code does not matter.
                assert_eq!(long_code(bits), (sym, u32::from(len)));
                assert_eq!(long_code(bits | ((1 << (63 - len)) - 1)), (sym, u32::from(len)));
            }
        }
    }

    #[test]
    fn rfc7541_appendix_c_strings() {
        let cases: [(&str, &str); 12] = [
            ("www.example.com", "f1e3 c2e5 f23a 6ba0 ab90 f4ff"),
            ("no-cache", "a8eb 1064 9cbf"),
            ("custom-key", "25a8 49e9 5ba9 7d7f"),
            ("custom-value", "25a8 49e9 5bb8 e8b4 bf"),
            ("302", "6402"),
            ("307", "640e ff"),
            ("private", "aec3 771a 4b"),
            (
                "Mon, 21 Oct 2013 20:13:21 GMT",
                "d07a be94 1054 d444 a820 0595 040b 8166 e082 a62d 1bff",
            ),
            (
                "Mon, 21 Oct 2013 20:13:22 GMT",
                "d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff",
            ),
            ("https://www.example.com", "9d29 ad17 1863 c78f 0b97 c8e9 ae82 ae43 d3"),
            ("gzip", "9bd9 ab"),
            (
                "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1",
                "94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f 9587 \
                 3160 65c0 03ed 4ee5 b106 3d50 07",
            ),
        ];
        for (text, code) in cases {
            assert_eq!(encoded(text.as_bytes()), hex(code), "{text}");
            assert_eq!(decoded(&hex(code)), Ok(text.as_bytes().to_vec()), "{text}");
        }
    }

    #[test]
    fn round_trips_every_byte() {
        for b in 0..=255u8 {
            assert_eq!(decoded(&encoded(&[b])), Ok(vec![b]), "{b}");
            assert_eq!(decoded(&encoded(&[b, b, b])), Ok(vec![b, b, b]), "{b}");
        }
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decoded(&encoded(&all)), Ok(all.clone()));
        let reversed: Vec<u8> = all.iter().rev().copied().collect();
        assert_eq!(decoded(&encoded(&reversed)), Ok(reversed));
        assert_eq!(encoded(b""), b"");
        assert_eq!(decoded(b""), Ok(Vec::new()));
    }

    #[test]
    fn round_trips_random_strings() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..5000 {
            let len = (rng.next() % 80) as usize;
            // Half the strings from header-like characters, half from all bytes.
            let header_like = rng.next() & 1 == 0;
            let s: Vec<u8> = (0..len)
                .map(|_| {
                    let r = rng.next();
                    if header_like {
                        let chars = b"abcdefghijklmnopqrstuvwxyz0123456789-_./:+=%";
                        chars[(r % chars.len() as u64) as usize]
                    } else {
                        r as u8
                    }
                })
                .collect();
            let code = encoded(&s);
            assert_eq!(decoded(&code), Ok(s));
        }
    }

    #[test]
    fn rejects_invalid_strings() {
        // EOS (30 ones) inside a string, with 2 bits of padding.
        assert_eq!(decoded(&[0xff, 0xff, 0xff, 0xff]), Err(InvalidHuffman));
        // 'a' (00011) then EOS.
        assert_eq!(decoded(&[0x1f, 0xff, 0xff, 0xff, 0xf0]), Err(InvalidHuffman));
        // 'a' then 11 ones: padding longer than 7 bits.
        assert_eq!(decoded(&[0x1f, 0xff]), Err(InvalidHuffman));
        // EOS at the start of a long string, and after 8 bytes of it.
        assert_eq!(decoded(&[0xff; 12]), Err(InvalidHuffman));
        let mut s = encoded(&[b'a'; 16]); // 80 bits, no padding
        assert_eq!(s.len(), 10);
        s.extend_from_slice(&[0xff; 4]);
        assert_eq!(decoded(&s), Err(InvalidHuffman));
        // 8 ones alone: padding of a whole byte.
        assert_eq!(decoded(&[0xff]), Err(InvalidHuffman));
        // 'a' then padding 000: not a prefix of EOS.
        assert_eq!(decoded(&[0x18]), Err(InvalidHuffman));
        // '0' (00000) then 0 bits that start '0' again but end early.
        assert_eq!(decoded(&[0x00]), Err(InvalidHuffman));
        // 15 ones then a 0 bit: '{' (111111111111110), then padding "0".
        assert_eq!(decoded(&[0xff, 0xfe]), Err(InvalidHuffman));
        // Two NULs (13 bits each) cut after 24 bits: the input ends inside the second code.
        let two_nuls = encoded(&[0, 0]);
        assert_eq!(decoded(&two_nuls), Ok(vec![0, 0]));
        assert_eq!(decoded(&two_nuls[..3]), Err(InvalidHuffman));
        // Valid: 'a' with 3 bits of padding; '$' with 3 bits.
        assert_eq!(decoded(&[0x1f]), Ok(b"a".to_vec()));
        assert_eq!(decoded(&encoded(b"$")), Ok(b"$".to_vec()));
    }
}
