//! The calls waiting for Python, between the attachment's thread (which
//! pushes) and the Python side (worker threads that block in `pop`, or an
//! event loop woken through a socket).

use std::collections::VecDeque;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use protoplane_grpc::{Metadata, Status};
use tokio::sync::oneshot;

use crate::call::CallCore;

/// A finished call's result, and where the attachment waits for it.
pub(crate) type Finished = (oneshot::Sender<Result<Metadata, Status>>, Result<Metadata, Status>);

#[derive(Default)]
pub(crate) struct Queue {
    calls: Mutex<State>,
    ready: Condvar,
    /// The attachment's end of the event loop's wake-up socket.
    bell: Mutex<Option<UnixStream>>,
    /// A wake-up byte is on its way and not yet answered by `take_all`:
    /// pushes write one only when this goes from false to true.
    rung: AtomicBool,
    /// A wake is scheduled for the calls pushed since the last one.
    deferred: AtomicBool,
    /// Calls are taken by an event loop (`take_all`), which flushes
    /// finished calls itself once per pass (`flush`).
    looped: AtomicBool,
}

#[derive(Default)]
struct State {
    calls: VecDeque<Arc<CallCore>>,
    /// Set once the attachment stops: waiters return.
    closed: bool,
    /// Workers blocked in `pop`.
    waiting: usize,
    /// Workers that took a call and have not waited since (each comes
    /// back for the next call as soon as its handler returns), with when
    /// each last took one.
    hot: Vec<(u64, Instant)>,
    /// Results of finished calls not handed to the attachment yet, and
    /// since when the oldest waits. Handing each over on its own would
    /// wake the attachment's thread once per call, and on the core it
    /// shares with Python that thread would take the core from the
    /// handlers each time: results go over once a worker runs out of
    /// calls (or a loop's pass ends), in one wake-up.
    finished: Vec<Finished>,
    finished_since: Option<Instant>,
}

impl State {
    /// Some worker took a call within `STALL` and will be back for the
    /// next: no other needs waking.
    fn progressing(&self) -> bool {
        self.hot.iter().any(|(_, t)| t.elapsed() < STALL)
    }

    fn take_finished(&mut self) -> Vec<Finished> {
        self.finished_since = None;
        std::mem::take(&mut self.finished)
    }
}

fn hand_over(finished: Vec<Finished>) {
    for (tx, result) in finished {
        // The attachment stopped waiting (the call was cancelled): nothing to do.
        let _ = tx.send(result);
    }
}

/// How long the calls a worker is running may go without it taking the
/// next one before another worker is woken for the waiting ones: the
/// worker is then taken to be blocked in its handler.
const STALL: Duration = Duration::from_millis(1);

/// The most results kept before they go over, whatever the queue holds.
const BATCH: usize = 32;

static WORKERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

