//! Compute units: programming, chains on device refs, hostile descriptors,
//! back-pressure, vanishing units, user kernels, stats.

use std::io::{Read, Write};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use protoplane_offload::cu::{
    ComputeUnits, CuConfig, CuError, DescriptorError, DeviceRef, Kernel, KernelError, Notification,
    Output, ParamKind, ParamSpec, ParamValue, Params, RegionError, TaskDescriptor, Ticket,
};
use ring::aead;

const WAIT: Duration = Duration::from_secs(5);

fn config() -> CuConfig {
    CuConfig {
        slots: 4,
        ring_entries: 4,
        notification_entries: 8,
        region_capacity: 4 << 20,
        max_output: 1 << 20,
        ..CuConfig::default()
    }
}

fn engine() -> ComputeUnits {
    ComputeUnits::new(config()).expect("engine starts")
}

fn wait(cu: &ComputeUnits, t: Ticket) -> Notification {
    cu.wait(t, WAIT).expect("notification within the timeout")
}

/// Runs one task to completion and returns its status.
fn run(cu: &ComputeUnits, slot: usize, desc: TaskDescriptor) -> Result<DeviceRef, KernelError> {
    let t = cu.submit_task(slot, desc).expect("submit accepted");
    let n = wait(cu, t);
    assert_eq!(n.ticket, t);
    n.status
}

fn host_seal(
    alg: &'static aead::Algorithm,
    key: &[u8],
    nonce: [u8; 12],
    aad: &[u8],
    pt: &[u8],
) -> Vec<u8> {
    let key = aead::LessSafeKey::new(aead::UnboundKey::new(alg, key).expect("key"));
    let mut buf = pt.to_vec();
    key.seal_in_place_append_tag(
        aead::Nonce::assume_unique_for_key(nonce),
        aead::Aad::from(aad),
        &mut buf,
    )
    .expect("seal");
    buf
}

fn host_open(
    alg: &'static aead::Algorithm,
    key: &[u8],
    nonce: [u8; 12],
    aad: &[u8],
    ct: &[u8],
) -> Option<Vec<u8>> {
    let key = aead::LessSafeKey::new(aead::UnboundKey::new(alg, key).expect("key"));
    let mut buf = ct.to_vec();
    let pt = key
        .open_in_place(aead::Nonce::assume_unique_for_key(nonce), aead::Aad::from(aad), &mut buf)
        .ok()?;
    Some(pt.to_vec())
}

fn host_deflate(data: &[u8], level: u32) -> Vec<u8> {
    let mut enc = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::new(level));
    enc.write_all(data).expect("deflate");
    enc.finish().expect("deflate finish")
}

fn host_inflate(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::DeflateDecoder::new(data).read_to_end(&mut out).expect("inflate");
    out
}

fn plaintext() -> Vec<u8> {
    let mut p = Vec::new();
    for i in 0..2000u32 {
        p.extend_from_slice(format!("record {i}: the quick brown fox; ").as_bytes());
    }
    p
}

/// A user kernel that blocks until released (or 5 s pass), then copies its
/// input: makes tasks be in flight without timing assumptions.
#[derive(Debug, Default)]
struct Gate {
    state: Mutex<(usize, bool)>,
    cv: Condvar,
}

impl Gate {
    fn wait_started(&self, n: usize) {
        let st = self.state.lock().expect("gate lock");
        let (st, timeout) = self.cv.wait_timeout_while(st, WAIT, |s| s.0 < n).expect("gate wait");
        assert!(!timeout.timed_out(), "only {} gate tasks started", st.0);
    }

    fn open(&self) {
        self.state.lock().expect("gate lock").1 = true;
        self.cv.notify_all();
    }
}

#[derive(Debug)]
struct GateKernel(Arc<Gate>);

impl Kernel for GateKernel {
    fn name(&self) -> &str {
        "test.gate"
    }

