//! Retry records: every failed effect (an API write, a wipe) is kept with its own deadline
//! until it succeeds, and the delay doubles with each failure up to a cap, spread by jitter so
//! many nodes that failed together do not retry together (kubelet's exponential-backoff rule).
//! The one rule of every retry of the process ([`Policy`], then [`with_jitter`]): the effects,
//! the wipes, the host executor's background retries, node-cleanup's fences, the heartbeat,
//! inotify, fence-node.
//! The loop sleeps until the earliest deadline, so a retry never waits for an unrelated event.
//! Time and randomness are passed in, so all of it is tested without sleeping.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Share of a delay added at random: a delay `d` becomes one in `[d, d * (1 + JITTER))`.
pub(crate) const JITTER: f64 = 0.2;

/// One growing delay, for a single thing retried in a loop (waiting for the Node).
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    policy: Policy,
    last: Option<Duration>,
}

impl Backoff {
    /// Starts at `initial` and doubles up to `max`.
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        Backoff { policy: Policy { initial, max }, last: None }
    }

    /// The delay before the next attempt, with jitter; `random` is in [0, 1).
    pub(crate) fn next_delay(&mut self, random: f64) -> Duration {
        let delay = self.policy.next(self.last);
        self.last = Some(delay);
        with_jitter(delay, random)
    }
}

/// `delay` stretched by up to [`JITTER`] of itself; `random` is in [0, 1).
pub(crate) fn with_jitter(delay: Duration, random: f64) -> Duration {
    delay.mul_f64(1.0 + JITTER * random.clamp(0.0, 1.0))
}

/// How delays grow for one kind of failure: the one rule every retry of the agent, the wiper,
/// node-cleanup and the host's executor follows (then stretched by [`with_jitter`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Policy {
    /// Delay after the first failure.
    pub initial: Duration,
    /// Largest delay.
    pub max: Duration,
}

impl Policy {
    /// The base delay (before jitter) after `last`, the one the failure before set (`None`:
    /// none did): `initial` first, then doubled, never above `max`.
    pub(crate) fn next(self, last: Option<Duration>) -> Duration {
        match last {
            None => self.initial.min(self.max),
            Some(last) => last.saturating_mul(2).min(self.max),
        }
    }

    /// The base delay after `failures` failures in a row (the first's, also for 0: `initial`):
    /// [`Self::next`] applied that many times, for a caller that counts failures instead of
    /// keeping the last delay. Stops once the delay no longer grows, so any count is cheap.
    pub(crate) fn after(self, failures: u32) -> Duration {
        let mut delay = self.next(None);
        for _ in 1..failures {
            let next = self.next(Some(delay));
            if next == delay {
                break;
            }
            delay = next;
        }
        delay
    }
}

/// A failure waiting for its retry.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Failures in a row.
    pub failures: u32,
    /// The delay the last failure set (before jitter): the next one doubles it.
    pub delay: Duration,
    /// When the effect may be tried again.
    pub due: Instant,
    /// Why it failed last, for logs and tests.
    pub error: String,
    /// What the effect was asked for with (for a wipe: the cleanup request and the identity
    /// confirmation); a new ask retries at once instead of waiting out the delay.
    pub asked: Option<String>,
}

/// Retry records by key (core::reconcile::effect_key::EffectKey in the agent and the wiper), kept until
/// the effect succeeds or is no longer wanted.
#[derive(Debug, Clone)]
pub(crate) struct Retries<K = String> {
    records: BTreeMap<K, Record>,
}

impl<K> Default for Retries<K> {
    fn default() -> Self {
        Retries { records: BTreeMap::new() }
    }
}

impl<K: Ord + Clone> Retries<K> {
    /// Whether the effect may be tried now: never failed, or its deadline has passed, or it is
    /// asked for anew (`asked` differs from what the failure was recorded with).
    pub(crate) fn may_try(&self, key: &K, now: Instant, asked: Option<&str>) -> bool {
        match self.records.get(key) {
            None => true,
            Some(r) => r.due <= now || r.asked.as_deref() != asked,
        }
    }

