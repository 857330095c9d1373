//! The attach handshake on an application's bytes: the HELLO as the
//! engine parses and judges it, and the answer as an application parses
//! it.
//!
//! Input: the first eight bytes are the peer's credentials (uid, gid, as
//! the kernel would report them), the rest is one handshake message.
//!
//! Properties, beyond "never panics":
//! * a HELLO that parses re-encodes to the same bytes (no two byte strings
//!   mean the same request);
//! * the engine's admission check accepts it only if it names each service
//!   once and every service is allowed to the peer by the rules (one rule
//!   per service, a `*` rule, and services with none), and each refusal
//!   says why;
//! * an ACCEPT that parses carries a layout that validates, and re-encodes
//!   to the same bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use protoplane_engine::{Admission, Credentials, Principal};
use protoplane_shm::attach::{Answer, Hello};

fuzz_target!(|data: &[u8]| {
    let Some((cred, msg)) = data.split_first_chunk::<8>() else { return };
    let uid = u32::from_le_bytes([cred[0], cred[1], cred[2], cred[3]]);
    let gid = u32::from_le_bytes([cred[4], cred[5], cred[6], cred[7]]);
    let peer = Credentials { uid, gid, pid: None };

    if let Ok(hello) = Hello::decode(msg) {
        assert_eq!(hello.encode(), msg, "a HELLO has one encoding");
        let mut rules = Admission::default();
        // Services starting with "a" only for uid 0; "*" only for gid 7.
        for (name, _) in &hello.services {
            if name.starts_with('a') {
                rules.allow.insert(name.clone(), vec![Principal::Uid(0)]);
            }
        }
        rules.allow.insert("*".into(), vec![Principal::Gid(7)]);
        let verdict = rules.check(&hello, &peer);
        let mut names: Vec<&str> = hello.services.iter().map(|(n, _)| n.as_str()).collect();
        names.sort_unstable();
        let twice = names.windows(2).any(|w| w[0] == w[1]);
        let allowed = hello.services.iter().all(|(n, _)| match n.starts_with('a') {
            true => uid == 0,
            false => gid == 7,
        });
        let version_ok = hello.version == protoplane_shm::attach::VERSION;
        match verdict {
            Ok(()) => assert!(!twice && allowed && version_ok),
            Err(why) => {
                assert!(twice || !allowed || !version_ok, "refused for nothing: {why}");
                // The refusal names the rule the HELLO broke.
                use protoplane_engine::Refusal;
                match &why {
                    Refusal::Version { .. } => assert!(!version_ok),
                    Refusal::ListedTwice(_) => assert!(twice),
                    Refusal::NotAllowed { .. } => assert!(!allowed),
                    _ => {}
                }
                assert!(!why.to_string().is_empty());
            }
        }
    }

    if let Ok(answer) = Answer::decode(msg) {
        if let Answer::Accept { layout, .. } = &answer {
            assert!(layout.validate(None).is_ok());
            assert_eq!(answer.encode(), msg, "an ACCEPT has one encoding");
        }
    }
});