    fn run(&self, input: &[u8], _: &Params, out: &mut Output) -> Result<(), KernelError> {
        let gate = &self.0;
        let mut st = gate.state.lock().map_err(|_| KernelError::Failed("lock".into()))?;
        st.0 += 1;
        gate.cv.notify_all();
        let _ = gate
            .cv
            .wait_timeout_while(st, WAIT, |s| !s.1)
            .map_err(|_| KernelError::Failed("lock".into()))?;
        out.extend_from_slice(input)
    }
}

fn gate_engine(cfg: CuConfig) -> (ComputeUnits, Arc<Gate>) {
    let cu = ComputeUnits::new(cfg).expect("engine starts");
    let gate = Arc::new(Gate::default());
    cu.register(Arc::new(GateKernel(Arc::clone(&gate)))).expect("register gate");
    (cu, gate)
}

#[test]
fn program_get_type_reprogram() {
    let cu = engine();
    assert_eq!(cu.slots(), 4);
    for k in [
        "deflate.compress",
        "deflate.decompress",
        "aes256gcm.seal",
        "aes256gcm.open",
        "chacha20poly1305.seal",
        "chacha20poly1305.open",
        "crc32",
    ] {
        assert!(cu.kernels().iter().any(|n| n == k), "{k} registered");
    }
    assert_eq!(cu.get_type(0), None);
    let input = cu.region().alloc_write(b"abc").expect("stage");
    assert_eq!(cu.submit_task(0, TaskDescriptor::new(input)), Err(CuError::NotProgrammed(0)));

    cu.program(0, "crc32").expect("program crc32");
    assert_eq!(cu.get_type(0).as_deref(), Some("crc32"));
    let out = run(&cu, 0, TaskDescriptor::new(input)).expect("crc32 ran");
    assert_eq!(out.len, 4);

    cu.program(0, "deflate.compress").expect("reprogram");
    assert_eq!(cu.get_type(0).as_deref(), Some("deflate.compress"));
    let out2 = run(&cu, 0, TaskDescriptor::new(input)).expect("compress ran");
    let bytes = cu.region().read(out2).expect("read");
    assert_eq!(host_inflate(&bytes), b"abc");

    assert_eq!(
        cu.program(0, "no.such.kernel"),
        Err(CuError::UnknownKernel("no.such.kernel".into()))
    );
    assert_eq!(cu.get_type(0).as_deref(), Some("deflate.compress"));
    assert_eq!(cu.program(9, "crc32"), Err(CuError::NoSuchSlot(9)));
    assert_eq!(cu.get_type(9), None);
    assert_eq!(cu.get_type(1), None);
}

#[test]
fn crc32_known_answer() {
    let cu = engine();
    cu.program(2, "crc32").expect("program");
    let input = cu.region().alloc_write(b"123456789").expect("stage");
    let out = run(&cu, 2, TaskDescriptor::new(input)).expect("crc32 ran");
    assert_eq!(cu.region().read(out).expect("read"), 0xCBF4_3926u32.to_le_bytes());
}

#[test]
fn chain_decrypt_compress_encrypt_stays_on_device() {
    let cu = engine();
    let k1 = [7u8; 32];
    let k2 = [9u8; 32];
    let n1 = [1u8; 12];
    let n2 = [2u8; 12];
    cu.set_key(1, &k1).expect("key 1");
    cu.set_key(2, &k2).expect("key 2");
    cu.program(0, "aes256gcm.open").expect("program open");
    cu.program(1, "deflate.compress").expect("program compress");
    cu.program(2, "chacha20poly1305.seal").expect("program seal");

    let pt = plaintext();
    // What arrived on the wire, encrypted by the peer.
    let c1 = host_seal(&aead::AES_256_GCM, &k1, n1, b"hdr-in", &pt);
    let c1_ref = cu.region().alloc_write(&c1).expect("stage ciphertext");
    let aad_in = cu.region().alloc_write(b"hdr-in").expect("stage aad");
    let aad_out = cu.region().alloc_write(b"hdr-out").expect("stage aad");

    let plain = run(
        &cu,
        0,
        TaskDescriptor::new(c1_ref)
            .param_u64("key_id", 1)
            .param_bytes("nonce", &n1)
            .param_ref("aad", aad_in),
    )
    .expect("decrypt");
    assert_eq!(plain.len as usize, pt.len());
    let packed = run(&cu, 1, TaskDescriptor::new(plain).param_u64("level", 6)).expect("compress");
    assert!((packed.len as usize) < pt.len() / 4, "plaintext compresses");
    let sealed = run(
        &cu,
        2,
        TaskDescriptor::new(packed)
            .param_u64("key_id", 2)
            .param_bytes("nonce", &n2)
            .param_ref("aad", aad_out),
    )
    .expect("encrypt");
    assert_eq!(sealed.len, packed.len + 16);

    // Only the final bytes cross to the host.
    let c2 = cu.region().read(sealed).expect("fetch");
    let packed_host =
        host_open(&aead::CHACHA20_POLY1305, &k2, n2, b"hdr-out", &c2).expect("host decrypts");
    assert_eq!(host_inflate(&packed_host), pt);

    // Everything freed: the region is empty again.
    for r in [c1_ref, aad_in, aad_out, plain, packed, sealed] {
        cu.region().free(r).expect("free");
    }
    assert_eq!(cu.region().used(), 0);
    assert_eq!(cu.region().allocations(), 0);
}

