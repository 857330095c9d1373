//! The offload engine: what RPCAcc puts on a PCIe-attached accelerator and
//! PsPIN on a SmartNIC, run by the engine's own cores, with the interfaces
//! shaped so a real device can take their place.
//!
//! - [`commit`]: how a decoded request reaches the application's memory —
//!   field by field (one interconnect transaction per store) or through a
//!   temp buffer committed in one copy (RPCAcc's one-shot commit).
//! - [`cu`]: compute units — slots the application programs with a kernel
//!   by name and feeds through a descriptor ring, answered on a
//!   notification ring (RPCAcc's `program / get_type / submit_task /
//!   poll`).
//! - [`perfield`]: per-field decode throughput on engine workers against
//!   one application core (PsPIN).
//! - [`Error`]: what went wrong in the per-field study.
//!
//! The *device region* is memory the application never maps: device-placed
//! fields are decoded into it, and compute units read and write it.

pub mod commit;
pub mod cu;
mod error;
pub mod perfield;

pub use error::{Error, Mismatch, Result};
