//! DNS answers (`protoplane_rpc::dns::parse`) as a DNS server, or anyone
//! able to send a UDP datagram to the client's port, hands them over, and
//! the TXT text they carry as gRFC A2's service-config choices
//! (`ServiceConfig::from_dns_txt`).
//!
//! The first byte picks the record type asked for (A, AAAA or TXT); the
//! answer's own first two bytes are taken as the query id, so the header
//! checks are passed and the parser reaches the records. Properties,
//! beyond "never panics": every record is of the type asked for, an
//! address record holds an address of its family, and a TXT record's text
//! is never longer than the answer.

#![no_main]

use libfuzzer_sys::fuzz_target;
use protoplane_rpc::config::ServiceConfig;
use protoplane_rpc::dns::{parse, Record, A, AAAA, TXT};

fuzz_target!(|data: &[u8]| {
    let Some((&pick, answer)) = data.split_first() else { return };
    let qtype = [A, AAAA, TXT][pick as usize % 3];
    let id = u16::from_be_bytes([
        answer.first().copied().unwrap_or(0),
        answer.get(1).copied().unwrap_or(0),
    ]);
    let Ok(records) = parse(answer, id, qtype) else { return };
    for r in records {
        match r {
            Record::Addr(ip) => {
                assert!(qtype != TXT);
                assert_eq!(ip.is_ipv4(), qtype == A);
            }
            Record::Txt(text) => {
                assert_eq!(qtype, TXT);
                assert!(text.len() <= answer.len());
                if let Ok(text) = std::str::from_utf8(&text) {
                    let _ = ServiceConfig::from_dns_txt(text, "host", 50);
                }
            }
        }
    }
});
