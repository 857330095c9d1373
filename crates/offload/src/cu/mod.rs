//! Compute units: RPCAcc's programmable units on a PCIe-attached
//! accelerator, run by the engine's own threads, behind the interface a
//! real device would offer.
//!
//! # What is modelled
//!
//! RPCAcc puts a fixed number of *compute-unit slots* on the accelerator.
//! The application programs a slot with a kernel, feeds it through a
//! *descriptor ring* in accelerator memory, and learns of completions on a
//! *notification ring* in host memory; the bytes a kernel works on stay on
//! the device, so a chain such as decrypt → compress → encrypt never
//! crosses PCIe. Here:
//!
//! - **Slots** ([`ComputeUnits`]): a fixed number, set by
//!   [`CuConfig::slots`]. [`ComputeUnits::program`] loads a registered
//!   kernel into a slot by name (reprogramming is allowed; tasks already
//!   queued keep the kernel they were submitted to),
//!   [`ComputeUnits::get_type`] tells which kernel a slot holds, and
//!   [`ComputeUnits::set_available`] makes a unit vanish and come back.
//! - **Device region** ([`DeviceRegion`]): engine-owned memory the
//!   application never maps, named by [`DeviceRef`] (`offset`, `len`).
//!   Kernels read their input from it and the unit writes each output to a
//!   fresh allocation in it. A first-fit free-list allocator with a fixed
//!   capacity; a full region is an error, never a panic or growth. The
//!   host's `alloc_write` / `read` model DMA to and from the device.
//! - **Descriptor ring** (engine memory, per slot): a bounded queue of
//!   [`TaskDescriptor`]s, [`CuConfig::ring_entries`] long.
//!   [`ComputeUnits::submit_task`] refuses with [`CuError::RingFull`] when
//!   it is full — back-pressure, never unbounded growth.
//! - **Notification ring** (host memory, per slot): bounded to
//!   [`CuConfig::notification_entries`]. Submit reserves the task's entry
//!   (credit-based flow control: queued + running + unpolled ≤ capacity,
//!   else [`CuError::NotificationRingFull`]), so a unit never has to drop
//!   or stall on a completion and no ticket's [`Notification`] is ever
//!   lost. [`ComputeUnits::poll`] takes a ticket's notification without
//!   blocking; [`ComputeUnits::wait`] parks on a condition variable until
//!   it arrives or a timeout passes.
//! - **Key table** ([`KeyTable`]): AEAD keys live in the engine, set with
//!   [`ComputeUnits::set_key`]; descriptors name them by id.
//!
//! # Workers
//!
//! One worker thread per slot, parked on the slot's condition variable
//! while its ring is empty (an idle engine burns no core). A slot is a
//! unit with its own pipeline in RPCAcc, and a thread per slot keeps that
//! independence: a slow kernel delays only its own slot, and a unit that
//! vanishes mid-kernel affects nobody else. Slots are few (at most 256),
//! so the threads are cheap; a shared pool would have to re-create the
//! per-slot ordering and fairness that the rings give for free.
//!
//! # Untrusted descriptors
//!
//! Descriptors come from the application. At submit, the engine checks
//! that the input is non-empty and lies inside one live allocation (an
//! out-of-region, overflowing or allocation-straddling range is refused),
//! that every parameter is one the kernel declares ([`Kernel::params`]),
//! of the declared kind, not given twice, bounded in size, that required
//! ones are present, and that the output limit is within the engine's.
//! Anything wrong is a [`CuError::Invalid`] and nothing is queued. When the
//! unit runs the task it fetches the ranges again (the application may
//! have freed them) and copies the bytes out, so a kernel never sees
//! memory outside its ranges. Values the engine cannot judge (a nonce's
//! length, a compression level, an unknown key id) fail the task with an
//! error [`Notification`]. Every output goes through an [`Output`] bounded
//! by the task's limit ([`CuConfig::max_output`] or less), for built-in
//! and user kernels alike: a decompression bomb ends in
//! [`KernelError::OutputTooLarge`]. A kernel that panics fails its task
//! with [`KernelError::Panicked`] and the unit keeps working. Outputs are
//! always fresh allocations, so they never overlap inputs.
//!
//! # A unit that vanishes
//!
//! `set_available(slot, false)` notifies every queued task and the running
//! one with [`KernelError::Unavailable`] at once — nobody waits on a kernel
//! that may never return — and discards the running kernel's result when
//! it returns. Submits fail with [`CuError::Unavailable`] until the slot is
//! made available again; it keeps its kernel.
//!
//! # Built-in kernels
//!
//! | name | input → output | parameters |
//! |---|---|---|
//! | `deflate.compress` | bytes → raw deflate (RFC 1951, no zlib/gzip framing) | `level` 0..=9 (default 6) |
//! | `deflate.decompress` | raw deflate → bytes (must end exactly at the input's end) | — |
//! | `aes256gcm.seal`, `chacha20poly1305.seal` | plaintext → ciphertext ‖ 16-byte tag | `key_id`, `nonce` (12 bytes), `aad` (optional) |
//! | `aes256gcm.open`, `chacha20poly1305.open` | ciphertext ‖ tag → plaintext, or [`KernelError::AuthFailed`] | same |
//! | `crc32` | bytes → CRC-32/ISO-HDLC, 4 bytes little-endian | — |
//!
//! Users add kernels with [`ComputeUnits::register`]. Nonce uniqueness per
//! key is the application's duty, as with any AEAD.
//!
//! # Ownership
//!
//! The application owns the ranges it stages and every output range a
//! notification hands it, and frees them with [`DeviceRegion::free`];
//! failed tasks allocate nothing.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use protoplane_offload::cu::{ComputeUnits, CuConfig, TaskDescriptor};
//!
//! let cu = ComputeUnits::new(CuConfig::default()).expect("engine");
//! cu.program(0, "crc32").expect("program");
//! let input = cu.region().alloc_write(b"123456789").expect("stage");
//! let t = cu.submit_task(0, TaskDescriptor::new(input)).expect("submit");
//! let n = cu.wait(t, Duration::from_secs(5)).expect("notified");
//! let out = n.status.expect("crc32 ran");
//! assert_eq!(cu.region().read(out).expect("fetch"), 0xCBF4_3926u32.to_le_bytes());
//! ```

mod builtin;
pub mod control;
mod engine;
mod kernel;
mod region;

pub use builtin::{KeyError, KeyTable, KEY_LEN, NONCE_LEN, TAG_LEN};
pub use engine::{
    ComputeUnits, CuConfig, CuError, DescriptorError, Notification, SlotStats, TaskDescriptor,
    Ticket,
};
pub use kernel::{Kernel, KernelError, Output, ParamKind, ParamSpec, ParamValue, Params};
pub use region::{DeviceRef, DeviceRegion, RegionError};
