//! SETTINGS: ours (sent with the preface, acknowledged by the peer) and
//! the peer's (applied in order; a new initial window moves every open
//! stream's window, and may unblock pending data).

use crate::frame::{self, flag, setting, Head, Reason, PREFACE};

use super::{Conn, ConnError, Role};

/// The peer's settings.
#[derive(Clone, Copy, Debug)]
pub(super) struct PeerSettings {
    pub(super) initial_window: u32,
    pub(super) max_frame: u32,
    pub(super) max_concurrent: u32,
}

impl Conn {
    /// The client's preface, then our SETTINGS and the connection window
    /// beyond the default.
    pub(super) fn write_preface_and_settings(&mut self) {
        let buf = &mut self.out.buf;
        if self.cfg.role == Role::Client {
            buf.extend_from_slice(PREFACE);
        }
        let mut values = vec![
            (setting::MAX_CONCURRENT_STREAMS, self.cfg.max_concurrent_streams),
            (setting::INITIAL_WINDOW_SIZE, self.cfg.stream_window),
            (setting::MAX_HEADER_LIST_SIZE, self.cfg.max_header_list),
        ];
        if self.cfg.max_frame_size != frame::DEFAULT_MAX_FRAME {
            values.push((setting::MAX_FRAME_SIZE, self.cfg.max_frame_size));
        }
        if self.cfg.role == Role::Client {
            values.push((setting::ENABLE_PUSH, 0));
        }
        frame::write_settings(buf, &values);
        let extra = i64::from(self.cfg.connection_window) - i64::from(frame::DEFAULT_WINDOW);
        if extra > 0 {
            frame::write_window_update(buf, 0, extra as u32);
            self.recv_window += extra;
        }
    }

    pub(super) fn on_settings(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        if head.stream != 0 {
            return Err(self.fail(Reason::PROTOCOL_ERROR, "SETTINGS on a stream"));
        }
        if head.has(flag::ACK) {
            if !payload.is_empty() {
                return Err(self.fail(Reason::FRAME_SIZE_ERROR, "SETTINGS ACK with a payload"));
            }
            if self.settings_unacked == 0 {
                // An acknowledgement of nothing.
                self.idle_frame()?;
            }
            self.settings_unacked = self.settings_unacked.saturating_sub(1);
            return Ok(());
        }
        if payload.len() % 6 != 0 {
            return Err(self.fail(Reason::FRAME_SIZE_ERROR, "SETTINGS length not a multiple of 6"));
        }
        self.idle_frame()?;
        // INITIAL_WINDOW_SIZE: (largest, last) value in this frame.
        let mut initial: Option<(u32, u32)> = None;
        for kv in payload.chunks_exact(6) {
            let id = u16::from_be_bytes([kv[0], kv[1]]);
            let v = u32::from_be_bytes([kv[2], kv[3], kv[4], kv[5]]);
            match id {
                setting::HEADER_TABLE_SIZE => self.encoder.set_max_table_size(v as usize),
                setting::ENABLE_PUSH if v > 1 || (v == 1 && self.cfg.role == Role::Client) => {
                    return Err(self.fail(Reason::PROTOCOL_ERROR, "invalid ENABLE_PUSH"));
                }
                setting::MAX_CONCURRENT_STREAMS => self.peer.max_concurrent = v,
                setting::INITIAL_WINDOW_SIZE => {
                    if i64::from(v) > frame::MAX_WINDOW {
                        return Err(
                            self.fail(Reason::FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE too large")
                        );
                    }
                    initial = Some(initial.map_or((v, v), |(largest, _)| (largest.max(v), v)));
                }
                setting::MAX_FRAME_SIZE => {
                    if !(frame::DEFAULT_MAX_FRAME..=frame::MAX_MAX_FRAME).contains(&v) {
                        return Err(self.fail(Reason::PROTOCOL_ERROR, "invalid MAX_FRAME_SIZE"));
                    }
                    self.peer.max_frame = v;
                }
                _ => {} // MAX_HEADER_LIST_SIZE is advisory; unknown ids are ignored.
            }
        }
        if let Some((largest, last)) = initial {
            // Every value applies to every stream, in order; one pass for
            // the frame, not one per value, keeps a SETTINGS frame's cost
            // linear. A stream's window is largest under the largest value,
            // so that is where an overflow would show.
            let old = i64::from(self.peer.initial_window);
            let (to_largest, to_last) = (i64::from(largest) - old, i64::from(last) - old);
            self.peer.initial_window = last;
            let mut overflow = false;
            for s in self.streams.values_mut() {
                overflow |= s.send_window + to_largest > frame::MAX_WINDOW;
                s.send_window += to_last;
                s.send_peak += to_last;
            }
            if overflow {
                return Err(self.fail(Reason::FLOW_CONTROL_ERROR, "stream window overflow"));
            }
        }
        frame::write_settings_ack(&mut self.out.buf);
        // A larger initial window may unblock pending data.
        self.flush_all();
        Ok(())
    }
}
