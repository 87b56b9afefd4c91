//! The one executor's bookkeeping for effects, the agent's (API writes, used marks, conditions
//! waited out) and the wiper's (wipes): each effect has a typed key (core::reconcile::effect_key), a failed
//! one is kept with its own retry deadline (core::reconcile::backoff) that wakes the loop, and the records
//! of effects no longer wanted are dropped, so nothing only grows.

use std::collections::BTreeSet;
use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use crate::core::reconcile::backoff::{Policy, Record, Retries};
use crate::core::reconcile::effect_key::EffectKey;

/// Delays after a failed API write or used mark: 0.5 s, doubling to 30 s, so a refusal that is
/// lifted (an admission policy removed, RBAC fixed) is followed within about half a minute
/// while a broken API server sees at most one attempt per effect per 30 s.
pub(crate) const WRITE_RETRY: Policy = Policy { initial: Duration::from_millis(500), max: Duration::from_secs(30) };

/// Retry records and recent successes of the effects one pass plans.
#[derive(Debug, Default)]
pub(crate) struct Effects {
    retries: Retries<EffectKey>,
    /// Keys planned in the pass under way: records of the others are dropped at its end.
    wanted: BTreeSet<EffectKey>,
    /// Keys that succeeded in this pass and in the last one: the watch may not have shown
    /// their result yet, so the same effect planned again is not sent twice.
    done_now: BTreeSet<EffectKey>,
    done_before: BTreeSet<EffectKey>,
}

impl Effects {
    /// Starts a pass.
    pub(crate) fn begin_pass(&mut self) {
        self.wanted.clear();
        self.done_before = std::mem::take(&mut self.done_now);
    }

    /// Ends a completed pass: failures of effects no longer planned are forgotten (what they
    /// were for is gone or was done another way).
    pub(crate) fn end_pass(&mut self) {
        let wanted = &self.wanted;
        self.retries.retain(|k| wanted.contains(k));
    }

    /// Notes that the pass plans `key` and says whether to carry it out now: not while its
    /// retry delay runs, nor when it just succeeded.
    pub(crate) fn due(&mut self, key: &EffectKey) -> bool {
        self.wanted.insert(key.clone());
        if self.done_before.contains(key) || self.done_now.contains(key) {
            return false;
        }
        self.retries.may_try(key, Instant::now(), None)
    }

    /// Records how the effect went: a success forgets its failures; a failure gets the next
    /// retry deadline, logged with its cause.
    pub(crate) fn record<T, E: Display>(&mut self, key: &EffectKey, result: &Result<T, E>) {
        match result {
            Ok(_) => {
                self.retries.succeeded(key);
                self.done_now.insert(key.clone());
            }
            Err(e) => {
                let now = Instant::now();
                let random = crate::runtime::random_fraction();
                let due = self.retries.failed(key, WRITE_RETRY, e.to_string(), None, now, random);
                let retry_in_ms = due.saturating_duration_since(now).as_millis() as u64;
                let failures = self.retries.get(key).map_or(1, |r| r.failures);
                warn!(effect = %key, error = %e, failures, retry_in_ms, "failed; will retry");
            }
        }
    }

    /// Keeps a condition the agent waits out (a device in use, a held device) on a retry
    /// deadline that wakes the loop, growing like a failed effect's, so it is looked at again
    /// without waiting for the resync. Quiet: the condition is reported once per occurrence by
    /// its caller, not at every look.
    pub(crate) fn wait_out(&mut self, key: &EffectKey, why: &str) {
        if self.due(key) {
            let now = Instant::now();
            let random = crate::runtime::random_fraction();
            let due = self.retries.failed(key, WRITE_RETRY, why.to_string(), None, now, random);
            debug!(
                condition = %key,
                why,
                retry_in_ms = due.saturating_duration_since(now).as_millis() as u64,
                "looked at again later"
            );
        }
    }

    /// Like `wait_out`, with its own delays (a condition that lasts longer than a failed write
    /// usually does, such as a PV name taken by another volume).
    pub(crate) fn wait_out_for(&mut self, key: &EffectKey, why: &str, policy: Policy) {
        if self.due(key) {
            let now = Instant::now();
            let due = self.retries.failed(key, policy, why.to_string(), None, now, crate::runtime::random_fraction());
            debug!(
                condition = %key,
                why,
                retry_in_ms = due.saturating_duration_since(now).as_millis() as u64,
                "looked at again later"
            );
        }
    }

    /// Forgets `key` altogether: its failures and its recent success. For an effect whose
    /// success did not do what it was for (a create answered by a PV of another volume), so
    /// the next attempt is not taken for a repeat.
    pub(crate) fn forget(&mut self, key: &EffectKey) {
        self.retries.succeeded(key);
        self.done_now.remove(key);
        self.done_before.remove(key);
    }

    /// Carries out the effect `key` when it is due (the future is not polled otherwise, so
    /// nothing is sent) and records how it went.
    pub(crate) async fn run<T, E: Display>(
        &mut self,
        key: &EffectKey,
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
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.retries.next_due(Instant::now())
    }

