//! PING (RFC 9113 §6.7): answered at once, and reported to the caller
//! ([`Event::Ping`]), who keeps the clock: keepalive pings it sends with
//! [`Conn::ping`] and whose acknowledgements it waits for, and the
//! enforcement of how often a peer may ping (gRFC A8). A graceful
//! shutdown sends one of its own (see `go_away`). Neither a PING nor its
//! acknowledgement is progress for the idle-frame budget.

use crate::frame::{self, flag, Head, Reason};

use super::{Conn, ConnError, Event};

impl Conn {
    pub(super) fn on_ping(
        &mut self,
        head: Head,
        payload: &[u8],
    ) -> Result<Option<Event>, ConnError> {
        if head.stream != 0 {
            return Err(self.fail(Reason::PROTOCOL_ERROR, "PING on a stream"));
        }
        let Ok(p) = <[u8; 8]>::try_from(payload) else {
            return Err(self.fail(Reason::FRAME_SIZE_ERROR, "PING not 8 bytes"));
        };
        self.idle_frame()?;
        let ack = head.has(flag::ACK);
        if !ack {
            frame::write_ping(&mut self.out.buf, p, true);
        } else if p == super::go_away::GRACEFUL_PING {
            self.on_graceful_ping_ack();
            return Ok(None);
        }
        Ok(Some(Event::Ping { ack, payload: p }))
    }

    /// Sends a PING with `payload` (its acknowledgement comes back as
    /// [`Event::Ping`] with `ack`).
    pub fn ping(&mut self, payload: [u8; 8]) {
        frame::write_ping(&mut self.out.buf, payload, false);
    }

    /// Whether a HEADERS or DATA frame went out since the last call (a
    /// gRPC server forgives a client's pings after sending it something,
    /// as grpc-go does).
    pub fn take_sent_stream_frames(&mut self) -> bool {
        std::mem::take(&mut self.sent_stream_frames)
    }
}
