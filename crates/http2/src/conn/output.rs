//! The frames waiting to be written.

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::Bytes;

/// Frames waiting to be written: small ones copied into one buffer, large
/// DATA payloads referenced, in order.
#[derive(Debug, Default)]
pub struct Output {
    pub(super) buf: Vec<u8>,
    /// (position in `buf` the payload goes before, payload).
    pub(super) segments: VecDeque<(usize, Bytes)>,
    /// Bytes of `buf` already written.
    pub(super) head: usize,
    /// Bytes of the front segment already written.
    pub(super) seg_head: usize,
}

/// DATA payloads at least this long are referenced, not copied.
pub(super) const SEGMENT_MIN: usize = 8 << 10;

impl Output {
    /// Whether nothing waits to be written.
    pub fn is_empty(&self) -> bool {
        self.head == self.buf.len() && self.segments.is_empty()
    }

    /// Bytes waiting to be written.
    pub fn len(&self) -> usize {
        self.buf.len() - self.head + self.segments.iter().map(|(_, b)| b.len()).sum::<usize>()
            - self.seg_head
    }

    pub(super) fn push_segment(&mut self, data: Bytes) {
        self.segments.push_back((self.buf.len(), data));
    }

    /// Fills `slices` with what to write next, in order (at most its
    /// capacity's worth of slices); how many.
    pub fn slices<'a>(&'a self, slices: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        let mut pos = self.head;
        let mut first = true;
        for (at, seg) in &self.segments {
            if n + 2 > slices.len() {
                return n;
            }
            if *at > pos {
                slices[n] = IoSlice::new(&self.buf[pos..*at]);
                n += 1;
                pos = *at;
            }
            let skip = if first { self.seg_head } else { 0 };
            first = false;
            slices[n] = IoSlice::new(&seg[skip..]);
            n += 1;
        }
        if pos < self.buf.len() && n < slices.len() {
            slices[n] = IoSlice::new(&self.buf[pos..]);
            n += 1;
        }
        n
    }

    /// Marks `n` bytes written.
    pub fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let next_seg = self.segments.front().map(|(at, _)| *at);
            match next_seg {
                Some(at) if at == self.head => {
                    let Some((_, seg)) = self.segments.front() else { break };
                    let left = seg.len() - self.seg_head;
                    if n >= left {
                        n -= left;
                        self.segments.pop_front();
                        self.seg_head = 0;
                    } else {
                        self.seg_head += n;
                        n = 0;
                    }
                }
                Some(at) => {
                    let take = n.min(at - self.head);
                    self.head += take;
                    n -= take;
                }
                None => {
                    let take = n.min(self.buf.len() - self.head);
                    self.head += take;
                    n -= take;
                    if take == 0 {
                        break;
                    }
                }
            }
        }
        // Empty segments at the head (never pushed, but cheap to handle).
        while self.segments.front().is_some_and(|(at, s)| *at == self.head && s.is_empty()) {
            self.segments.pop_front();
        }
        if self.is_empty() {
            self.buf.clear();
            self.head = 0;
        }
    }

    /// Everything waiting, as one contiguous buffer (tests, fuzzing).
    pub fn take_all(&mut self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        let mut pos = self.head;
        for (i, (at, seg)) in self.segments.iter().enumerate() {
            if *at > pos {
                v.extend_from_slice(&self.buf[pos..*at]);
                pos = *at;
            }
            v.extend_from_slice(&seg[if i == 0 { self.seg_head } else { 0 }..]);
        }
        v.extend_from_slice(&self.buf[pos..]);
        self.buf.clear();
        self.segments.clear();
        self.head = 0;
        self.seg_head = 0;
        v
    }
}