#[test]
fn tampered_ciphertext_fails() {
    let cu = engine();
    let key = [3u8; 32];
    let nonce = [5u8; 12];
    cu.set_key(4, &key).expect("key");
    for (slot, name, alg) in [
        (0, "aes256gcm.open", &aead::AES_256_GCM),
        (1, "chacha20poly1305.open", &aead::CHACHA20_POLY1305),
    ] {
        cu.program(slot, name).expect("program");
        let mut ct = host_seal(alg, &key, nonce, b"", b"secret payload");
        let good = cu.region().alloc_write(&ct).expect("stage");
        let out = run(
            &cu,
            slot,
            TaskDescriptor::new(good).param_u64("key_id", 4).param_bytes("nonce", &nonce),
        )
        .expect("untampered opens");
        assert_eq!(cu.region().read(out).expect("read"), b"secret payload");

        ct[3] ^= 0x40;
        let bad = cu.region().alloc_write(&ct).expect("stage");
        let used = cu.region().used();
        let st = run(
            &cu,
            slot,
            TaskDescriptor::new(bad).param_u64("key_id", 4).param_bytes("nonce", &nonce),
        );
        assert_eq!(st, Err(KernelError::AuthFailed), "{name}");
        assert_eq!(cu.region().used(), used, "failed task allocates nothing");

        // Wrong AAD fails too.
        let aad = cu.region().alloc_write(b"other").expect("stage");
        let st = run(
            &cu,
            slot,
            TaskDescriptor::new(good)
                .param_u64("key_id", 4)
                .param_bytes("nonce", &nonce)
                .param_ref("aad", aad),
        );
        assert_eq!(st, Err(KernelError::AuthFailed), "{name} with wrong aad");
        // Shorter than a tag.
        let tiny = cu.region().alloc_write(&[1, 2, 3]).expect("stage");
        let st = run(
            &cu,
            slot,
            TaskDescriptor::new(tiny).param_u64("key_id", 4).param_bytes("nonce", &nonce),
        );
        assert_eq!(st, Err(KernelError::AuthFailed), "{name} on 3 bytes");
    }
}

