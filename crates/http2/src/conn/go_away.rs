//! GOAWAY (RFC 9113 §6.8): ours (graceful with NO_ERROR: open streams
//! go on, new ones are refused) and the peer's (no new stream may be
//! opened, ever).

use crate::frame::{self, Head, Reason};

use super::{Conn, ConnError, Event};

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
