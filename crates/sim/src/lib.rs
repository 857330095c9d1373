//! The offload simulator (`protoplane sim`): replays messages through the
//! engine's decode and encode with transaction counting on, measures the
//! CPU side on this machine, and turns the counted transactions into time
//! with a calibrated interconnect model.
//!
//! - [`dataset`]: what to replay — HyperProtoBench, recorded
//!   length-delimited traffic with its descriptor set, or a built-in
//!   workload.
//! - [`replay`]: the measurements — field-by-field vs one-shot decode
//!   (counts and CPU time), laying out and encoding responses, the
//!   nested-message experiment.
//! - [`model`]: the interconnects (PCIe, CXL/UPI from the literature;
//!   on-chip measured here) and the cost of a set of transactions.
//! - [`Error`]: what went wrong loading a dataset or replaying a message.
//!
//! Which figures are measured and which modelled: transaction counts and
//! CPU times are measured (the real decoder's stores, the real copies);
//! the time those transactions take on PCIe or CXL is modelled.

pub mod dataset;
mod error;
pub mod model;
pub mod replay;

pub use error::{Error, FramingError, Result};