#[test]
fn hostile_descriptors_fail_cleanly_and_unit_keeps_working() {
    let cu = engine();
    cu.set_key(1, &[1u8; 32]).expect("key");
    cu.program(0, "aes256gcm.seal").expect("program");
    cu.program(1, "deflate.compress").expect("program");
    let region = cu.region();
    let a = region.alloc_write(&[0xAA; 100]).expect("stage a");
    let b = region.alloc_write(&[0xBB; 100]).expect("stage b");
    let cap = region.capacity();
    let seal = |input: DeviceRef| {
        TaskDescriptor::new(input).param_u64("key_id", 1).param_bytes("nonce", &[0u8; 12])
    };
    let invalid = |r: Result<Ticket, CuError>| match r {
        Err(CuError::Invalid(e)) => e,
        other => panic!("expected an invalid-descriptor error, got {other:?}"),
    };

    // Ranges: beyond the region, overflowing u32, huge, straddling two
    // allocations, in free space, zero length.
    for bad in [
        DeviceRef::new(cap - 10, 100),
        DeviceRef::new(u32::MAX, u32::MAX),
        DeviceRef::new(0, u32::MAX),
        DeviceRef::new(a.offset + 50, 100),
        DeviceRef::new(b.offset + b.len + 10, 5),
    ] {
        let e = invalid(cu.submit_task(0, seal(bad)));
        assert!(
            matches!(&e, DescriptorError::OutOfRange { what, .. } if what == "input"),
            "{bad}: {e}"
        );
    }
    assert_eq!(
        invalid(cu.submit_task(0, seal(DeviceRef::new(a.offset, 0)))),
        DescriptorError::EmptyInput
    );
    // A device parameter out of range.
    assert!(matches!(
        invalid(cu.submit_task(0, seal(a).param_ref("aad", DeviceRef::new(cap, 1)))),
        DescriptorError::OutOfRange { what, .. } if what == "aad"
    ));
    // Unknown, duplicate, wrong-kind, missing, oversized parameters.
    assert_eq!(
        invalid(cu.submit_task(0, seal(a).param_u64("rounds", 1))),
        DescriptorError::UnknownParam("rounds".into())
    );
    assert_eq!(
        invalid(cu.submit_task(0, seal(a).param_u64("key_id", 2))),
        DescriptorError::DuplicateParam("key_id".into())
    );
    assert_eq!(
        invalid(cu.submit_task(
            0,
            TaskDescriptor::new(a).param_bytes("key_id", &[1]).param_bytes("nonce", &[0; 12])
        )),
        DescriptorError::WrongKind("key_id".into())
    );
    assert_eq!(
        invalid(cu.submit_task(0, TaskDescriptor::new(a).param_u64("key_id", 1))),
        DescriptorError::MissingParam("nonce".into())
    );
    assert!(matches!(
        invalid(
            cu.submit_task(
                0,
                TaskDescriptor::new(a)
                    .param_u64("key_id", 1)
                    .param("nonce", ParamValue::Bytes(vec![0; 1 << 20]))
            )
        ),
        DescriptorError::ParamTooLarge { .. }
    ));
    let mut many = seal(a);
    for i in 0..20 {
        many = many.param_u64(&format!("p{i}"), 0);
    }
    assert!(matches!(invalid(cu.submit_task(0, many)), DescriptorError::TooManyParams { .. }));
    assert!(matches!(
        invalid(cu.submit_task(0, seal(a).max_output(u32::MAX))),
        DescriptorError::OutputLimitTooLarge { .. }
    ));
    assert_eq!(cu.submit_task(7, seal(a)).map(|_| ()), Err(CuError::NoSuchSlot(7)));

    // Values only the kernel can judge: error notifications.
    assert_eq!(
        run(&cu, 0, TaskDescriptor::new(a).param_u64("key_id", 99).param_bytes("nonce", &[0; 12])),
        Err(KernelError::UnknownKey(99))
    );
    assert!(matches!(
        run(
            &cu,
            0,
            TaskDescriptor::new(a)
                .param_u64("key_id", 1)
                .param_bytes("nonce", &[0; 5])
        ),
        Err(KernelError::BadParam { name, .. }) if name == "nonce"
    ));
    assert!(matches!(
        run(&cu, 1, TaskDescriptor::new(a).param_u64("level", 99)),
        Err(KernelError::BadParam { name, .. }) if name == "level"
    ));
    assert!(matches!(
        run(&cu, 1, TaskDescriptor::new(a).param_u64("level", u64::MAX)),
        Err(KernelError::BadParam { .. })
    ));
    // Oversized output: sealing 100 bytes needs 116.
    assert_eq!(run(&cu, 0, seal(a).max_output(50)), Err(KernelError::OutputTooLarge { limit: 50 }));
    // A freed range is refused.
    let c = region.alloc_write(&[1; 10]).expect("stage c");
    region.free(c).expect("free c");
    assert!(cu.submit_task(0, seal(c)).is_err(), "freed input refused");

    // Nothing leaked by the failures, and both units still work.
    assert_eq!(region.allocations(), 2);
    let out = run(&cu, 0, seal(a)).expect("seal works after hostile tasks");
    assert_eq!(out.len, 116);
    let out2 = run(&cu, 1, TaskDescriptor::new(b)).expect("compress works");
    assert_eq!(host_inflate(&region.read(out2).expect("read")), vec![0xBB; 100]);
    let stats = cu.stats(0).expect("stats");
    assert!(stats.refused >= 10, "refusals counted: {stats:?}");
    assert_eq!(stats.done, 1);
    assert_eq!(stats.failed, 3);
}

