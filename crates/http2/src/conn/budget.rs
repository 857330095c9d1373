//! What a peer may spend without making progress: stream resets it causes
//! or sends (CVE-2023-44487, "rapid reset") and frames that move nothing
//! (empty DATA, PRIORITY, SETTINGS, PING, credit nobody asked for, unknown
//! types: CVE-2019-9512 and 9518). Useful work refills the budgets; an
//! exhausted one ends the connection with ENHANCE_YOUR_CALM.

use crate::frame::{self, Reason};

use super::{Conn, ConnError};

impl Conn {
    /// A stream error provoked by the peer: RST_STREAM, and one unit of
    /// the reset budget.
    pub(super) fn stream_error(&mut self, id: u32, reason: Reason) -> Result<(), ConnError> {
        self.forget(id);
        frame::write_rst(&mut self.out.buf, id, reason);
        self.reset_by_us.add(id);
        self.spend_reset()
    }

    pub(super) fn spend_reset(&mut self) -> Result<(), ConnError> {
        self.reset_credit = self.reset_credit.saturating_sub(1);
        if self.reset_credit == 0 {
            return Err(self.fail(Reason::ENHANCE_YOUR_CALM, "too many stream resets"));
        }
        Ok(())
    }

    pub(super) fn idle_frame(&mut self) -> Result<(), ConnError> {
        self.idle_frames += 1;
        if self.idle_frames > self.cfg.idle_frame_budget {
            return Err(self.fail(Reason::ENHANCE_YOUR_CALM, "too many frames without progress"));
        }
        Ok(())
    }
}
