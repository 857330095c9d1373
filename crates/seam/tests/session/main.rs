//! The split seam's session rules, one file per topic, each test an
//! engine session and an application session in memory ([`util::Pair`]):
//! no region, no ring, no process, no runtime, no clock.

mod budgets;
mod calls;
mod cancel;
mod chunks;
mod end;
mod idle;
mod outbound;
mod util;