#[test]
fn decompression_bomb_and_corrupt_streams_fail_cleanly() {
    let cu = engine();
    cu.program(0, "deflate.decompress").expect("program");
    let region = cu.region();
    // 2 MiB of zeros in a few KiB: above the engine's 1 MiB output limit.
    let bomb = host_deflate(&vec![0u8; 2 << 20], 1);
    assert!(bomb.len() < 64 << 10);
    let bomb_ref = region.alloc_write(&bomb).expect("stage bomb");
    let used = region.used();
    assert_eq!(
        run(&cu, 0, TaskDescriptor::new(bomb_ref)),
        Err(KernelError::OutputTooLarge { limit: 1 << 20 })
    );
    // A tighter per-task limit.
    let small = region.alloc_write(&host_deflate(&[7u8; 5000], 6)).expect("stage");
    assert_eq!(
        run(&cu, 0, TaskDescriptor::new(small).max_output(4999)),
        Err(KernelError::OutputTooLarge { limit: 4999 })
    );
    assert_eq!(region.used(), used + small.len, "failed tasks allocate nothing");

    // Garbage, truncated stream, trailing bytes.
    let garbage = region.alloc_write(&[0xFF; 64]).expect("stage");
    assert!(matches!(run(&cu, 0, TaskDescriptor::new(garbage)), Err(KernelError::Corrupt(_))));
    let good = host_deflate(&plaintext(), 6);
    let trunc = region.alloc_write(&good[..good.len() / 2]).expect("stage");
    assert!(matches!(run(&cu, 0, TaskDescriptor::new(trunc)), Err(KernelError::Corrupt(_))));
    let mut trailing = good.clone();
    trailing.extend_from_slice(b"junk");
    let trailing = region.alloc_write(&trailing).expect("stage");
    assert!(matches!(run(&cu, 0, TaskDescriptor::new(trailing)), Err(KernelError::Corrupt(_))));

    // The unit still decompresses a good stream.
    let good_ref = region.alloc_write(&good).expect("stage");
    let out = run(&cu, 0, TaskDescriptor::new(good_ref)).expect("inflate");
    assert_eq!(region.read(out).expect("read"), plaintext());
}

#[test]
fn ring_full_is_refused_and_drains() {
    let (cu, gate) = gate_engine(CuConfig { ring_entries: 2, notification_entries: 8, ..config() });
    cu.program(0, "test.gate").expect("program gate");
    let input = cu.region().alloc_write(b"x").expect("stage");
    let first = cu.submit_task(0, TaskDescriptor::new(input)).expect("first");
    gate.wait_started(1); // the unit fetched it: the ring is empty again
    let t2 = cu.submit_task(0, TaskDescriptor::new(input)).expect("2nd");
    let t3 = cu.submit_task(0, TaskDescriptor::new(input)).expect("3rd");
    assert_eq!(
        cu.submit_task(0, TaskDescriptor::new(input)),
        Err(CuError::RingFull { slot: 0, capacity: 2 })
    );
    assert_eq!(cu.poll(first), None, "still running");
    gate.open();
    for t in [first, t2, t3] {
        assert!(wait(&cu, t).status.is_ok());
    }
    assert!(cu.submit_task(0, TaskDescriptor::new(input)).is_ok());
    assert_eq!(cu.stats(0).expect("stats").refused, 1);
}

