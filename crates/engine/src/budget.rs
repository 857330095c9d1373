//! What one application may cost the engine, and what happens when it
//! costs more.
//!
//! An application attached to a shared engine can hurt others without
//! breaking a single protocol rule: by holding the engine's request memory,
//! by taking calls and never answering, or by keeping the engine's thread
//! busy with descriptors that do nothing. Each has a budget here, checked
//! by the application's drain loop; breaking one detaches the application
//! (its calls fail UNAVAILABLE, the balancer sends the next ones to other
//! instances) with a reason that names the budget.
//!
//! | budget | rule | config key |
//! |---|---|---|
//! | memory held | request memory of a call must be released within `release_timeout` of the call's end | `budgets.release_timeout_ms` |
//! | answers | `max_unanswered` calls in a row ending (deadline, client gone) without one descriptor from the application, and no answer for `answer_timeout` | `budgets.max_unanswered`, `budgets.answer_timeout_ms` |
//! | work per pass | at most `descriptors_per_pass` descriptors per drain pass, then the engine serves the others | `budgets.descriptors_per_pass` |
//! | events per call | at most `max_queued` responses waiting for one call's client | `budgets.max_queued` |
//! | idle descriptors | a descriptor for a call the engine never opened, an empty release, or more descriptors for ended calls than the engine ended calls under it | (always) |
//!
//! Calls open at once are limited too (`limits.max_in_flight`), and a
//! region's chunks are its memory limit: both only make new calls wait or
//! fail RESOURCE_EXHAUSTED, never detach.

use std::time::Duration;

/// The budgets of each attached application.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Budgets {
    /// Descriptors the drain loop takes from one application before it
    /// lets the engine's other work run.
    pub descriptors_per_pass: usize,
    /// How long after its call ended a request's memory may stay held.
    pub release_timeout: Duration,
    /// Calls in a row ending unanswered before the application counts as a
    /// black hole (with `answer_timeout`).
    pub max_unanswered: u32,
    /// How long an application with `max_unanswered` calls in a row
    /// unanswered may go without answering any call.
    pub answer_timeout: Duration,
    /// Responses (messages, headers, status) queued for one call.
    pub max_queued: usize,
    /// Outbound calls open at once (`[outbound] max_calls`); more fail
    /// with RESOURCE_EXHAUSTED.
    pub max_outbound: usize,
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            descriptors_per_pass: 256,
            release_timeout: Duration::from_secs(10),
            max_unanswered: 64,
            answer_timeout: Duration::from_secs(10),
            max_queued: 1024,
            max_outbound: 4096,
        }
    }
}

impl Budgets {
    /// The drain loop's budget clock: how often it ticks. Timeouts are
    /// counted in ticks, so an offence is caught between its timeout and
    /// a quarter more.
    pub fn tick(&self) -> Duration {
        (self.release_timeout.min(self.answer_timeout) / 4).max(Duration::from_millis(1))
    }

    /// `timeout` in ticks (rounded up).
    pub fn ticks(&self, timeout: Duration) -> u32 {
        let t = self.tick().as_nanos().max(1);
        timeout.as_nanos().div_ceil(t).min(u32::MAX as u128) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_count_in_ticks() {
        let b = Budgets::default();
        assert_eq!(b.tick(), Duration::from_millis(2500));
        assert_eq!(b.ticks(b.release_timeout), 4);
        let b = Budgets { release_timeout: Duration::from_millis(200), ..Budgets::default() };
        assert_eq!(b.tick(), Duration::from_millis(50));
        assert_eq!(b.ticks(b.answer_timeout), 200);
    }
}
