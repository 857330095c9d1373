//! The process on this host: tokio runtimes, and the CPU time of processes
//! and threads read from `/proc` (what the demo, `load` and `bench rpc`
//! report per call).

use crate::Error;

/// Clock ticks per second of `utime`/`stime` in `/proc/.../stat`
/// (`sysconf(_SC_CLK_TCK)`, `getconf CLK_TCK`). It is USER_HZ, fixed at 100
/// by the kernel's user ABI on every Linux architecture; asking sysconf
/// would need libc and unsafe code, which this workspace forbids.
const CLK_TCK: f64 = 100.0;

/// A tokio runtime: current-thread for 1 thread (everything on one core),
/// multi-thread with `threads` workers otherwise.
pub fn runtime(threads: usize) -> Result<tokio::runtime::Runtime, Error> {
    let mut b = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    b.enable_all().build().map_err(|e| Error::Host(format!("tokio runtime: {e}")))
}

/// Makes `rt`'s workers busy-poll instead of sleeping in `epoll_wait`
/// ([`protoplane_rpc::busy::spin`], one spinner per worker): forever
/// (`window: None`) or while protoplane's transports read data at least
/// once per `window`. On a multi-thread runtime the spinners are spread by
/// work stealing, which usually, not certainly, gives every worker one.
pub fn busy_poll(rt: &tokio::runtime::Runtime, window: Option<std::time::Duration>) {
    for _ in 0..rt.metrics().num_workers() {
        rt.spawn(protoplane_rpc::busy::spin(window));
    }
}

/// `utime + stime` of a `/proc/.../stat` line, in seconds.
fn parse_stat_cpu(stat: &str) -> Option<f64> {
    // The command name (field 2) is in parentheses and may hold spaces and
    // parentheses itself: count fields after the last ')'. There, field 3
    // (state) comes first, so utime (14) and stime (15) are the 12th and
    // 13th.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    let mut fields = rest.split_ascii_whitespace();
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / CLK_TCK)
}

fn stat_cpu(path: &str) -> Option<f64> {
    parse_stat_cpu(&std::fs::read_to_string(path).ok()?)
}

/// User + system CPU time of this process, in seconds.
pub fn process_cpu_seconds() -> Option<f64> {
    stat_cpu("/proc/self/stat")
}

/// User + system CPU time of process `pid`, in seconds.
pub fn pid_cpu_seconds(pid: u32) -> Option<f64> {
    stat_cpu(&format!("/proc/{pid}/stat"))
}

/// User + system CPU time of thread `tid` of this process, in seconds.
pub fn thread_cpu_seconds(tid: &str) -> Option<f64> {
    stat_cpu(&format!("/proc/self/task/{tid}/stat"))
}

/// The id of the calling thread (from `/proc/thread-self`).
pub fn thread_id() -> Option<String> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    stat.split_whitespace().next().map(str::to_string)
}

/// CPU time of this process's live threads, in seconds, at nanosecond
/// resolution (the sum of `/proc/self/task/*/schedstat`; `/proc/self/stat`
/// counts in 10 ms ticks, too coarse for a run of a few hundred ms).
pub fn process_cpu_precise() -> Option<f64> {
    let mut ns: u64 = 0;
    for t in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        // A thread that exits while the list is read is no longer live.
        let Ok(text) = std::fs::read_to_string(t.path().join("schedstat")) else { continue };
        ns += text.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(ns as f64 / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CPU time of the calling thread, in seconds, at nanosecond resolution.
    fn thread_cpu_precise() -> Option<f64> {
        let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
        Some(text.split_whitespace().next()?.parse::<u64>().ok()? as f64 / 1e9)
    }

    #[test]
    fn proc_stat_cpu() {
        let stat = "1234 (a (b) c) S 1 1234 1234 0 -1 4194560 500 0 0 0 250 75 0 0 20 0 3 0";
        assert_eq!(parse_stat_cpu(stat), Some(3.25));
        assert_eq!(parse_stat_cpu("1234 (x) S 1 2"), None);
        assert_eq!(parse_stat_cpu("garbage"), None);
        assert!(process_cpu_seconds().is_some_and(|s| s >= 0.0));
        let tid = thread_id().unwrap_or_default();
        assert!(thread_cpu_seconds(&tid).is_some_and(|s| s >= 0.0));
        assert!(pid_cpu_seconds(std::process::id()).is_some_and(|s| s >= 0.0));
        // The process's sum goes down when another test's thread exits, so
        // the busy loop is checked on this thread's own clock.
        assert!(process_cpu_precise().is_some_and(|s| s > 0.0));
        // schedstat of a running thread moves when the scheduler accounts
        // for it (a tick, a switch), not continuously: busy until it has
        // moved, for up to 10 s of wall time.
        let before = thread_cpu_precise().unwrap_or(f64::NAN);
        let start = std::time::Instant::now();
        let mut x = 0u64;
        let moved = loop {
            for i in 0..1_000_000u64 {
                x = x.wrapping_mul(31).wrapping_add(std::hint::black_box(i));
            }
            if thread_cpu_precise().is_some_and(|after| after > before) {
                break true;
            }
            if start.elapsed() > std::time::Duration::from_secs(10) {
                break false;
            }
        };
        std::hint::black_box(x);
        assert!(moved, "a busy loop takes CPU time");
    }
}