#[test]
fn notification_ring_full_is_refused_until_polled() {
    let cu = ComputeUnits::new(CuConfig { ring_entries: 8, notification_entries: 4, ..config() })
        .expect("engine");
    cu.program(0, "crc32").expect("program");
    let input = cu.region().alloc_write(b"abc").expect("stage");
    let mut tickets: Vec<Ticket> =
        (0..4).map(|_| cu.submit_task(0, TaskDescriptor::new(input)).expect("submit")).collect();
    assert_eq!(cu.outstanding(0), 4);
    // Queued, running or done: each holds its notification entry until polled.
    assert_eq!(
        cu.submit_task(0, TaskDescriptor::new(input)),
        Err(CuError::NotificationRingFull { slot: 0, capacity: 4 })
    );
    let n = wait(&cu, tickets[0]);
    assert!(n.status.is_ok());
    assert!(cu.poll(tickets[0]).is_none(), "delivered once");
    assert!(cu.wait(tickets[0], WAIT).is_none(), "no wait for a taken ticket");
    let t = cu.submit_task(0, TaskDescriptor::new(input)).expect("room after a poll");
    tickets.push(t);
    for t in &tickets[1..] {
        assert!(wait(&cu, *t).status.is_ok());
    }
    assert_eq!(cu.outstanding(0), 0);
}

#[test]
fn input_freed_after_submit_fails_the_task() {
    let (cu, gate) = gate_engine(config());
    cu.program(0, "test.gate").expect("program");
    let first = cu.region().alloc_write(b"first").expect("stage");
    let doomed = cu.region().alloc_write(b"doomed").expect("stage");
    let t1 = cu.submit_task(0, TaskDescriptor::new(first)).expect("submit");
    gate.wait_started(1);
    let t2 = cu.submit_task(0, TaskDescriptor::new(doomed)).expect("submit");
    cu.region().free(doomed).expect("free while queued");
    gate.open();
    assert!(wait(&cu, t1).status.is_ok());
    assert_eq!(
        wait(&cu, t2).status,
        Err(KernelError::InputOutOfRange { what: "input".into(), range: doomed })
    );
}

#[test]
fn vanishing_unit_notifies_every_ticket_and_comes_back() {
    let (cu, gate) = gate_engine(CuConfig { ring_entries: 4, notification_entries: 8, ..config() });
    cu.program(1, "test.gate").expect("program gate");
    cu.program(2, "crc32").expect("program crc");
    let input = cu.region().alloc_write(b"payload").expect("stage");
    let mut tickets = vec![cu.submit_task(1, TaskDescriptor::new(input)).expect("submit")];
    gate.wait_started(1);
    for _ in 0..4 {
        tickets.push(cu.submit_task(1, TaskDescriptor::new(input)).expect("queue"));
    }
    let used = cu.region().used();

    cu.set_available(1, false).expect("vanish");
    assert!(!cu.is_available(1));
    // Every ticket is answered at once, while the kernel is still blocked.
    for t in &tickets {
        let n = cu.poll(*t).expect("notified without waiting for the kernel");
        assert_eq!(n.status, Err(KernelError::Unavailable { slot: 1 }));
        assert_eq!(n.kernel, "test.gate");
    }
    assert_eq!(cu.submit_task(1, TaskDescriptor::new(input)), Err(CuError::Unavailable(1)));
    // Other slots are unaffected.
    assert!(run(&cu, 2, TaskDescriptor::new(input)).is_ok());

    // The stuck kernel returns; its result is dropped, nothing allocated.
    gate.open();
    cu.set_available(1, true).expect("back");
    assert_eq!(cu.get_type(1).as_deref(), Some("test.gate"));
    let out = run(&cu, 1, TaskDescriptor::new(input)).expect("works again");
    assert_eq!(cu.region().read(out).expect("read"), b"payload");
    cu.region().free(out).expect("free");
    let crc_outs = cu.region().used() - used;
    assert_eq!(crc_outs, 4, "only the crc32 output was added");
    let stats = cu.stats(1).expect("stats");
    assert_eq!(stats.failed, 5);
    assert_eq!(stats.done, 1);
    assert_eq!(stats.refused, 1);
    assert_eq!(cu.outstanding(1), 0);
}

