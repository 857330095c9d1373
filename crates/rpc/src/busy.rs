//! Busy-polling: keeping a tokio worker out of `epoll_wait` while calls
//! keep coming.
//!
//! At one call in flight, most of a call's latency on an otherwise idle
//! host is not protocol work but wake-ups: the request arrives, the kernel
//! wakes the server's sleeping thread, the response arrives, it wakes the
//! client's. On this class of machine a wake-up costs tens of µs, several
//! times the few µs the call itself takes. An engine core that spins on its
//! rings (Snap's dedicated engines, eRPC's polling threads) never pays it;
//! [`spin`] does the same for a tokio runtime: a task that only yields
//! keeps its worker from parking, so every turn of the worker polls the
//! reactor with a zero timeout and runs whatever became ready.
//!
//! Spinning forever holds a core at 100% whatever the load. With a window,
//! [`spin`] spins only while protoplane's transports keep reading data:
//! once nothing has arrived for the window, it sleeps until the next read
//! (the reads that wake it are paid at the normal wake-up cost, the ones
//! after run at spinning latency). Reads are counted by protoplane's own
//! transports (native HTTP/2 on both sides, lean); a server on the `h2`
//! crate does not count them, so the window there only ever runs out.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// Spinners with a window, the only readers of READS: while there are
/// none, the transports do not count (no shared cache line written on
/// every read of every connection).
static WATCHERS: AtomicUsize = AtomicUsize::new(0);
/// Reads that returned data, process-wide, while somebody watches.
static READS: AtomicU64 = AtomicU64::new(0);
/// Spinners asleep waiting for a read.
static ASLEEP: AtomicUsize = AtomicUsize::new(0);
/// Wakes sleeping spinners.
static WAKE: Notify = Notify::const_new();

/// Called by the transports after a read that returned data.
///
/// Cost when no spinner has a window: one load.
#[inline]
pub(crate) fn note_read() {
    if WATCHERS.load(Relaxed) == 0 {
        return;
    }
    // SeqCst pairs with the spinner's store to ASLEEP and load of READS:
    // either it sees this read, or this sees it asleep and wakes it.
    READS.fetch_add(1, SeqCst);
    if ASLEEP.load(SeqCst) > 0 {
        WAKE.notify_waiters();
    }
}

/// Reads that returned data so far, process-wide.
pub fn reads() -> u64 {
    READS.load(SeqCst)
}

/// Keeps the worker that polls it busy: yields forever (`window: None`), or
/// while protoplane's transports read data at least once per `window`,
/// sleeping in between. Never returns; spawn one per worker thread and drop
/// the runtime to stop it.
pub async fn spin(window: Option<Duration>) {
    /// Counts a windowed spinner for as long as it lives (it ends when its
    /// runtime drops it).
    struct Watching;
    impl Drop for Watching {
        fn drop(&mut self) {
            WATCHERS.fetch_sub(1, SeqCst);
        }
    }
    // Counted before the first look at READS.
    let _watching = window.map(|_| {
        WATCHERS.fetch_add(1, SeqCst);
        Watching
    });
    let mut seen = reads();
    let mut until = window.map(|w| Instant::now() + w);
    loop {
        tokio::task::yield_now().await;
        let (Some(window), Some(deadline)) = (window, until) else {
            continue;
        };
        let now = reads();
        if now != seen {
            seen = now;
            until = Some(Instant::now() + window);
            continue;
        }
        if Instant::now() < deadline {
            continue;
        }
        // Idle for a whole window: sleep until the next read. The waiter is
        // registered before the last look at READS, so a read after that
        // look wakes it.
        let notified = WAKE.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        ASLEEP.fetch_add(1, SeqCst);
        if reads() == seen {
            notified.await;
        }
        ASLEEP.fetch_sub(1, SeqCst);
        seen = reads();
        until = Some(Instant::now() + window);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spinner whose window ran out sleeps, and a read wakes it.
    #[test]
    fn an_idle_spinner_sleeps_and_a_read_wakes_it() {
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            tokio::spawn(spin(Some(Duration::from_millis(2))));
            let deadline = Instant::now() + Duration::from_secs(5);
            while ASLEEP.load(SeqCst) == 0 {
                assert!(Instant::now() < deadline, "the spinner never slept");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            note_read();
            // Yields only: the spinner must wake from the read alone, not
            // from a timer.
            let deadline = Instant::now() + Duration::from_secs(5);
            while ASLEEP.load(SeqCst) != 0 {
                assert!(Instant::now() < deadline, "a read did not wake the spinner");
                tokio::task::yield_now().await;
            }
        });
    }
}