    /// Whether an effect carried out outside a pass (a wipe) may be tried now: never failed,
    /// its deadline passed, or asked for anew (`asked` differs from what its failure was
    /// recorded with: a new cleanup request or identity confirmation).
    pub(crate) fn may_try(&self, key: &EffectKey, asked: Option<&str>) -> bool {
        self.retries.may_try(key, Instant::now(), asked)
    }

    /// Records a failure of such an effect with its own delays and what it was asked with;
    /// returns when it may be tried again.
    pub(crate) fn failed_with(
        &mut self,
        key: &EffectKey,
        policy: Policy,
        error: String,
        asked: Option<&str>,
    ) -> Instant {
        let random = crate::runtime::random_fraction();
        self.retries.failed(key, policy, error, asked, Instant::now(), random)
    }

    /// Such an effect succeeded: its failures are forgotten.
    pub(crate) fn succeeded(&mut self, key: &EffectKey) {
        self.retries.succeeded(key);
    }

    /// Keeps only the failures `wanted` says yes to (for effects not planned pass by pass).
    pub(crate) fn retain(&mut self, wanted: impl Fn(&EffectKey) -> bool) {
        self.retries.retain(|k| wanted(k));
    }

    /// Keys with a failure kept.
    pub(crate) fn failed_keys(&self) -> impl Iterator<Item = &EffectKey> {
        self.retries.keys()
    }

    /// Whether no failure is kept.
    pub(crate) fn no_failures(&self) -> bool {
        self.retries.is_empty()
    }

    /// The failure kept for `key`.
    pub(crate) fn failure(&self, key: &EffectKey) -> Option<&Record> {
        self.retries.get(key)
    }

    /// Lets every retry deadline pass now (tests step through retries without sleeping).
    #[cfg(test)]
    pub(crate) fn expire_for_test(&mut self) {
        self.retries.expire_for_test(Instant::now());
        self.done_before.clear();
        self.done_now.clear();
    }

    /// Keys with a failure kept.
    #[cfg(test)]
    pub(crate) fn failure_keys(&self) -> Vec<EffectKey> {
        self.retries.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(n: &str) -> EffectKey {
        EffectKey::Create(n.into())
    }

    #[test]
    fn a_failed_effect_waits_for_its_deadline_and_is_forgotten_when_no_longer_planned() {
        let mut e = Effects::default();
        e.begin_pass();
        assert!(e.due(&create("a")));
        e.record::<(), _>(&create("a"), &Err("refused"));
        assert!(!e.due(&create("a")), "waits for its deadline");
        assert!(e.next_due().is_some());
        e.end_pass();
        assert!(e.failure(&create("a")).is_some(), "kept while planned");
        e.begin_pass();
        e.end_pass();
        assert!(e.failure(&create("a")).is_none(), "no longer planned: forgotten");
        assert!(e.next_due().is_none());
    }

    #[test]
    fn a_success_is_not_repeated_until_the_watch_shows_it() {
        let mut e = Effects::default();
        e.begin_pass();
        assert!(e.due(&EffectKey::FlagMissing("a".into())));
        e.record::<(), &str>(&EffectKey::FlagMissing("a".into()), &Ok(()));
        e.begin_pass();
        assert!(!e.due(&EffectKey::FlagMissing("a".into())), "planned again before the watch showed the result");
        e.begin_pass();
        e.begin_pass();
        assert!(e.due(&EffectKey::FlagMissing("a".into())), "planned again later: a new occurrence");
    }

    #[test]
    fn a_condition_waited_out_with_its_own_policy_grows_and_is_forgotten_on_request() {
        let long = Policy { initial: Duration::from_secs(5), max: Duration::from_secs(20) };
        let mut e = Effects::default();
        e.begin_pass();
        e.wait_out_for(&EffectKey::Collision("a".into()), "taken", long);
        assert_eq!(e.failure(&EffectKey::Collision("a".into())).unwrap().delay, Duration::from_secs(5));
        assert!(!e.due(&EffectKey::Collision("a".into())), "waits");
        e.wait_out_for(&EffectKey::Collision("a".into()), "taken", long);
        assert_eq!(
            e.failure(&EffectKey::Collision("a".into())).unwrap().delay,
            Duration::from_secs(5),
            "not grown before its deadline"
        );
        for want in [10, 20, 20] {
            e.expire_for_test();
            e.wait_out_for(&EffectKey::Collision("a".into()), "taken", long);
            assert_eq!(e.failure(&EffectKey::Collision("a".into())).unwrap().delay, Duration::from_secs(want));
        }
        e.record::<(), &str>(&create("a"), &Ok(()));
        e.forget(&create("a"));
        e.forget(&EffectKey::Collision("a".into()));
        assert!(e.failure(&EffectKey::Collision("a".into())).is_none());
        assert!(e.due(&create("a")), "a forgotten success is not taken for a repeat");
    }
}
