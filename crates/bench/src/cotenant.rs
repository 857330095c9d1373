//! `protoplane-bench bench-cotenant`: the noisy neighbour of `bench split`'s
//! neighbour experiment. A CPU-bound process pinned to the application's
//! core that spins `--load` of every 10 ms period and sleeps the rest, the
//! way a batch job sharing a machine with a service does. It exits when
//! its standard input closes, so it never outlives the benchmark that
//! started it.

use std::io::Read as _;
use std::time::{Duration, Instant};

/// The scheduling period the load is a share of.
const PERIOD: Duration = Duration::from_millis(10);

/// `protoplane-bench bench-cotenant`.
#[derive(clap::Args, Debug)]
pub(crate) struct CotenantArgs {
    /// Share of each 10 ms period spent spinning, 0 to 1.
    #[arg(long)]
    load: f64,
}

/// Spins and sleeps until standard input closes.
pub(crate) fn run(a: &CotenantArgs) -> Result<(), String> {
    if !(0.0..=1.0).contains(&a.load) {
        return Err(format!("--load {}: a share of the core, 0 to 1", a.load));
    }
    std::thread::spawn(|| {
        let mut sink = [0u8; 64];
        while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
        std::process::exit(0);
    });
    let busy = PERIOD.mul_f64(a.load);
    let mut x = 0u64;
    loop {
        let start = Instant::now();
        while start.elapsed() < busy {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let rest = PERIOD.saturating_sub(start.elapsed());
        if !rest.is_zero() {
            std::thread::sleep(rest);
        }
    }
}
