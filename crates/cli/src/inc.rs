//! `protoplane switch` and `protoplane controller`: the in-network
//! computation processes (see `protoplane-inc-net`). The runner of the
//! example applications (`protoplane inc …`) is the examples' own binary,
//! `protoplane-inc` (see `main.rs`).

use std::io::Write;
use std::net::{IpAddr, SocketAddr};

use protoplane_inc::controller::ControllerTuning;
use protoplane_inc::switch::SwitchConfig;
use protoplane_inc_net::flags::{port_fault, stop_on_eof, FaultArgs};
use protoplane_inc_net::{controller, switch};

/// `protoplane switch`.
#[derive(clap::Args, Debug)]
pub(crate) struct SwitchArgs {
    /// Address to bind (every node is on it).
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// UDP port of the data plane (its node id); 0 picks one.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// TCP port of the control plane; 0 picks one.
    #[arg(long, default_value_t = 0)]
    control_port: u16,
    /// Pipeline stages.
    #[arg(long, default_value_t = 12)]
    stages: u8,
    /// Register groups (= key/value pairs per packet on this switch).
    #[arg(long, default_value_t = 32)]
    groups: u8,
    /// Register groups per stage.
    #[arg(long, default_value_t = 4)]
    groups_per_stage: u8,
    /// Cells per register array.
    #[arg(long, default_value_t = 16384)]
    registers: u32,
    /// Flows the per-flow bit arrays hold.
    #[arg(long, default_value_t = 1024)]
    flows: u16,
    /// Sequence numbers per flow bit array (a power of two).
    #[arg(long, default_value_t = 256)]
    window: u32,
    /// Queue depth above which packets are ECN-marked.
    #[arg(long, default_value_t = 64)]
    ecn_threshold: u32,
    /// Position in a chain of switches.
    #[arg(long, default_value_t = 0)]
    chain_index: u8,
    /// Node (UDP port) of the next switch of the chain.
    #[arg(long)]
    next_hop: Option<u16>,
    #[command(flatten)]
    faults: FaultArgs,
    /// Faults for one destination node: NODE:loss=P,dup=P,reorder=P,delay-us=N,jitter-us=N.
    #[arg(long = "port-fault", value_name = "NODE:SPEC")]
    port_faults: Vec<String>,
    /// Exit (printing counters) when standard input closes.
    #[arg(long, hide = true)]
    stop_on_eof: bool,
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

pub(crate) fn run_switch(a: &SwitchArgs) -> Result<(), String> {
    a.faults.check().map_err(|e| e.to_string())?;
    let base = a.faults.faults();
    let port_faults = a
        .port_faults
        .iter()
        .map(|s| port_fault(s, base))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let config = SwitchConfig {
        node: 0,
        chain_index: a.chain_index,
        next_hop: a.next_hop,
        stages: a.stages,
        groups: a.groups,
        groups_per_stage: a.groups_per_stage,
        registers: a.registers,
        flows: a.flows,
        window: a.window,
        ecn_threshold: a.ecn_threshold,
    };
    config.validate().map_err(|e| e.to_string())?;
    let opts = switch::SwitchOptions {
        host: a.host,
        port: a.port,
        control_port: a.control_port,
        config,
        faults: base,
        port_faults,
        seed: a.faults.seed,
    };
    let (bound, runner) = switch::bind(opts).map_err(|e| format!("switch: {e}"))?;
    say(&format!("switch node={} control={}", bound.node, bound.control));
    let stats = runner.run(stop_on_eof(a.stop_on_eof)).map_err(|e| format!("switch: {e}"))?;
    say(&format!("switch stats {stats:?}"));
    let cpu = protoplane_load::host::process_cpu_precise().unwrap_or(f64::NAN);
    say(&format!("switch cpu_s={cpu:.6} packets={}", stats.packets));
    Ok(())
}

/// `protoplane controller`.
#[derive(clap::Args, Debug)]
pub(crate) struct ControllerArgs {
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// TCP port for agents; 0 picks one.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Control-plane address of a switch (repeat for a chain, in order);
    /// none: no data plane, the agents do everything.
    #[arg(long = "switch", value_name = "ADDR")]
    switches: Vec<SocketAddr>,
    /// Poll the data plane's last-seen times every so many milliseconds.
    #[arg(long, default_value_t = 100)]
    poll_ms: u64,
    /// Probe an application idle this long (first timeout), milliseconds.
    #[arg(long, default_value_t = 2000)]
    idle_ms: u64,
    /// Reclaim an application silent this long after the probe (second
    /// timeout), milliseconds.
    #[arg(long, default_value_t = 2000)]
    dead_ms: u64,
    /// Exit when standard input closes.
    #[arg(long, hide = true)]
    stop_on_eof: bool,
}

pub(crate) fn run_controller(a: &ControllerArgs) -> Result<(), String> {
    let tuning = ControllerTuning {
        poll_us: a.poll_ms * 1000,
        idle_us: a.idle_ms * 1000,
        dead_us: a.dead_ms * 1000,
    };
    let opts = controller::ControllerOptions {
        host: a.host,
        port: a.port,
        switches: a.switches.clone(),
        tuning,
    };
    let (addr, runner) = controller::bind(opts).map_err(|e| format!("controller: {e}"))?;
    say(&format!("controller listening {addr}"));
    runner
        .run(stop_on_eof(a.stop_on_eof), |l| say(&format!("controller: {l}")))
        .map_err(|e| format!("controller: {e}"))
}