    /// Records a failure; returns when to try again. The delay doubles from the last failure's
    /// (`policy.initial` first) up to `policy.max`, then jitter is added; a new ask starts the
    /// delays over.
    pub(crate) fn failed(
        &mut self,
        key: &K,
        policy: Policy,
        error: impl Into<String>,
        asked: Option<&str>,
        now: Instant,
        random: f64,
    ) -> Instant {
        let previous = self.records.get(key).filter(|r| r.asked.as_deref() == asked);
        let delay = policy.next(previous.map(|r| r.delay));
        let failures = previous.map_or(1, |r| r.failures.saturating_add(1));
        let due = now + with_jitter(delay, random);
        let record = Record { failures, delay, due, error: error.into(), asked: asked.map(str::to_string) };
        self.records.insert(key.clone(), record);
        due
    }

    /// The effect succeeded: its record is dropped, so a later failure starts from the
    /// initial delay.
    pub(crate) fn succeeded(&mut self, key: &K) {
        self.records.remove(key);
    }

    /// Keeps only the records `wanted` still says yes to: an effect no pass asks for any more
    /// (its PV is gone, the problem was solved another way) needs no retry.
    pub(crate) fn retain(&mut self, mut wanted: impl FnMut(&K) -> bool) {
        self.records.retain(|k, _| wanted(k));
    }

    /// The earliest deadline still in the future, so the loop wakes for it.
    pub(crate) fn next_due(&self, now: Instant) -> Option<Instant> {
        self.records.values().map(|r| r.due).filter(|d| *d > now).min()
    }

    /// The record of `key`, if a failure is kept for it.
    pub(crate) fn get(&self, key: &K) -> Option<&Record> {
        self.records.get(key)
    }

