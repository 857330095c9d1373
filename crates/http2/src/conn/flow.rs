//! Flow control (RFC 9113 §6.9) both ways. Receiving: every DATA byte
//! counts against the stream's and the connection's windows, and credit
//! goes back only as the caller releases what it consumed. Sending: DATA
//! goes out as far as the peer's windows allow, the rest waits per stream
//! (and streams wait in order for connection credit).

use bytes::Bytes;

use crate::frame::{self, flag, kind, Head, Reason, HEADER_LEN};

use super::output::SEGMENT_MIN;
use super::streams::Stream;
use super::{Conn, ConnError, Event};

impl Conn {
    /// Credit held by a dropped stream's unconsumed data goes back to the
    /// connection (the stream's own window dies with it).
    pub(super) fn return_connection_credit_of(&mut self, s: &Stream) {
        self.release_connection(s.held);
    }

    /// The caller consumed `n` bytes of stream `id`'s data: that much
    /// credit goes back to the peer (in batches: a WINDOW_UPDATE once half
    /// a window is owed).
    pub fn release(&mut self, id: u32, n: usize) {
        if n == 0 {
            return;
        }
        let Some(s) = self.streams.get_mut(&id) else {
            // Gone: its credit went back when it was dropped.
            return;
        };
        let n = (n as u32).min(s.held);
        s.held -= n;
        {
            if !s.recv_closed {
                s.recv_unacked += n;
                if s.recv_unacked >= self.cfg.stream_window / 2 {
                    let inc = s.recv_unacked;
                    s.recv_unacked = 0;
                    s.recv_window += i64::from(inc);
                    frame::write_window_update(&mut self.out.buf, id, inc);
                }
            }
        }
        self.release_connection(n);
    }

    pub(super) fn release_connection(&mut self, n: u32) {
        self.recv_unacked += n;
        if self.recv_unacked >= self.cfg.connection_window / 2 {
            let inc = self.recv_unacked;
            self.recv_unacked = 0;
            self.recv_window += i64::from(inc);
            frame::write_window_update(&mut self.out.buf, 0, inc);
        }
    }

    pub(super) fn on_data(&mut self, head: Head, frame: Bytes) -> Result<Option<Event>, ConnError> {
        let id = head.stream;
        if id == 0 {
            return Err(self.fail(Reason::PROTOCOL_ERROR, "DATA on stream 0"));
        }
        let len = head.len as usize;
        let payload_all = &frame[HEADER_LEN..];
        let data_len = self.unpad(&head, payload_all)?.len();
        let data_start = HEADER_LEN + usize::from(head.has(flag::PADDED));
        // Connection window first: every byte counts, padding included.
        if len as i64 > self.recv_window {
            return Err(self.fail(Reason::FLOW_CONTROL_ERROR, "DATA beyond the connection window"));
        }
        self.recv_window -= len as i64;
        let Some(s) = self.streams.get_mut(&id) else {
            self.release_connection(len as u32);
            if self.idle_stream(id) {
                return Err(self.fail(Reason::PROTOCOL_ERROR, "DATA on an idle stream"));
            }
            if self.reset_by_us.has(id) {
                return Ok(None);
            }
            self.stream_error(id, Reason::STREAM_CLOSED)?;
            return Ok(None);
        };
        if s.recv_closed {
            self.release_connection(len as u32);
            self.stream_error(id, Reason::STREAM_CLOSED)?;
            return Ok(self.reset_event(id, Reason::STREAM_CLOSED));
        }
        if len as i64 > s.recv_window {
            self.release_connection(len as u32);
            self.stream_error(id, Reason::FLOW_CONTROL_ERROR)?;
            return Ok(self.reset_event(id, Reason::FLOW_CONTROL_ERROR));
        }
        s.recv_window -= len as i64;
        s.data_received += data_len as u64;
        let end = head.has(flag::END_STREAM);
        let length_wrong = s
            .content_length
            .is_some_and(|cl| s.data_received > cl || (end && s.data_received != cl));
        if length_wrong {
            self.release_connection(len as u32);
            self.stream_error(id, Reason::PROTOCOL_ERROR)?;
            return Ok(self.reset_event(id, Reason::PROTOCOL_ERROR));
        }
        if end {
            s.recv_closed = true;
        }
        s.held += data_len as u32;
        // Padding is consumed at once.
        let pad = len - data_len;
        if pad > 0 {
            s.recv_window += pad as i64;
            self.release_connection(pad as u32);
            if !end {
                frame::write_window_update(&mut self.out.buf, id, pad as u32);
            }
        }
        if data_len == 0 && !end {
            self.idle_frame()?;
        } else {
            self.idle_frames = 0;
        }
        let data = frame.slice(data_start..data_start + data_len);
        let ev = Event::Data { stream: id, data, end_stream: end };
        if end {
            self.maybe_remove(id);
        }
        Ok(Some(ev))
    }

