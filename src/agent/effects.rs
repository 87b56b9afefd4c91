//! The executor's bookkeeping for effects (API writes, used marks): each effect has a key
//! (`create/<pv>`, `flag-missing/<pv>`...), a failed one is kept with its own retry deadline
//! (core::backoff) that wakes the loop, and problems are reported once per occurrence.

use std::collections::BTreeSet;
use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use crate::core::backoff::{Policy, Retries};

/// Delays after a failed API write or used mark: 0.5 s, doubling to 30 s, so a refusal that is
/// lifted (an admission policy removed, RBAC fixed) is followed within about half a minute
/// while a broken API server sees at most one attempt per effect per 30 s.
pub const WRITE_RETRY: Policy = Policy { initial: Duration::from_millis(500), max: Duration::from_secs(30) };

/// Retry records and recent successes of the effects one pass plans.
#[derive(Debug, Default)]
pub struct Effects {
    retries: Retries,
    /// Keys planned in the pass under way: records of the others are dropped at its end.
    wanted: BTreeSet<String>,
    /// Keys that succeeded in this pass and in the last one: the watch may not have shown
    /// their result yet, so the same effect planned again is not sent twice.
    done_now: BTreeSet<String>,
    done_before: BTreeSet<String>,
}

impl Effects {
    /// Starts a pass.
    pub fn begin_pass(&mut self) {
        self.wanted.clear();
        self.done_before = std::mem::take(&mut self.done_now);
    }

    /// Ends a completed pass: failures of effects no longer planned are forgotten (what they
    /// were for is gone or was done another way).
    pub fn end_pass(&mut self) {
        let wanted = &self.wanted;
        self.retries.retain(|k| wanted.contains(k));
    }

    /// Notes that the pass plans `key` and says whether to carry it out now: not while its
    /// retry delay runs, nor when it just succeeded.
    pub fn due(&mut self, key: &str) -> bool {
        self.wanted.insert(key.to_string());
        if self.done_before.contains(key) || self.done_now.contains(key) {
            return false;
        }
        self.retries.may_try(key, Instant::now(), None)
    }

    /// Records how the effect went: a success forgets its failures; a failure gets the next
    /// retry deadline, logged with its cause.
    pub fn record<T, E: Display>(&mut self, key: &str, result: &Result<T, E>) {
        match result {
            Ok(_) => {
                self.retries.succeeded(key);
                self.done_now.insert(key.to_string());
            }
            Err(e) => {
                let now = Instant::now();
                let random = crate::runtime::random_fraction();
                let due = self.retries.failed(key, WRITE_RETRY, e.to_string(), None, now, random);
                let retry_in_ms = due.saturating_duration_since(now).as_millis() as u64;
                let failures = self.retries.get(key).map_or(1, |r| r.failures);
                warn!(effect = key, error = %e, failures, retry_in_ms, "failed; will retry");
            }
        }
    }

    /// Keeps a condition the agent waits out (a device in use, a held device) on a retry
    /// deadline that wakes the loop, growing like a failed effect's, so it is looked at again
    /// without waiting for the resync. Quiet: the condition is reported once per occurrence by
    /// its caller, not at every look.
    pub fn wait_out(&mut self, key: &str, why: &str) {
        if self.due(key) {
            let now = Instant::now();
            let random = crate::runtime::random_fraction();
            let due = self.retries.failed(key, WRITE_RETRY, why.to_string(), None, now, random);
            debug!(
                condition = key,
                why,
                retry_in_ms = due.saturating_duration_since(now).as_millis() as u64,
                "looked at again later"
            );
        }
    }

    /// Like `wait_out`, with its own delays (a condition that lasts longer than a failed write
    /// usually does, such as a PV name taken by another volume).
    pub fn wait_out_for(&mut self, key: &str, why: &str, policy: Policy) {
        if self.due(key) {
            let now = Instant::now();
            let due = self.retries.failed(key, policy, why.to_string(), None, now, crate::runtime::random_fraction());
            debug!(
                condition = key,
                why,
                retry_in_ms = due.saturating_duration_since(now).as_millis() as u64,
                "looked at again later"
            );
        }
    }

