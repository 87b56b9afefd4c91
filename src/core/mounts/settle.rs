//! Settle windows: a new mount (or a vanished one) must stay that way for a short time before
//! the agent acts, so a disk that is still being prepared, or remounted, causes no churn.
//! Time is passed in, so this is tested without sleeping.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// Remembers since when each key has been seen.
#[derive(Debug, Default)]
pub(crate) struct Settler {
    since: BTreeMap<String, Instant>,
}

impl Settler {
    /// Records the keys seen now (forgetting the others) and returns those seen for at least
    /// `window`, with the earliest time another one settles.
    pub(crate) fn observe(
        &mut self,
        keys: impl IntoIterator<Item = String>,
        now: Instant,
        window: Duration,
    ) -> (BTreeSet<String>, Option<Instant>) {
        self.observe_since(keys, now, now, window)
    }

    /// [`Self::observe`] where keys not seen before count from `revealed` (the event that
    /// led to this observation, no later than `now`) instead of from `now`: the window runs
    /// from when the change happened, not from when a debounced pass got to it.
    pub(crate) fn observe_since(
        &mut self,
        keys: impl IntoIterator<Item = String>,
        revealed: Instant,
        now: Instant,
        window: Duration,
    ) -> (BTreeSet<String>, Option<Instant>) {
        let first_seen = revealed.min(now);
        let keys: BTreeSet<String> = keys.into_iter().collect();
        self.since.retain(|k, _| keys.contains(k));
        let mut settled = BTreeSet::new();
        let mut next: Option<Instant> = None;
        for key in keys {
            let since = *self.since.entry(key.clone()).or_insert(first_seen);
            let due = since + window;
            if due <= now {
                settled.insert(key);
            } else {
                next = Some(next.map_or(due, |n| n.min(due)));
            }
        }
        (settled, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_settle_after_the_window_and_reset_when_they_go() {
        let mut s = Settler::default();
        let t0 = Instant::now();
        let w = Duration::from_millis(500);
        let (settled, next) = s.observe(["a".to_string()], t0, w);
        assert!(settled.is_empty());
        assert_eq!(next, Some(t0 + w));
        let (settled, _) = s.observe(["a".to_string(), "b".to_string()], t0 + w, w);
        assert_eq!(settled, BTreeSet::from(["a".to_string()]));
        // "a" disappears for one observation: its clock starts again.
        let (settled, next) = s.observe(["b".to_string()], t0 + 2 * w, w);
        assert_eq!(settled, BTreeSet::from(["b".to_string()]));
        assert_eq!(next, None);
        let (settled, next) = s.observe(["a".to_string(), "b".to_string()], t0 + 2 * w, w);
        assert_eq!(settled, BTreeSet::from(["b".to_string()]));
        assert_eq!(next, Some(t0 + 3 * w));
    }

    #[test]
    fn zero_window_settles_at_once() {
        let mut s = Settler::default();
        let (settled, next) = s.observe(["a".to_string()], Instant::now(), Duration::ZERO);
        assert_eq!(settled.len(), 1);
        assert_eq!(next, None);
    }
    #[test]
    fn new_keys_count_from_the_revealing_event_known_ones_keep_their_time() {
        let mut s = Settler::default();
        let t0 = Instant::now();
        let w = Duration::from_millis(200);
        let pass = t0 + Duration::from_millis(100);
        let (settled, next) = s.observe_since(["a".to_string()], t0, pass, w);
        assert!(settled.is_empty());
        assert_eq!(next, Some(t0 + w), "due 200 ms after the event, not after the pass");
        // A later event does not move a key already seen.
        let (settled, next) = s.observe_since(["a".to_string(), "b".to_string()], t0 + w, t0 + w, w);
        assert_eq!(settled, BTreeSet::from(["a".to_string()]));
        assert_eq!(next, Some(t0 + 2 * w));
        // An event "after now" cannot make a key older than now.
        let mut s = Settler::default();
        let (_, next) = s.observe_since(["c".to_string()], t0 + w, t0, w);
        assert_eq!(next, Some(t0 + w));
    }
}
