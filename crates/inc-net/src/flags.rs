//! The fault flags of the in-network computation processes: the switch
//! (`protoplane switch`) and the agents of an application run (`protoplane
//! inc run`) take the same ones, and a runner passes them on to the
//! processes it starts ([`FaultArgs::to_flags`]).

use std::io::BufRead as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use protoplane_inc::faults::Faults;

/// A flag value out of its range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlagError(pub String);

impl std::fmt::Display for FlagError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FlagError {}

/// Fault flags shared by the switch and `inc run`.
#[derive(clap::Args, Debug, Clone)]
pub struct FaultArgs {
    /// Probability that a datagram is lost (per egress port).
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Probability that a datagram is duplicated.
    #[arg(long, default_value_t = 0.0)]
    pub dup: f64,
    /// Probability that a datagram is held back so later ones overtake it.
    #[arg(long, default_value_t = 0.0)]
    pub reorder: f64,
    /// Delay added to every datagram, microseconds.
    #[arg(long, default_value_t = 0)]
    pub delay_us: u64,
    /// Extra delay of a reordered datagram or a duplicate, up to this many
    /// microseconds.
    #[arg(long, default_value_t = 500)]
    pub jitter_us: u64,
    /// Seed of the fault injectors.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

impl FaultArgs {
    /// The faults these flags describe.
    pub fn faults(&self) -> Faults {
        Faults {
            loss: self.loss,
            dup: self.dup,
            reorder: self.reorder,
            delay_us: self.delay_us,
            jitter_us: self.jitter_us,
        }
    }

    /// Every probability in [0, 1).
    pub fn check(&self) -> Result<(), FlagError> {
        for (name, p) in [("--loss", self.loss), ("--dup", self.dup), ("--reorder", self.reorder)] {
            if !(0.0..1.0).contains(&p) {
                return Err(FlagError(format!("{name} {p}: a probability in [0, 1)")));
            }
        }
        Ok(())
    }

    /// The same flags for another process's command line.
    pub fn to_flags(&self) -> Vec<String> {
        vec![
            format!("--loss={}", self.loss),
            format!("--dup={}", self.dup),
            format!("--reorder={}", self.reorder),
            format!("--delay-us={}", self.delay_us),
            format!("--jitter-us={}", self.jitter_us),
            format!("--seed={}", self.seed),
        ]
    }
}

/// `--port-fault NODE:loss=P,dup=P,reorder=P,delay-us=N,jitter-us=N`: the
/// faults of one destination node, `base` where the spec is silent.
pub fn port_fault(spec: &str, base: Faults) -> Result<(u16, Faults), FlagError> {
    parse_port_fault(spec, base).map_err(FlagError)
}

fn parse_port_fault(spec: &str, base: Faults) -> Result<(u16, Faults), String> {
    let (node, rest) =
        spec.split_once(':').ok_or_else(|| format!("--port-fault {spec}: NODE:SPEC"))?;
    let node: u16 = node.parse().map_err(|_| format!("--port-fault {spec}: bad node"))?;
    let mut f = base;
    for kv in rest.split(',').filter(|s| !s.is_empty()) {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("--port-fault {spec}: {kv} is not KEY=VALUE"))?;
        let bad = || format!("--port-fault {spec}: bad value for {k}");
        match k {
            "loss" => f.loss = v.parse().map_err(|_| bad())?,
            "dup" => f.dup = v.parse().map_err(|_| bad())?,
            "reorder" => f.reorder = v.parse().map_err(|_| bad())?,
            "delay-us" => f.delay_us = v.parse().map_err(|_| bad())?,
            "jitter-us" => f.jitter_us = v.parse().map_err(|_| bad())?,
            _ => return Err(format!("--port-fault {spec}: unknown {k}")),
        }
    }
    Ok((node, f))
}

/// A flag that becomes true when standard input reaches its end (when
/// `enabled`): a process started by a runner stops when the runner closes
/// its stdin, so none outlives a run that failed.
pub fn stop_on_eof(enabled: bool) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    if enabled {
        let s = stop.clone();
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = std::io::stdin().lock().read_until(0, &mut sink);
            s.store(true, Ordering::Relaxed);
        });
    }
    stop
}
