//! A DNS stub client (RFC 1035) for what `getaddrinfo` cannot do: TXT
//! records (the service config of gRFC A2, `_grpc_config.<host>`), and A
//! and AAAA records from the DNS server a target names
//! (`dns://10.0.0.2:53/host:port`).
//!
//! One UDP query per record type, with an EDNS0 OPT record offering 4 KiB
//! answers (a service config can outgrow DNS's classic 512 bytes), and one
//! answer read, matched by its id, within a timeout. The parser takes
//! nothing on trust: every length and offset is checked against the
//! message, compression pointers are never followed (only skipped: the
//! answers' owner names are not needed), and a malformed answer is an error
//! naming what was wrong (`fuzz/fuzz_targets/dns.rs` feeds it arbitrary
//! bytes). An answer truncated in spite of EDNS (the TC bit) is an error too;
//! this client does not retry over TCP.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

/// Record types this client asks for.
pub const A: u16 = 1;
pub const TXT: u16 = 16;
pub const AAAA: u16 = 28;
const OPT: u16 = 41;
const CLASS_IN: u16 = 1;
/// The UDP answer size offered (EDNS0) and read.
const MAX_ANSWER: usize = 4096;

/// One record of an answer, of the type asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Addr(IpAddr),
    /// A TXT record: its character-strings concatenated, as gRPC reads them.
    Txt(Vec<u8>),
}

/// Why a query could not be made or an answer not read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DnsError {
    /// The name cannot be asked for (an empty or over-long label, a name
    /// over 255 bytes).
    BadName(String),
    /// The answer is malformed: what was wrong.
    Malformed(&'static str),
    /// The server answered with this RCODE (2: server failure, 5: refused…).
    Rcode(u8),
    /// The answer did not fit, even with EDNS0.
    Truncated,
    /// No answer, or a socket error.
    Io(String),
}

impl fmt::Display for DnsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DnsError::BadName(n) => write!(f, "{n:?} is not a DNS name"),
            DnsError::Malformed(why) => write!(f, "malformed DNS answer: {why}"),
            DnsError::Rcode(c) => write!(f, "the DNS server answered RCODE {c}"),
            DnsError::Truncated => f.write_str("the DNS answer was truncated"),
            DnsError::Io(e) => f.write_str(e),
        }
    }
}

/// The query for `name`'s records of type `qtype`, with id `id`.
pub fn query(id: u16, name: &str, qtype: u16) -> Result<Vec<u8>, DnsError> {
    let name = name.strip_suffix('.').unwrap_or(name);
    let bad = || DnsError::BadName(name.to_string());
    if name.is_empty() || name.len() > 253 {
        return Err(bad());
    }
    let mut q = Vec::with_capacity(name.len() + 30);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00]); // a query, recursion desired
    q.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 1]); // 1 question, 1 additional
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(bad());
        }
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&CLASS_IN.to_be_bytes());
    // OPT: the root name, type 41, the UDP size in the class field, no
    // extended RCODE or flags, no options.
    q.push(0);
    q.extend_from_slice(&OPT.to_be_bytes());
    q.extend_from_slice(&(MAX_ANSWER as u16).to_be_bytes());
    q.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    Ok(q)
}

/// The records of type `qtype` in the answer `msg` to query `id`. A name
/// that does not exist (NXDOMAIN) has no records: an empty list.
pub fn parse(msg: &[u8], id: u16, qtype: u16) -> Result<Vec<Record>, DnsError> {
    let mut r = Reader { msg, at: 0 };
    if r.u16()? != id {
        return Err(DnsError::Malformed("another query's id"));
    }
    let flags = r.u16()?;
    if flags & 0x8000 == 0 {
        return Err(DnsError::Malformed("a query, not an answer"));
    }
    if flags & 0x0200 != 0 {
        return Err(DnsError::Truncated);
    }
    match (flags & 0x000f) as u8 {
        0 => {}
        3 => return Ok(Vec::new()),
        code => return Err(DnsError::Rcode(code)),
    }
    let (questions, answers) = (r.u16()?, r.u16()?);
    r.skip(4)?; // authority and additional counts: not read
    for _ in 0..questions {
        r.name()?;
        r.skip(4)?;
    }
    let mut out = Vec::new();
    for _ in 0..answers {
        r.name()?;
        let (rtype, class) = (r.u16()?, r.u16()?);
        r.skip(4)?; // TTL
        let len = r.u16()? as usize;
        let data = r.take(len)?;
        if class != CLASS_IN || rtype != qtype {
            continue; // a CNAME on the way, or another type
        }
        out.push(match rtype {
            A => Record::Addr(IpAddr::V4(Ipv4Addr::from(
                <[u8; 4]>::try_from(data)
                    .map_err(|_| DnsError::Malformed("an A record not 4 bytes"))?,
            ))),
            AAAA => Record::Addr(IpAddr::V6(Ipv6Addr::from(
                <[u8; 16]>::try_from(data)
                    .map_err(|_| DnsError::Malformed("an AAAA record not 16 bytes"))?,
            ))),
            _ => Record::Txt(txt(data)?),
        });
    }
    Ok(out)
}

