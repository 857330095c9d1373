//! Compute units against a hostile application: task descriptors built
//! from arbitrary bytes (kernel choice, input ranges inside and outside the
//! region, parameters of every kind, output limits), submitted to units
//! running the built-in kernels. Nothing may panic or hang: every accepted
//! task gets exactly one notification, the region's use stays within its
//! capacity, and after the outputs are freed only the input stays
//! allocated.

#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use protoplane_offload::cu::{ComputeUnits, CuConfig, DeviceRef, TaskDescriptor};

const KERNELS: [&str; 7] = [
    "deflate.compress",
    "deflate.decompress",
    "aes256gcm.seal",
    "aes256gcm.open",
    "chacha20poly1305.seal",
    "chacha20poly1305.open",
    "crc32",
];
const NAMES: [&str; 6] = ["key_id", "nonce", "aad", "level", "bogus", ""];

fn units() -> &'static ComputeUnits {
    static CU: OnceLock<ComputeUnits> = OnceLock::new();
    CU.get_or_init(|| {
        let cfg = CuConfig {
            slots: KERNELS.len(),
            region_capacity: 1 << 20,
            max_output: 256 << 10,
            ..CuConfig::default()
        };
        let cu = ComputeUnits::new(cfg).expect("compute units");
        for (slot, k) in KERNELS.iter().enumerate() {
            cu.program(slot, k).expect("program");
        }
        cu.set_key(1, &[7u8; 32]).expect("key");
        cu
    })
}

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else { return 0 };
        self.0 = rest;
        b
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn take(&mut self, n: usize) -> Vec<u8> {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a.to_vec()
    }
}

fuzz_target!(|data: &[u8]| {
    let cu = units();
    let mut b = Bytes(data);
    let slot = usize::from(b.u8()) % KERNELS.len();
    let len = usize::from(b.u8()) * 4;
    let payload = b.take(len);
    let Ok(input) = cu.region().alloc_write(if payload.is_empty() { &[0] } else { &payload })
    else {
        return;
    };
    let before = cu.region().used();
    let mut tickets = Vec::new();
    for _ in 0..(b.u8() % 4 + 1) {
        // The input: the real one, or a range made up by the application.
        let r = if b.u8() % 3 == 0 { DeviceRef::new(b.u32(), b.u32()) } else { input };
        let mut d = TaskDescriptor::new(r);
        for _ in 0..(b.u8() % 5) {
            let name = NAMES[usize::from(b.u8()) % NAMES.len()];
            d = match b.u8() % 3 {
                0 => d.param_u64(name, u64::from(b.u32())),
                1 => {
                    let n = usize::from(b.u8() % 40);
                    let v = b.take(n);
                    d.param_bytes(name, &v)
                }
                _ => d.param_ref(name, DeviceRef::new(b.u32() % (2 << 20), b.u32() % 64)),
            };
        }
        if b.u8() % 2 == 0 {
            d = d.max_output(b.u32());
        }
        if let Ok(t) = cu.submit_task(slot, d) {
            tickets.push(t);
        }
    }
    for t in tickets {
        let n = cu.wait(t, Duration::from_secs(10)).expect("every accepted task is notified");
        if let Ok(out) = n.status {
            cu.region().free(out).expect("an output is a live allocation");
        }
    }
    assert!(cu.region().used() <= cu.region().capacity());
    assert_eq!(cu.region().used(), before, "outputs freed, only the input is left");
    cu.region().free(input).expect("the input is still allocated");
});
