//! Keepalive and connection lifecycle: gRFC A8 (client keepalive and the
//! server's enforcement of it) and A9 (a server's maximum connection idle
//! time and age), with grpc-go's defaults and rules.
//!
//! A client with [`ClientKeepalive`] pings the server after `time` without
//! reading anything from it, and gives the connection up (its calls end
//! UNAVAILABLE, the channel dials again) when nothing at all arrives
//! within `timeout` of the ping: a peer or a path that died without a
//! FIN or RST is noticed in `time + timeout`, not by TCP's retransmission
//! timeout minutes later. Without calls open it pings only with
//! `permit_without_stream`. A server that ends the connection with GOAWAY
//! ENHANCE_YOUR_CALM (too many pings) makes the channel double its
//! keepalive time for the connections after it, as grpc-go's does.
//!
//! A server ([`ServerKeepalive`], in `ServerOptions::keepalive`) does the
//! same towards its clients (every `time`, 2 h by default) and enforces
//! how often a client may ping: a ping that comes less than `min_time`
//! after the previous one (or, with no call open and without
//! `permit_without_stream`, less than 2 h after it) is a strike, unless
//! the server sent headers or data since; the third strike closes the
//! connection with GOAWAY `ENHANCE_YOUR_CALM` and debug data
//! `too_many_pings`, which grpc-go's and gRPC C++'s clients read as "ping
//! half as often". `max_connection_idle` sends the graceful two-step
//! GOAWAY after that long without a call open; `max_connection_age` sends
//! it after that long (±10% jitter, so connections made together do not
//! all leave together), and `max_connection_age_grace` later closes the
//! connection whatever is still running.

use std::time::Duration;

/// The payload of keepalive pings (either side).
pub(crate) const KEEPALIVE_PING: [u8; 8] = *b"pp-alive";

/// Strikes a client may collect before a server closes its connection
/// (grpc-go's `maxPingStrikes`: the third bad ping closes it).
pub(crate) const MAX_PING_STRIKES: u32 = 2;

/// The shortest keepalive time and timeout used (shorter settings, zero
/// among them, are raised to it: a timer must move forward).
pub(crate) const LEAST_INTERVAL: Duration = Duration::from_millis(1);

/// With no call open and no `permit_without_stream`, a client should not
/// ping at all: a ping within this of the last one is a strike (grpc-go's
/// `defaultPingTimeout`).
pub(crate) const IDLE_PING_INTERVAL: Duration = Duration::from_secs(2 * 60 * 60);

/// Client keepalive (gRFC A8), in `ChannelOptions::keepalive`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientKeepalive {
    /// Ping after this long without reading anything. Servers refuse
    /// pings more often than their `min_time` (grpc-go: 5 min by default).
    pub time: Duration,
    /// Give the connection up when nothing arrives this long after a ping
    /// (grpc-go: 20 s).
    pub timeout: Duration,
    /// Ping even with no call open.
    pub permit_without_stream: bool,
}

impl Default for ClientKeepalive {
    fn default() -> Self {
        ClientKeepalive {
            time: Duration::from_secs(5 * 60),
            timeout: Duration::from_secs(20),
            permit_without_stream: false,
        }
    }
}

/// Server keepalive, its enforcement of clients' pings (A8) and the
/// connection lifecycle (A9), in `ServerOptions::keepalive`. The defaults
/// are grpc-go's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerKeepalive {
    /// Ping a client after this long without reading anything from it
    /// (2 h).
    pub time: Duration,
    /// Close the connection when nothing arrives this long after such a
    /// ping (20 s).
    pub timeout: Duration,
    /// The shortest time between a client's pings that is not a strike
    /// (5 min).
    pub min_time: Duration,
    /// Whether clients may ping with no call open.
    pub permit_without_stream: bool,
    /// GOAWAY (graceful) after this long with no call open.
    pub max_connection_idle: Option<Duration>,
    /// GOAWAY (graceful) after this long, ±10%.
    pub max_connection_age: Option<Duration>,
    /// After `max_connection_age`'s GOAWAY, close the connection this much
    /// later even with calls running (none: wait for them).
    pub max_connection_age_grace: Option<Duration>,
}

impl Default for ServerKeepalive {
    fn default() -> Self {
        ServerKeepalive {
            time: Duration::from_secs(2 * 60 * 60),
            timeout: Duration::from_secs(20),
            min_time: Duration::from_secs(5 * 60),
            permit_without_stream: false,
            max_connection_idle: None,
            max_connection_age: None,
            max_connection_age_grace: None,
        }
    }
}

/// `d` scaled by a factor in [0.9, 1.1) drawn from `seed`.
pub(crate) fn jitter(d: Duration, seed: u64) -> Duration {
    // splitmix64: a well-spread draw from a counter or address.
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
    d.mul_f64(0.9 + 0.2 * unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_ten_percent_and_spreads() {
        let d = Duration::from_secs(100);
        let all: Vec<Duration> = (0..1000).map(|i| jitter(d, i)).collect();
        assert!(all.iter().all(|j| *j >= Duration::from_secs(90) && *j < Duration::from_secs(110)));
        let low = all.iter().filter(|j| **j < d).count();
        assert!((400..600).contains(&low), "{low} of 1000 below the middle");
    }
}