/// A TXT record's character-strings (each a length byte and its bytes),
/// concatenated.
fn txt(data: &[u8]) -> Result<Vec<u8>, DnsError> {
    let mut out = Vec::with_capacity(data.len());
    let mut at = 0;
    while at < data.len() {
        let n = data[at] as usize;
        let s = data
            .get(at + 1..at + 1 + n)
            .ok_or(DnsError::Malformed("a TXT string past its record"))?;
        out.extend_from_slice(s);
        at += 1 + n;
    }
    Ok(out)
}

struct Reader<'a> {
    msg: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DnsError> {
        let s = self.msg.get(self.at..self.at + n).ok_or(DnsError::Malformed("truncated"))?;
        self.at += n;
        Ok(s)
    }

    fn skip(&mut self, n: usize) -> Result<(), DnsError> {
        self.take(n).map(|_| ())
    }

    fn u16(&mut self) -> Result<u16, DnsError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    /// Skips a name: labels up to the root, or up to a compression pointer
    /// (which ends a name and is not followed). Each label moves forward,
    /// so this ends within the message.
    fn name(&mut self) -> Result<(), DnsError> {
        loop {
            let len = self.take(1)?[0];
            match len & 0xc0 {
                0x00 if len == 0 => return Ok(()),
                0x00 => self.skip(len as usize)?,
                0xc0 => return self.skip(1),
                _ => return Err(DnsError::Malformed("a label type that does not exist")),
            }
        }
    }
}