#[test]
fn vanishing_with_waiters_in_other_threads() {
    let (cu, gate) = gate_engine(config());
    let cu = Arc::new(cu);
    cu.program(0, "test.gate").expect("program");
    let input = cu.region().alloc_write(b"z").expect("stage");
    let tickets: Vec<Ticket> =
        (0..4).map(|_| cu.submit_task(0, TaskDescriptor::new(input)).expect("submit")).collect();
    gate.wait_started(1);
    let waiters: Vec<_> = tickets
        .iter()
        .map(|&t| {
            let cu = Arc::clone(&cu);
            std::thread::spawn(move || cu.wait(t, WAIT))
        })
        .collect();
    cu.set_available(0, false).expect("vanish");
    for w in waiters {
        let n = w.join().expect("waiter").expect("woken with a notification");
        assert_eq!(n.status, Err(KernelError::Unavailable { slot: 0 }));
    }
    gate.open();
}

#[derive(Debug)]
struct Xor;

impl Kernel for Xor {
    fn name(&self) -> &str {
        "user.xor"
    }

    fn params(&self) -> &[ParamSpec] {
        const P: &[ParamSpec] = &[
            ParamSpec::required("mask", ParamKind::U64),
            ParamSpec::optional("repeat", ParamKind::U64),
        ];
        P
    }

    fn run(&self, input: &[u8], params: &Params, out: &mut Output) -> Result<(), KernelError> {
        let mask = u8::try_from(params.require_u64("mask")?)
            .map_err(|_| KernelError::bad_param("mask", "above 255"))?;
        let repeat = params.u64("repeat").unwrap_or(1);
        for _ in 0..repeat {
            for &b in input {
                out.push(b ^ mask)?;
            }
        }
        Ok(())
    }
}

#[derive(Debug)]
struct Panics;

impl Kernel for Panics {
    fn name(&self) -> &str {
        "user.panics"
    }

    fn run(&self, input: &[u8], _: &Params, out: &mut Output) -> Result<(), KernelError> {
        if input.first() == Some(&0) {
            panic!("kernel bug");
        }
        out.extend_from_slice(input)
    }
}

#[test]
fn user_kernels_work_and_are_bounded() {
    let cu = engine();
    cu.register(Arc::new(Xor)).expect("register xor");
    cu.register(Arc::new(Panics)).expect("register panics");
    assert_eq!(cu.register(Arc::new(Xor)), Err(CuError::DuplicateKernel("user.xor".into())));
    cu.program(3, "user.xor").expect("program");
    let input = cu.region().alloc_write(&[1, 2, 3]).expect("stage");
    let out = run(&cu, 3, TaskDescriptor::new(input).param_u64("mask", 0xFF)).expect("xor");
    assert_eq!(cu.region().read(out).expect("read"), [0xFE, 0xFD, 0xFC]);
    assert!(matches!(
        run(&cu, 3, TaskDescriptor::new(input).param_u64("mask", 300)),
        Err(KernelError::BadParam { .. })
    ));
    // Output limits apply to user kernels too: 3 * 2^40 bytes would never end.
    assert_eq!(
        run(&cu, 3, TaskDescriptor::new(input).param_u64("mask", 1).param_u64("repeat", 1 << 40)),
        Err(KernelError::OutputTooLarge { limit: 1 << 20 })
    );
    assert_eq!(
        run(
            &cu,
            3,
            TaskDescriptor::new(input).param_u64("mask", 1).param_u64("repeat", 10).max_output(29)
        ),
        Err(KernelError::OutputTooLarge { limit: 29 })
    );

    // A panicking kernel fails its task; the unit survives.
    cu.program(3, "user.panics").expect("program");
    let zero = cu.region().alloc_write(&[0, 1]).expect("stage");
    assert!(matches!(
        run(&cu, 3, TaskDescriptor::new(zero)),
        Err(KernelError::Panicked(m)) if m.contains("kernel bug")
    ));
    let out = run(&cu, 3, TaskDescriptor::new(input)).expect("survived");
    assert_eq!(cu.region().read(out).expect("read"), [1, 2, 3]);

    // Direct use outside the engine, e.g. to unit-test a kernel.
    let mut p = Params::new();
    p.set_u64("mask", 0x0F);
    let mut o = Output::with_limit(2);
    assert_eq!(
        Xor.run(&[0xF0, 0xF0, 0xF0], &p, &mut o),
        Err(KernelError::OutputTooLarge { limit: 2 })
    );
    assert_eq!(o.as_slice(), [0xFF, 0xFF]);
}

