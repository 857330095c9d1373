//! GOAWAY (RFC 9113 §6.8): ours (graceful with NO_ERROR: open streams
//! go on, new ones are refused) and the peer's (no new stream may be
//! opened, ever).
//!
//! A graceful shutdown goes in two phases, as §6.8 advises: GOAWAY with
//! the largest stream id and a PING ([`GRACEFUL_PING`]), then, once the
//! PING's acknowledgement shows the client has read the first GOAWAY (and
//! so opens no more streams here), the final GOAWAY naming the last
//! stream taken. A stream the client opened while the first was in flight
//! is served, not refused: no call is lost to the race.

use crate::frame::{self, Head, Reason};

use super::{Conn, ConnError, Event};

/// The payload of a graceful shutdown's PING.
pub(super) const GRACEFUL_PING: [u8; 8] = *b"pp-drain";

impl Conn {
    /// Whether a GOAWAY has been sent (no new streams are accepted).
    pub fn is_closing(&self) -> bool {
        self.goaway_sent
    }

    /// Sends GOAWAY with `reason` (NO_ERROR: a graceful shutdown; streams
    /// already open go on).
    pub fn go_away(&mut self, reason: Reason, debug: &'static str) {
        if !self.goaway_sent {
            self.goaway_sent = true;
            frame::write_goaway(&mut self.out.buf, self.last_peer_stream, reason, debug.as_bytes());
        }
    }

    /// Starts a graceful shutdown in two phases (see above): streams the
    /// peer opens before it acknowledges the PING are still taken. Does
    /// nothing once a GOAWAY went out.
    pub fn go_away_gracefully(&mut self) {
        if !self.goaway_sent && !self.goaway_announced {
            self.goaway_announced = true;
            frame::write_goaway(&mut self.out.buf, 0x7fff_ffff, Reason::NO_ERROR, b"shutting down");
            frame::write_ping(&mut self.out.buf, GRACEFUL_PING, false);
        }
    }

    /// The PING of a graceful shutdown came back: the final GOAWAY.
    pub(super) fn on_graceful_ping_ack(&mut self) {
        if self.goaway_announced {
            self.go_away(Reason::NO_ERROR, "server shutting down");
        }
    }

    /// Whether the peer sent GOAWAY: no new stream may be opened, ever.
    pub fn peer_gone_away(&self) -> bool {
        self.goaway_received.is_some()
    }

    pub(super) fn on_goaway(
        &mut self,
        head: Head,
        payload: &[u8],
    ) -> Result<Option<Event>, ConnError> {
        if head.stream != 0 {
            return Err(self.fail(Reason::PROTOCOL_ERROR, "GOAWAY on a stream"));
        }
        if payload.len() < 8 {
            return Err(self.fail(Reason::FRAME_SIZE_ERROR, "GOAWAY shorter than 8 bytes"));
        }
        let last =
            u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff;
        let reason = Reason(u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]));
        self.goaway_received = Some(last);
        Ok(Some(Event::GoAway { last_stream: last, reason }))
    }
}