    /// Forgets `key` altogether: its failures and its recent success. For an effect whose
    /// success did not do what it was for (a create answered by a PV of another volume), so
    /// the next attempt is not taken for a repeat.
    pub fn forget(&mut self, key: &str) {
        self.retries.succeeded(key);
        self.done_now.remove(key);
        self.done_before.remove(key);
    }

    /// Carries out the effect `key` when it is due (the future is not polled otherwise, so
    /// nothing is sent) and records how it went.
    pub async fn run<T, E: Display>(
        &mut self,
        key: &str,
        effect: impl Future<Output = Result<T, E>>,
    ) -> Option<Result<T, E>> {
        if !self.due(key) {
            return None;
        }
        let result = effect.await;
        self.record(key, &result);
        Some(result)
    }

    /// When the next failed effect may be retried, so the loop wakes for it.
    pub fn next_due(&self) -> Option<Instant> {
        self.retries.next_due(Instant::now())
    }

    /// Lets every retry deadline pass now (tests step through retries without sleeping).
    #[cfg(test)]
    pub fn expire_for_test(&mut self) {
        self.retries.expire_for_test(Instant::now());
        self.done_before.clear();
        self.done_now.clear();
    }

    /// Keys with a failure kept.
    #[cfg(test)]
    pub fn failure_keys(&self) -> Vec<String> {
        self.retries.keys().map(str::to_string).collect()
    }

    /// The failure kept for `key`.
    #[cfg(test)]
    pub fn failure(&self, key: &str) -> Option<&crate::core::backoff::Record> {
        self.retries.get(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_effect_waits_for_its_deadline_and_is_forgotten_when_no_longer_planned() {
        let mut e = Effects::default();
        e.begin_pass();
        assert!(e.due("create/a"));
        e.record::<(), _>("create/a", &Err("refused"));
        assert!(!e.due("create/a"), "waits for its deadline");
        assert!(e.next_due().is_some());
        e.end_pass();
        assert!(e.failure("create/a").is_some(), "kept while planned");
        e.begin_pass();
        e.end_pass();
        assert!(e.failure("create/a").is_none(), "no longer planned: forgotten");
        assert!(e.next_due().is_none());
    }

    #[test]
    fn a_success_is_not_repeated_until_the_watch_shows_it() {
        let mut e = Effects::default();
        e.begin_pass();
        assert!(e.due("flag-missing/a"));
        e.record::<(), &str>("flag-missing/a", &Ok(()));
        e.begin_pass();
        assert!(!e.due("flag-missing/a"), "planned again before the watch showed the result");
        e.begin_pass();
        e.begin_pass();
        assert!(e.due("flag-missing/a"), "planned again later: a new occurrence");
    }

    #[test]
    fn a_condition_waited_out_with_its_own_policy_grows_and_is_forgotten_on_request() {
        let long = Policy { initial: Duration::from_secs(5), max: Duration::from_secs(20) };
        let mut e = Effects::default();
        e.begin_pass();
        e.wait_out_for("collision/a", "taken", long);
        assert_eq!(e.failure("collision/a").unwrap().delay, Duration::from_secs(5));
        assert!(!e.due("collision/a"), "waits");
        e.wait_out_for("collision/a", "taken", long);
        assert_eq!(e.failure("collision/a").unwrap().delay, Duration::from_secs(5), "not grown before its deadline");
        for want in [10, 20, 20] {
            e.expire_for_test();
            e.wait_out_for("collision/a", "taken", long);
            assert_eq!(e.failure("collision/a").unwrap().delay, Duration::from_secs(want));
        }
        e.record::<(), &str>("create/a", &Ok(()));
        e.forget("create/a");
        e.forget("collision/a");
        assert!(e.failure("collision/a").is_none());
        assert!(e.due("create/a"), "a forgotten success is not taken for a repeat");
    }
}