#[test]
fn stats_count_per_slot() {
    let cu = engine();
    cu.program(0, "crc32").expect("program");
    cu.program(1, "deflate.decompress").expect("program");
    let a = cu.region().alloc_write(&[1; 100]).expect("stage");
    let b = cu.region().alloc_write(&[2; 50]).expect("stage");
    for r in [a, b, a] {
        run(&cu, 0, TaskDescriptor::new(r)).expect("crc");
    }
    assert!(run(&cu, 1, TaskDescriptor::new(b)).is_err());
    let s0 = cu.stats(0).expect("slot 0");
    assert_eq!(s0.submitted, 3);
    assert_eq!(s0.done, 3);
    assert_eq!(s0.failed, 0);
    assert_eq!(s0.bytes_in, 250);
    assert_eq!(s0.bytes_out, 12);
    let s1 = cu.stats(1).expect("slot 1");
    assert_eq!((s1.done, s1.failed, s1.bytes_in, s1.bytes_out), (0, 1, 50, 0));
    assert_eq!(cu.stats(2).expect("slot 2"), Default::default());
    assert!(cu.stats(4).is_none());
}

#[test]
fn device_region_allocator() {
    let cu = ComputeUnits::new(CuConfig { region_capacity: 100, ..config() }).expect("engine");
    let r = cu.region();
    let a = r.alloc(40).expect("a");
    let b = r.alloc(40).expect("b");
    assert_eq!(r.alloc(30), Err(RegionError::OutOfSpace { needed: 30, free: 20 }));
    assert_eq!(r.alloc(0), Ok(DeviceRef::EMPTY));
    r.write(DeviceRef::new(a.offset + 10, 3), b"xyz").expect("sub-range write");
    assert_eq!(r.read(DeviceRef::new(a.offset + 10, 3)).expect("read"), b"xyz");
    assert!(r.write(DeviceRef::new(a.offset, 2), b"xyz").is_err());
    assert!(r.read(DeviceRef::new(a.offset + 30, 20)).is_err(), "straddles a and b");
    assert_eq!(
        r.free(DeviceRef::new(a.offset, 10)),
        Err(RegionError::NotAllocated(DeviceRef::new(a.offset, 10)))
    );
    r.free(a).expect("free a");
    assert!(r.free(a).is_err(), "double free refused");
    assert!(r.read(a).is_err(), "freed range unreadable");
    r.free(b).expect("free b");
    // Coalesced: the whole region is one free range again.
    let all = r.alloc(100).expect("whole region");
    assert_eq!(all, DeviceRef::new(0, 100));
    assert_eq!(r.read(all).expect("zeroed"), vec![0; 100]);

    // A region too full for a kernel's output: error notification.
    cu.program(0, "crc32").expect("program");
    let n = wait(&cu, cu.submit_task(0, TaskDescriptor::new(all)).expect("submit"));
    assert_eq!(n.status, Err(KernelError::RegionFull { needed: 4 }));
}

#[test]
fn keys_and_config_are_checked() {
    let cu = engine();
    assert!(matches!(cu.set_key(1, &[0; 16]), Err(CuError::Key(_))));
    cu.set_key(1, &[0; 32]).expect("32-byte key");
    assert!(cu.remove_key(1));
    assert!(!cu.remove_key(1));
    assert!(!format!("{cu:?}").is_empty());
    assert!(matches!(
        ComputeUnits::new(CuConfig { slots: 0, ..config() }),
        Err(CuError::Config(_))
    ));
    assert!(matches!(
        ComputeUnits::new(CuConfig { ring_entries: 0, ..config() }),
        Err(CuError::Config(_))
    ));
}