thread_local! {
    /// This thread's number among the workers (`State::hot`).
    static WORKER: u64 = WORKERS.fetch_add(1, Ordering::Relaxed);
    /// This thread takes calls with `pop`.
    static IS_WORKER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Queue {
    fn state(&self) -> MutexGuard<'_, State> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a call. Python is told once per batch: the first push of a
    /// batch schedules [`Queue::wake`] on the attachment's runtime, which
    /// runs it once the drain pass that found these calls is over (every
    /// call of the pass queued by then), not once per call.
    pub(crate) fn push(self: &Arc<Self>, call: Arc<CallCore>) {
        self.state().calls.push_back(call);
        if self.deferred.swap(true, Ordering::AcqRel) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                let q = self.clone();
                h.spawn(async move { q.wake() });
            }
            Err(_) => self.wake(),
        }
    }

    /// Tells Python calls are waiting. A sleeping worker is woken only
    /// when no worker is making progress: while one runs handlers and
    /// takes the next call as soon as it is done (`pop` without waiting,
    /// GIL held), waking others would only make them queue for the GIL (a
    /// context switch each, per call). A worker that stops making progress
    /// (a handler that blocks) lets the next wake, or a waiter's timed
    /// check, rouse another, so a blocked handler holds up other calls by
    /// `STALL` at most.
    fn wake(&self) {
        self.deferred.store(false, Ordering::Release);
        let wake = {
            let st = self.state();
            !st.calls.is_empty() && st.waiting > 0 && !st.progressing()
        };
        if wake {
            self.ready.notify_one();
        }
        if !self.rung.swap(true, Ordering::AcqRel) {
            if let Some(s) = self.bell.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                // A full socket already holds a wake-up: nothing is lost.
                let _ = s.write(&[1]);
            }
        }
    }

    /// The next call for the worker calling (a thread that runs one
    /// handler at a time), waiting up to `timeout` (forever: `None`);
    /// `None` when none came or the queue is closed.
    pub(crate) fn pop(&self, timeout: Option<Duration>) -> Option<Arc<CallCore>> {
        IS_WORKER.with(|w| w.set(true));
        let me = WORKER.with(|w| *w);
        let until = timeout.map(|t| Instant::now() + t);
        let mut st = self.state();
        let mut first = true;
        loop {
            // Taken at once, or after a wait that found the workers stuck.
            if first || !st.progressing() {
                if let Some(c) = st.calls.pop_front() {
                    let now = Instant::now();
                    match st.hot.iter_mut().find(|(w, _)| *w == me) {
                        Some(h) => h.1 = now,
                        None => st.hot.push((me, now)),
                    }
                    // The last call waiting: what finished goes over now,
                    // while this one runs. Under a load that never lets
                    // the queue empty, results go over in batches of
                    // `BATCH`, or once the oldest has waited `STALL`.
                    let due = st.calls.is_empty()
                        || st.finished.len() >= BATCH
                        || st.finished_since.is_some_and(|t| t.elapsed() >= STALL);
                    let done = if due { st.take_finished() } else { Vec::new() };
                    drop(st);
                    hand_over(done);
                    return Some(c);
                }
            }
            // Nothing to run: results go over before this worker sleeps;
            // a waiter also hands over what a stuck worker left.
            if first
                || (!st.progressing() && st.finished_since.is_some_and(|t| t.elapsed() >= STALL))
            {
                let done = st.take_finished();
                if !done.is_empty() {
                    drop(st);
                    hand_over(done);
                    st = self.state();
                    continue;
                }
            }
            first = false;
            if st.closed {
                return None;
            }
            let mut left = until.map(|u| u.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return None;
            }
            if !st.calls.is_empty() || !st.finished.is_empty() {
                // Calls or results wait while another worker runs: check
                // on it soon.
                left = Some(left.map_or(STALL, |l| l.min(STALL)));
            }
            st.hot.retain(|(w, _)| *w != me);
            st.waiting += 1;
            st = match left {
                None => self.ready.wait(st).unwrap_or_else(|e| e.into_inner()),
                Some(l) => self.ready.wait_timeout(st, l).unwrap_or_else(|e| e.into_inner()).0,
            };
            st.waiting -= 1;
        }
    }

    /// A call's result: handed over at once, or kept for the next hand-over
    /// when a worker or an event loop finishes it (see `State::finished`).
    /// True when it is the first kept since the last hand-over (an event
    /// loop then schedules one, `flush`).
    pub(crate) fn finish(
        &self,
        tx: oneshot::Sender<Result<Metadata, Status>>,
        result: Result<Metadata, Status>,
    ) -> bool {
        if !IS_WORKER.with(|w| w.get()) && !self.looped.load(Ordering::Acquire) {
            let _ = tx.send(result);
            return false;
        }
        let mut st = self.state();
        if st.closed {
            drop(st);
            let _ = tx.send(result);
            return false;
        }
        st.finished.push((tx, result));
        let first = st.finished_since.is_none();
        if first {
            st.finished_since = Some(Instant::now());
        }
        first
    }

    /// Hands every kept result over.
    pub(crate) fn flush(&self) {
        let done = self.state().take_finished();
        hand_over(done);
    }

    /// Every call waiting now (the event loop's batch).
    pub(crate) fn take_all(&self) -> Vec<Arc<CallCore>> {
        self.looped.store(true, Ordering::Release);
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
        let (waiting, done): (Vec<_>, _) = {
            let mut st = self.state();
            st.closed = true;
            (st.calls.drain(..).collect(), st.take_finished())
        };
        hand_over(done);
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