/// Asks `server` for `name`'s records of type `qtype`: one UDP query, the
/// first answer with its id, within `timeout`.
pub async fn lookup(
    server: SocketAddr,
    name: &str,
    qtype: u16,
    timeout: Duration,
) -> Result<Vec<Record>, DnsError> {
    let id = query_id();
    let q = query(id, name, qtype)?;
    let io = |e: std::io::Error| DnsError::Io(format!("DNS server {server}: {e}"));
    let local: SocketAddr = match server {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let exchange = async {
        let sock = tokio::net::UdpSocket::bind(local).await.map_err(io)?;
        sock.connect(server).await.map_err(io)?;
        sock.send(&q).await.map_err(io)?;
        let mut buf = vec![0u8; MAX_ANSWER];
        loop {
            let n = sock.recv(&mut buf).await.map_err(io)?;
            match parse(&buf[..n], id, qtype) {
                // Another query's answer (a late one): wait for ours.
                Err(DnsError::Malformed("another query's id")) => continue,
                done => return done,
            }
        }
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(r) => r,
        Err(_) => Err(DnsError::Io(format!("DNS server {server}: no answer in {timeout:?}"))),
    }
}

/// A query id no one on the path can guess from the last one.
fn query_id() -> u16 {
    crate::backoff::random_u64() as u16
}

/// The first `nameserver` of `/etc/resolv.conf`, port 53.
pub fn system_server() -> Option<SocketAddr> {
    let conf = std::fs::read_to_string("/etc/resolv.conf").ok()?;
    conf.lines().find_map(|l| {
        let mut words = l.split_whitespace();
        (words.next() == Some("nameserver"))
            .then(|| words.next()?.parse::<IpAddr>().ok())
            .flatten()
            .map(|ip| SocketAddr::new(ip, 53))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer to `q` (its question echoed) with `records` of `(type,
    /// data)`, the first owner name a pointer to the question's.
    pub(crate) fn answer(q: &[u8], rcode: u8, records: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let question_end = 12 + q[12..].iter().position(|&b| b == 0).expect("a name") + 1 + 4;
        let mut a = q[..2].to_vec();
        a.extend_from_slice(&[0x81, 0x80 | rcode]);
        a.extend_from_slice(&[0, 1]);
        a.extend_from_slice(&(records.len() as u16).to_be_bytes());
        a.extend_from_slice(&[0, 0, 0, 0]);
        a.extend_from_slice(&q[12..question_end]);
        for (i, (t, data)) in records.iter().enumerate() {
            if i == 0 {
                a.extend_from_slice(&[0xc0, 12]);
            } else {
                a.extend_from_slice(&[3, b'f', b'o', b'o', 0]);
            }
            a.extend_from_slice(&t.to_be_bytes());
            a.extend_from_slice(&[0, 1, 0, 0, 0, 60]);
            a.extend_from_slice(&(data.len() as u16).to_be_bytes());
            a.extend_from_slice(data);
        }
        a
    }

    #[test]
    fn queries_name_their_labels_and_offer_edns() {
        let q = query(0x1234, "_grpc_config.svc.example.", TXT).expect("a name");
        assert_eq!(&q[..4], &[0x12, 0x34, 0x01, 0x00]);
        assert_eq!(&q[12..29], b"\x0c_grpc_config\x03svc");
        assert!(q.ends_with(&[0, 0, 41, 0x10, 0x00, 0, 0, 0, 0, 0, 0]), "{q:02x?}");
        for bad in ["", "a..b", &"x".repeat(64), &"a.".repeat(130)] {
            assert!(matches!(query(1, bad, A), Err(DnsError::BadName(_))), "{bad:?}");
        }
    }

    #[test]
    fn answers_give_their_records_of_the_type_asked_for() {
        let q = query(7, "svc.example", TXT).expect("a name");
        let a = answer(
            &q,
            0,
            &[
                (TXT, b"\x05grpc_\x07config=".to_vec()),
                (A, vec![10, 0, 0, 1]),
                (TXT, b"\x03abc\x00".to_vec()),
            ],
        );
        assert_eq!(
            parse(&a, 7, TXT),
            Ok(vec![Record::Txt(b"grpc_config=".to_vec()), Record::Txt(b"abc".to_vec())])
        );
        assert_eq!(parse(&a, 7, A), Ok(vec![Record::Addr(IpAddr::from([10, 0, 0, 1]))]));
        assert_eq!(parse(&answer(&q, 3, &[]), 7, TXT), Ok(vec![]), "NXDOMAIN: no records");
        assert_eq!(parse(&answer(&q, 2, &[]), 7, TXT), Err(DnsError::Rcode(2)));
        assert_eq!(parse(&a, 8, TXT), Err(DnsError::Malformed("another query's id")));
    }

    #[test]
    fn malformed_answers_are_errors_never_panics() {
        let q = query(7, "svc.example", AAAA).expect("a name");
        let good = answer(&q, 0, &[(AAAA, vec![0; 16]), (TXT, b"\x02hi".to_vec())]);
        assert!(parse(&good, 7, AAAA).is_ok());
        // Every truncation and every single-byte change of a good answer.
        for n in 0..good.len() {
            let _ = parse(&good[..n], 7, AAAA);
            let _ = parse(&good[..n], 7, TXT);
        }
        for i in 0..good.len() {
            for v in [0x00, 0x3f, 0x40, 0x80, 0xc0, 0xff] {
                let mut bad = good.clone();
                bad[i] = v;
                let _ = parse(&bad, 7, AAAA);
                let _ = parse(&bad, 7, TXT);
            }
        }
        let short = answer(&q, 0, &[(AAAA, vec![0; 4])]);
        assert_eq!(parse(&short, 7, AAAA), Err(DnsError::Malformed("an AAAA record not 16 bytes")));
        let over = answer(&q, 0, &[(TXT, b"\x09hi".to_vec())]);
        assert_eq!(parse(&over, 7, TXT), Err(DnsError::Malformed("a TXT string past its record")));
        let mut tc = good.clone();
        tc[2] |= 0x02;
        assert_eq!(parse(&tc, 7, AAAA), Err(DnsError::Truncated));
    }
}
