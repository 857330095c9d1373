//! The shape of a data plane: how many stages, register groups and
//! registers it has, and the limits that follow from them.

use std::fmt;

/// The resources of one switch.
///
/// The defaults describe one pipe of a Tofino-class switch as NetRPC and
/// ATP use it: 12 stages, 32 register groups of 16 Ki 32-bit cells (a tag
/// and a value per cell), four groups per stage, 32 pairs per packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwitchConfig {
    /// This switch's node id (the source of what it sends itself).
    pub node: u16,
    /// Position in a chain of switches (the `switch` byte of an address).
    pub chain_index: u8,
    /// The next switch of the chain; `None` for the last (or only) one.
    pub next_hop: Option<u16>,
    /// Pipeline stages.
    pub stages: u8,
    /// Register groups, which is also the pairs a packet may carry on this
    /// switch (one group per pair per pass).
    pub groups: u8,
    /// Register groups one stage holds.
    pub groups_per_stage: u8,
    /// Cells per register array (at most 65,536: addresses have 16 bits).
    pub registers: u32,
    /// Flows the per-flow bit arrays hold.
    pub flows: u16,
    /// Sequence numbers per flow bit array (a power of two). A client
    /// keeps fewer than `window / 2` packets in flight.
    pub window: u32,
    /// Queue depth (datagrams waiting) above which packets are ECN-marked.
    pub ecn_threshold: u32,
}

impl Default for SwitchConfig {
    fn default() -> Self {
        SwitchConfig {
            node: 0,
            chain_index: 0,
            next_hop: None,
            stages: 12,
            groups: 32,
            groups_per_stage: 4,
            registers: 16 * 1024,
            flows: 1024,
            window: 256,
            ecn_threshold: 64,
        }
    }
}

/// A configuration no pipeline can have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

impl SwitchConfig {
    /// Stages the layout needs: the app table and flow bits, the slot
    /// metadata, the register groups, the applied masks and overflow flags.
    pub fn stages_needed(&self) -> u32 {
        let gps = u32::from(self.groups_per_stage.max(1));
        3 + u32::from(self.groups).div_ceil(gps)
    }

    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |m: String| Err(ConfigError(m));
        if self.groups == 0 || self.groups > 64 {
            return err(format!("{} register groups (1 to 64)", self.groups));
        }
        if self.chain_index == u8::MAX {
            return err("chain index 255 is reserved (it marks an address with no cell)".into());
        }
        if self.groups_per_stage == 0 {
            return err("0 register groups per stage".into());
        }
        if u32::from(self.stages) < self.stages_needed() {
            return err(format!(
                "{} groups at {} per stage need {} stages, the pipeline has {}",
                self.groups,
                self.groups_per_stage,
                self.stages_needed(),
                self.stages
            ));
        }
        if self.registers == 0 || self.registers > 65_536 {
            return err(format!("{} registers per array (1 to 65536)", self.registers));
        }
        if !self.window.is_power_of_two() || self.window < 2 || self.window > 65_536 {
            return err(format!("flow window {} (a power of two, 2 to 65536)", self.window));
        }
        if self.flows == 0 {
            return err("0 flows".into());
        }
        Ok(())
    }
}
