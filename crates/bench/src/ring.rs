//! `protoplane-bench bench-ring`: the shepherding ring's one-way handoff, the
//! floor under every split call (one descriptor each way per unary call).
//!
//! Two threads pinned to two cores share a memfd that is mapped twice, at
//! two addresses, as the engine and the application map it. They use the
//! rings exactly as the engine and the application do (`Producer::push`,
//! `Consumer::pop`, 7-word descriptors); both spin, which is what an engine
//! and an application under load do (parking costs an eventfd wake-up, a
//! few µs, and happens only when idle).
//!
//! * latency: ping-pong; one-way = round trip / 2, per round trip, so the
//!   median and p99 include one clock read (~20 ns on this kind of machine)
//!   split over the two directions;
//! * throughput: one side pushes as fast as the ring takes descriptors, the
//!   other pops; descriptors per second over the whole run.
//!
//! Prints one CSV line: `p50_ns,p99_ns,descriptors_per_s,mean_ns`, the
//! last one-way from the whole ping-pong run's time (no clock read per
//! round trip).

use std::sync::Arc;
use std::time::Instant;

use protoplane_shm::desc::{self, Descriptor, Span};
use protoplane_shm::ring::{Consumer, Producer, PushError, Ring};
use protoplane_shm::sys::{memfd, pin_current_thread, Mapping};

/// Slots per ring (the engine's default is larger; a handoff touches one).
const SLOTS: u32 = 256;

#[derive(clap::Args, Debug)]
pub(crate) struct RingArgs {
    /// Core of the side that starts each round trip (the engine's).
    #[arg(long, default_value_t = 0)]
    engine_cpu: usize,
    /// Core of the side that answers (the application's).
    #[arg(long, default_value_t = 1)]
    app_cpu: usize,
    /// Round trips measured (after as many again to warm up).
    #[arg(long, default_value_t = 200_000)]
    round_trips: usize,
    /// Descriptors pushed in the throughput run.
    #[arg(long, default_value_t = 5_000_000)]
    descriptors: u64,
}

fn descriptor(call: u64) -> Descriptor {
    Descriptor {
        call,
        method: 3,
        flags: desc::MESSAGE | desc::END,
        block: Span { offset: 1 << 20, len: 845 },
        chunk: 1 << 20,
        ..Descriptor::default()
    }
}

fn push(p: &Producer, d: &Descriptor) -> Result<(), String> {
    loop {
        match p.push(d) {
            Ok(()) => return Ok(()),
            Err(PushError::Full) => std::hint::spin_loop(),
            Err(e) => return Err(e.to_string()),
        }
    }
}

fn pop(c: &mut Consumer) -> Descriptor {
    loop {
        if let Some(d) = c.pop() {
            return d;
        }
        std::hint::spin_loop();
    }
}

/// `protoplane-bench bench-ring`.
pub(crate) fn run(args: &RingArgs) -> Result<String, String> {
    let ring_bytes = SLOTS as usize * 64;
    let fd = memfd("protoplane-bench-ring", 3 * ring_bytes).map_err(|e| e.to_string())?;
    // Two mappings of one file: the two processes of a split deployment.
    let engine_map = Arc::new(Mapping::map(&fd).map_err(|e| e.to_string())?);
    let app_map = Arc::new(Mapping::map(&fd).map_err(|e| e.to_string())?);
    let ring = |map: &Arc<Mapping>, i: usize| {
        Ring::new(map.clone(), i * ring_bytes, SLOTS).ok_or("ring does not fit")
    };
    for i in 0..3 {
        ring(&engine_map, i)?.init();
    }
    let requests = Producer::new(ring(&engine_map, 0)?);
    let mut responses = Consumer::new(ring(&engine_map, 1)?);
    let bulk = Producer::new(ring(&engine_map, 2)?);
    let mut app_requests = Consumer::new(ring(&app_map, 0)?);
    let app_responses = Producer::new(ring(&app_map, 1)?);
    let mut app_bulk = Consumer::new(ring(&app_map, 2)?);

    let warm = args.round_trips.max(1000);
    let trips = args.round_trips.max(1000);
    let total = args.descriptors.max(1000);
    let app_cpu = args.app_cpu;
    std::thread::scope(|s| -> Result<String, String> {
        let app = s.spawn(move || -> Result<(), String> {
            pin_current_thread(&[app_cpu]).map_err(|e| e.to_string())?;
            for _ in 0..warm + trips {
                let mut d = pop(&mut app_requests);
                d.flags = desc::MESSAGE | desc::STATUS | desc::END;
                push(&app_responses, &d)?;
            }
            for i in 0..total {
                if pop(&mut app_bulk).call != i {
                    return Err("descriptors out of order".into());
                }
            }
            Ok(())
        });
        pin_current_thread(&[args.engine_cpu]).map_err(|e| e.to_string())?;
        let mut one_way = Vec::with_capacity(trips);
        let mut run = Instant::now();
        for i in 0..(warm + trips) as u64 {
            let t = Instant::now();
            push(&requests, &descriptor(i))?;
            let d = pop(&mut responses);
            let ns = t.elapsed().as_nanos() as f64 / 2.0;
            if d.call != i {
                return Err("a response for the wrong call".into());
            }
            if i >= warm as u64 {
                one_way.push(ns);
            } else if i + 1 == warm as u64 {
                run = Instant::now();
            }
        }
        let mean = run.elapsed().as_nanos() as f64 / trips as f64 / 2.0;
        let t = Instant::now();
        for i in 0..total {
            push(&bulk, &descriptor(i))?;
        }
        app.join().map_err(|_| "the application thread panicked")??;
        let rate = total as f64 / t.elapsed().as_secs_f64();
        one_way.sort_by(f64::total_cmp);
        let q = |p: f64| one_way[((one_way.len() - 1) as f64 * p) as usize];
        Ok(format!("{:.1},{:.1},{:.0},{mean:.1}\n", q(0.5), q(0.99), rate))
    })
}
