//! PING (RFC 9113 §6.7): answered at once. We send one only in a graceful
//! shutdown (see `go_away`); an acknowledgement is no progress either.

use crate::frame::{self, flag, Head, Reason};

use super::{Conn, ConnError};

impl Conn {
    pub(super) fn on_ping(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        if head.stream != 0 {
            return Err(self.fail(Reason::PROTOCOL_ERROR, "PING on a stream"));
        }
        let Ok(p) = <[u8; 8]>::try_from(payload) else {
            return Err(self.fail(Reason::FRAME_SIZE_ERROR, "PING not 8 bytes"));
        };
        // An acknowledgement is no progress either: we send no PING.
        self.idle_frame()?;
        if !head.has(flag::ACK) {
            frame::write_ping(&mut self.out.buf, p, true);
        } else if p == super::go_away::GRACEFUL_PING {
            self.on_graceful_ping_ack();
        }
        Ok(())
    }
}
