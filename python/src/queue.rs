//! The calls waiting for Python, between the attachment's thread (which
//! pushes) and the Python side (worker threads that block in `pop`, or an
//! event loop woken through a socket).

use std::collections::VecDeque;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::call::CallCore;

#[derive(Default)]
pub(crate) struct Queue {
    calls: Mutex<State>,
    ready: Condvar,
    /// The attachment's end of the event loop's wake-up socket.
    bell: Mutex<Option<UnixStream>>,
    /// A wake-up byte is on its way and not yet answered by `take_all`:
    /// pushes write one only when this goes from false to true.
    rung: AtomicBool,
}

#[derive(Default)]
struct State {
    calls: VecDeque<Arc<CallCore>>,
    /// Set once the attachment stops: waiters return.
    closed: bool,
}

impl Queue {
    fn state(&self) -> MutexGuard<'_, State> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn push(&self, call: Arc<CallCore>) {
        self.state().calls.push_back(call);
        self.ready.notify_one();
        if !self.rung.swap(true, Ordering::AcqRel) {
            if let Some(s) = self.bell.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                // A full socket already holds a wake-up: nothing is lost.
                let _ = s.write(&[1]);
            }
        }
    }

    /// The next call, waiting up to `timeout` (forever: `None`); `None`
    /// when none came or the queue is closed.
    pub(crate) fn pop(&self, timeout: Option<Duration>) -> Option<Arc<CallCore>> {
        let until = timeout.map(|t| Instant::now() + t);
        let mut st = self.state();
        loop {
            if let Some(c) = st.calls.pop_front() {
                return Some(c);
            }
            if st.closed {
                return None;
            }
            st = match until {
                None => self.ready.wait(st).unwrap_or_else(|e| e.into_inner()),
                Some(u) => {
                    let left = u.checked_duration_since(Instant::now())?;
                    self.ready.wait_timeout(st, left).unwrap_or_else(|e| e.into_inner()).0
                }
            };
        }
    }

    /// Every call waiting now (the event loop's batch).
    pub(crate) fn take_all(&self) -> Vec<Arc<CallCore>> {
        // Cleared before the queue is read: a push after this rings again.
        self.rung.store(false, Ordering::Release);
        self.state().calls.drain(..).collect()
    }

    /// The event loop's end of a new wake-up socket.
    pub(crate) fn bell(&self) -> std::io::Result<UnixStream> {
        let (ours, theirs) = UnixStream::pair()?;
        ours.set_nonblocking(true)?;
        theirs.set_nonblocking(true)?;
        *self.bell.lock().unwrap_or_else(|e| e.into_inner()) = Some(ours);
        self.rung.store(false, Ordering::Release);
        Ok(theirs)
    }

    pub(crate) fn close(&self) {
        let waiting: Vec<_> = {
            let mut st = self.state();
            st.closed = true;
            st.calls.drain(..).collect()
        };
        for c in waiting {
            c.fail_unstarted();
        }
        self.ready.notify_all();
        if let Some(s) = self.bell.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            let _ = s.write(&[0]);
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.state().closed
    }
}
