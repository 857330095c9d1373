//! Accept loops that outlive accept errors.
//!
//! `accept(2)` fails for two kinds of reasons. Some concern one connection
//! only (it was reset or aborted before it was taken): the next one is
//! fine, so the loop goes straight on. Others concern the process (out of
//! descriptors, `EMFILE` / `ENFILE`; out of memory or buffers): retrying at
//! once fails again and only burns a core, while giving up closes the port
//! for good. The loop backs off instead, from 5 ms doubling to 1 s, and
//! serves again as soon as a descriptor is free. (hyper's and Go's
//! `net/http` servers do the same; Go sleeps 5 ms doubling to 1 s.)
//!
//! Every listener of protoplane — gRPC, lean over TCP and Unix sockets, the
//! engine's attach socket — accepts through [`accept`].

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// First and longest pause after an error that concerns the process.
const BACKOFF_FIRST: Duration = Duration::from_millis(5);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Accept errors of the process kind so far, every listener together.
static PROCESS_ERRORS: AtomicU64 = AtomicU64::new(0);

/// How many times an accept loop of this process has had to back off
/// (out of descriptors, memory or buffers) since it started: a counter for
/// operators, and how a test knows its listeners ran into the limit.
pub fn process_errors() -> u64 {
    PROCESS_ERRORS.load(Ordering::Relaxed)
}

/// Whether an accept error concerns only the connection being accepted.
pub fn concerns_one_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    ) || matches!(e.raw_os_error(), Some(libc_eproto::EPROTO) | Some(libc_eproto::EPERM))
}

/// Error numbers `io::ErrorKind` does not name (Linux values).
mod libc_eproto {
    /// A protocol error on the connection being accepted.
    pub(super) const EPROTO: i32 = 71;
    /// A firewall refused the connection being accepted.
    pub(super) const EPERM: i32 = 1;
}

/// The next connection `accept_once` yields, waiting out errors: those of
/// one connection are skipped, those of the process (descriptors, memory)
/// are retried with backoff and logged once per episode as `what`.
pub async fn accept<T, F, Fut>(what: &str, mut accept_once: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = io::Result<T>>,
{
    let mut pause = BACKOFF_FIRST;
    loop {
        match accept_once().await {
            Ok(conn) => return conn,
            Err(e) if concerns_one_connection(&e) => continue,
            Err(e) => {
                PROCESS_ERRORS.fetch_add(1, Ordering::Relaxed);
                if pause == BACKOFF_FIRST {
                    tracing::warn!("{what}: accept failed ({e}); retrying with backoff");
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(BACKOFF_MAX);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[tokio::test(start_paused = true)]
    async fn process_errors_back_off_and_connection_errors_do_not() {
        let calls = AtomicU32::new(0);
        let started = tokio::time::Instant::now();
        let got = accept("test", || {
            let n = calls.fetch_add(1, Ordering::Relaxed);
            async move {
                match n {
                    0 => Err(io::Error::from(io::ErrorKind::ConnectionAborted)),
                    1..=3 => Err(io::Error::from_raw_os_error(24)), // EMFILE
                    _ => Ok(n),
                }
            }
        })
        .await;
        assert_eq!(got, 4);
        // 5 + 10 + 20 ms of backoff, and none for the aborted connection.
        assert_eq!(started.elapsed(), Duration::from_millis(35));
    }
}
