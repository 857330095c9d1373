//! CPU time of this process's threads, grouped by thread name, read from
//! `/proc` (std has no thread CPU clock, and `clock_gettime` would need
//! unsafe code, which the workspace forbids outside `shm`).
//!
//! Each thread's time is the first field of `/proc/self/task/TID/schedstat`
//! (nanoseconds on a CPU, exact); where the kernel has no schedstat, the
//! `utime + stime` of `/proc/self/task/TID/stat` (10 ms ticks). Threads
//! that have exited are not counted, so measure while they run.

use std::collections::BTreeMap;

/// Ticks per second of `utime` / `stime` (USER_HZ, 100 on Linux).
const CLK_TCK: u64 = 100;

/// CPU time in nanoseconds of `/proc/self/task/<tid>`.
fn task_cpu_ns(dir: &std::path::Path) -> Option<u64> {
    if let Ok(s) = std::fs::read_to_string(dir.join("schedstat")) {
        if let Some(ns) = s.split_whitespace().next().and_then(|f| f.parse().ok()) {
            return Some(ns);
        }
    }
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    let mut fields = rest.split_ascii_whitespace();
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) * (1_000_000_000 / CLK_TCK))
}

/// CPU nanoseconds of every live thread of this process, summed by the
/// thread-name prefix `classify` maps each name to (`None`: counted only
/// in the `"*"` total). Thread names are as the kernel keeps them (the
/// first 15 bytes).
pub fn cpu_by_group(
    classify: impl Fn(&str) -> Option<&'static str>,
) -> BTreeMap<&'static str, u64> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return out };
    for task in dir.flatten() {
        let path = task.path();
        let Some(ns) = task_cpu_ns(&path) else { continue };
        *out.entry("*").or_insert(0) += ns;
        let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if let Some(group) = classify(name.trim_end()) {
            *out.entry(group).or_insert(0) += ns;
        }
    }
    out
}

/// CPU nanoseconds of the calling thread.
pub fn this_thread_cpu_ns() -> Option<u64> {
    task_cpu_ns(std::path::Path::new("/proc/thread-self"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_and_thread_clock() {
        let before = this_thread_cpu_ns().expect("thread clock");
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(std::hint::black_box(i));
        }
        std::hint::black_box(x);
        assert!(this_thread_cpu_ns().expect("thread clock") > before);
        let t = std::thread::Builder::new()
            .name("cpu-test-spin".into())
            .spawn(|| {
                let mut x = 0u64;
                for i in 0..5_000_000u64 {
                    x = x.wrapping_mul(31).wrapping_add(std::hint::black_box(i));
                }
                let g = cpu_by_group(|n| n.starts_with("cpu-test-spin").then_some("spin"));
                (std::hint::black_box(x), g)
            })
            .expect("spawn");
        let (_, groups) = t.join().expect("join");
        assert!(groups.get("spin").is_some_and(|&ns| ns > 0), "{groups:?}");
        assert!(groups["*"] >= groups["spin"]);
    }
}