    pub(super) fn on_window_update(
        &mut self,
        head: Head,
        payload: &[u8],
    ) -> Result<Option<Event>, ConnError> {
        if payload.len() != 4 {
            return Err(self.fail(Reason::FRAME_SIZE_ERROR, "WINDOW_UPDATE not 4 bytes"));
        }
        let inc =
            u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff;
        let id = head.stream;
        if id == 0 {
            if inc == 0 {
                return Err(self.fail(Reason::PROTOCOL_ERROR, "WINDOW_UPDATE of 0"));
            }
            let granted = self.send_window >= self.send_peak;
            self.send_window += i64::from(inc);
            if self.send_window > frame::MAX_WINDOW {
                return Err(self.fail(Reason::FLOW_CONTROL_ERROR, "connection window overflow"));
            }
            self.send_peak = self.send_peak.max(self.send_window);
            if granted {
                self.idle_frame()?;
            }
            self.flush_blocked();
            return Ok(None);
        }
        let Some(s) = self.streams.get_mut(&id) else {
            if self.idle_stream(id) {
                return Err(self.fail(Reason::PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream"));
            }
            // A closed stream: credit in flight is ignored; a zero
            // increment is an error whatever the state (RFC 9113 §6.9),
            // unless we reset the stream ourselves (no reset ping-pong).
            if inc == 0 && !self.reset_by_us.has(id) {
                self.stream_error(id, Reason::PROTOCOL_ERROR)?;
            } else {
                // Credit for a stream that is gone moves nothing.
                self.idle_frame()?;
            }
            return Ok(None);
        };
        if inc == 0 {
            self.stream_error(id, Reason::PROTOCOL_ERROR)?;
            return Ok(self.reset_event(id, Reason::PROTOCOL_ERROR));
        }
        let granted = s.send_window >= s.send_peak;
        s.send_window += i64::from(inc);
        if s.send_window > frame::MAX_WINDOW {
            self.stream_error(id, Reason::FLOW_CONTROL_ERROR)?;
            return Ok(self.reset_event(id, Reason::FLOW_CONTROL_ERROR));
        }
        s.send_peak = s.send_peak.max(s.send_window);
        if granted {
            self.idle_frame()?;
        }
        self.flush_stream(id);
        Ok(None)
    }

    /// Bytes of stream `id` waiting for flow-control credit.
    pub fn pending(&self, id: u32) -> usize {
        self.streams.get(&id).map_or(0, |s| s.pending_len)
    }

    /// Sends `len` bytes of data that `write` appends to the buffer it is
    /// given: straight into the output when flow control allows it all
    /// (the common case: no copy), else into a buffer of its own queued for
    /// credit. `end_stream`: the last data (client requests).
    pub fn send_data_with(
        &mut self,
        id: u32,
        len: usize,
        end_stream: bool,
        write: impl FnOnce(&mut Vec<u8>),
    ) {
        let Some(s) = self.streams.get_mut(&id) else { return };
        if s.send_closed {
            return;
        }
        self.sent_stream_frames = true;
        let fits = s.pending.is_empty()
            && (len as i64) <= s.send_window
            && (len as i64) <= self.send_window
            && len <= self.peer.max_frame as usize
            && len < SEGMENT_MIN;
        if fits {
            s.send_window -= len as i64;
            self.send_window -= len as i64;
            let buf = &mut self.out.buf;
            let at = buf.len();
            frame::write_head(
                buf,
                len,
                kind::DATA,
                if end_stream { flag::END_STREAM } else { 0 },
                id,
            );
            write(buf);
            debug_assert_eq!(buf.len() - at - HEADER_LEN, len);
            let written = buf.len() - at - HEADER_LEN;
            frame::patch_len(buf, at, written);
            if end_stream {
                s.send_closed = true;
                self.after_send_end(id);
            }
            return;
        }
        let mut v = Vec::with_capacity(len);
        write(&mut v);
        self.send_data(id, Bytes::from(v), end_stream);
    }

    /// Sends `data` on stream `id`, as far as flow control allows now; the
    /// rest goes out as credit arrives (see [`Conn::pending`]).
    pub fn send_data(&mut self, id: u32, data: Bytes, end_stream: bool) {
        let Some(s) = self.streams.get_mut(&id) else { return };
        if s.send_closed {
            return;
        }
        s.pending_len += data.len();
        if !data.is_empty() {
            s.pending.push_back(data);
        }
        if end_stream {
            s.end_after = true;
            s.send_closed = true;
        }
        self.flush_stream(id);
    }

    pub(super) fn flush_all(&mut self) {
        let ids: Vec<u32> =
            self.streams.iter().filter(|(_, s)| !s.pending.is_empty()).map(|(id, _)| *id).collect();
        for id in ids {
            self.flush_stream(id);
        }
    }

    pub(super) fn flush_blocked(&mut self) {
        let n = self.blocked.len();
        for _ in 0..n {
            let Some(id) = self.blocked.pop_front() else { break };
            self.flush_stream(id);
            if self.send_window <= 0 {
                break;
            }
        }
    }

    /// Writes as much of stream `id`'s pending data as the windows allow,
    /// then its END_STREAM or trailers once nothing is left.
    pub(super) fn flush_stream(&mut self, id: u32) {
        let max = self.peer.max_frame as usize;
        let Some(s) = self.streams.get_mut(&id) else { return };
        while let Some(front) = s.pending.front_mut() {
            let allowed = s.send_window.min(self.send_window).min(max as i64);
            if allowed <= 0 {
                if self.send_window <= 0 && s.send_window > 0 && !self.blocked.contains(&id) {
                    self.blocked.push_back(id);
                }
                return;
            }
            let n = (allowed as usize).min(front.len());
            let chunk = front.split_to(n);
            if front.is_empty() {
                s.pending.pop_front();
            }
            s.pending_len -= n;
            s.send_window -= n as i64;
            self.send_window -= n as i64;
            let last = s.pending.is_empty() && s.end_after;
            frame::write_head(
                &mut self.out.buf,
                n,
                kind::DATA,
                if last { flag::END_STREAM } else { 0 },
                id,
            );
            // Data that waited for credit counts as sent now, when it goes
            // out: a client pinging as it reads (grpc-go's BDP pings, each
            // after a WINDOW_UPDATE) is answered with data, not strikes.
            self.sent_stream_frames = true;
            if n >= SEGMENT_MIN {
                self.out.push_segment(chunk);
            } else {
                self.out.buf.extend_from_slice(&chunk);
            }
            if last {
                s.end_after = false;
                self.after_send_end(id);
                return;
            }
        }
        if s.end_after {
            // END_STREAM with no data left to carry it.
            s.end_after = false;
            frame::write_head(&mut self.out.buf, 0, kind::DATA, flag::END_STREAM, id);
            self.after_send_end(id);
            return;
        }
        if let Some(rec) = s.trailers.take() {
            self.write_block(id, true, |sink| rec.replay(sink));
            self.after_send_end(id);
        }
    }
}