    /// Keys with a record.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &K> {
        self.records.keys()
    }

    /// Lets every deadline pass now (tests step through retries without sleeping).
    #[cfg(test)]
    pub(crate) fn expire_for_test(&mut self, now: Instant) {
        for r in self.records.values_mut() {
            r.due = now;
        }
    }

    /// Records kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether no failure is kept.
    pub(crate) fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Policy = Policy { initial: Duration::from_secs(1), max: Duration::from_secs(30) };

    #[test]
    fn delays_double_up_to_the_cap_and_the_record_stays_until_success() {
        let mut r = Retries::<&str>::default();
        let t0 = Instant::now();
        let mut now = t0;
        let mut delays = Vec::new();
        for _ in 0..8 {
            assert!(r.may_try(&"create/a", now, None));
            let due = r.failed(&"create/a", P, "refused", None, now, 0.0);
            delays.push((due - now).as_secs());
            assert!(!r.may_try(&"create/a", now, None));
            assert!(r.get(&"create/a").is_some_and(|x| x.due > now), "waiting for its deadline");
            assert_eq!(r.next_due(now), Some(due));
            now = due;
        }
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(r.get(&"create/a").map(|x| x.failures), Some(8));
        r.succeeded(&"create/a");
        assert!(r.is_empty());
        let due = r.failed(&"create/a", P, "again", None, now, 0.0);
        assert_eq!(due - now, Duration::from_secs(1), "success starts the delays over");
    }

    #[test]
    fn jitter_stretches_by_at_most_its_share() {
        for i in 0..=100 {
            let random = f64::from(i) / 100.0;
            let d = with_jitter(Duration::from_secs(10), random);
            assert!(d >= Duration::from_secs(10) && d <= Duration::from_secs(12), "{d:?}");
        }
        assert_eq!(with_jitter(Duration::from_secs(10), 7.0), Duration::from_secs(12), "clamped");
        let mut r = Retries::<&str>::default();
        let now = Instant::now();
        let a = r.failed(&"a", P, "x", None, now, 0.0);
        let b = r.failed(&"b", P, "x", None, now, 0.99);
        assert!(b > a, "two keys that failed together retry apart");
    }

    #[test]
    fn keys_back_off_independently() {
        let mut r = Retries::<&str>::default();
        let now = Instant::now();
        r.failed(&"a", P, "x", None, now, 0.0);
        r.failed(&"a", P, "x", None, now, 0.0);
        let b = r.failed(&"b", P, "x", None, now, 0.0);
        assert_eq!(b - now, Duration::from_secs(1));
        assert!(r.may_try(&"c", now, None));
        assert_eq!(r.next_due(now), Some(b));
        assert_eq!(r.next_due(b), Some(now + Duration::from_secs(2)), "deadlines passed are not waited for");
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn a_new_ask_retries_at_once_and_starts_the_delays_over() {
        let mut r = Retries::<&str>::default();
        let now = Instant::now();
        let p = Policy { initial: Duration::from_secs(300), max: Duration::from_secs(1800) };
        r.failed(&"wipe/u", p, "immutable file", Some("req-1"), now, 0.0);
        r.failed(&"wipe/u", p, "immutable file", Some("req-1"), now, 0.0);
        assert!(!r.may_try(&"wipe/u", now, Some("req-1")));
        assert!(r.may_try(&"wipe/u", now, Some("req-2")), "a new cleanup request is acted on at once");
        let due = r.failed(&"wipe/u", p, "still immutable", Some("req-2"), now, 0.0);
        assert_eq!(due - now, Duration::from_secs(300));
        r.succeeded(&"wipe/u");
        assert!(r.may_try(&"wipe/u", now, Some("req-2")));
        assert!(r.get(&"wipe/u").is_none(), "the delays start over");
    }

    #[test]
    fn records_of_effects_no_longer_wanted_are_dropped() {
        let mut r = Retries::<&str>::default();
        let now = Instant::now();
        for k in ["create/a", "create/b", "wipe/c"] {
            r.failed(&k, P, "x", None, now, 0.5);
        }
        r.retain(|k| *k != "create/b");
        assert_eq!(r.keys().copied().collect::<Vec<_>>(), ["create/a", "wipe/c"]);
    }

    #[test]
    fn a_policy_doubles_from_its_first_delay_up_to_its_cap() {
        assert_eq!(P.next(None), Duration::from_secs(1));
        assert_eq!(P.next(Some(Duration::from_secs(4))), Duration::from_secs(8));
        assert_eq!(P.next(Some(Duration::from_secs(20))), Duration::from_secs(30), "capped");
        assert_eq!(P.next(Some(Duration::MAX)), Duration::from_secs(30), "no overflow");
        let above = Policy { initial: Duration::from_secs(90), max: Duration::from_secs(60) };
        assert_eq!(above.next(None), Duration::from_secs(60), "a first delay above the cap is capped too");
        let fixed = Policy { initial: Duration::from_secs(5), max: Duration::from_secs(5) };
        assert_eq!([None, Some(fixed.initial)].map(|l| fixed.next(l)), [Duration::from_secs(5); 2], "a fixed delay");
    }

    #[test]
    fn the_delay_after_n_failures_is_the_n_fold_next() {
        let secs = |p: Policy, n: u32| p.after(n).as_secs();
        assert_eq!((0..=8).map(|n| secs(P, n)).collect::<Vec<_>>(), [1, 1, 2, 4, 8, 16, 30, 30, 30]);
        let mut last = None;
        for n in 1..=40 {
            let next = P.next(last);
            assert_eq!(P.after(n), next, "after {n} failures");
            last = Some(next);
        }
        assert_eq!(P.after(u32::MAX), P.max, "any count, capped");
        let huge = Policy { initial: Duration::from_secs(1), max: Duration::MAX };
        assert_eq!(huge.after(u32::MAX), Duration::MAX, "saturates instead of overflowing");
        let zero = Policy { initial: Duration::ZERO, max: Duration::from_secs(1) };
        assert_eq!(zero.after(u32::MAX), Duration::ZERO, "nothing to double");
        let mut r = Retries::<&str>::default();
        let now = Instant::now();
        for n in 1..=8 {
            let due = r.failed(&"a", P, "x", None, now, 0.0);
            assert_eq!(due - now, P.after(n), "the retry records follow the same rule");
        }
    }

    #[test]
    fn a_single_backoff_grows_and_caps() {
        let mut b = Backoff::new(Duration::from_millis(500), Duration::from_secs(2));
        let d: Vec<Duration> = [0.0, 0.5, 0.99, 0.3].map(|r| b.next_delay(r)).to_vec();
        let base = [500, 1000, 2000, 2000].map(Duration::from_millis);
        for (d, base) in d.iter().zip(base) {
            assert!(*d >= base && *d <= base.mul_f64(1.0 + JITTER), "{d:?} for {base:?}");
        }
    }
}
