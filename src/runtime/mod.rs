//! Runtime helpers shared by the agent and node-cleanup loops: watch-event forwarding, optional
//! deadlines in `select!`, shutdown signals and resync jitter. Kept apart so neither loop
//! imports the other. `effects` is the retry bookkeeping the agent and the wiper share.

pub(crate) mod effects;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Notify;
use tracing::{trace, warn};

/// Polls a watch stream in the background (it must be polled to keep its store fresh) and
/// wakes the loop waiting on `changed` for every change; errors are retried by the watcher.
pub(crate) fn forward_events(
    what: &'static str,
    events: impl futures::Stream<Item = Result<(), kube::runtime::watcher::Error>> + Send + 'static,
    changed: Arc<Notify>,
) {
    forward_events_until_synced(what, events, changed, None);
}

/// [`forward_events`] that also says, in `readiness`, why the watch has not synced yet
/// ("forbidden" when the RBAC is missing), until its first event.
pub(crate) fn forward_events_until_synced(
    what: &'static str,
    events: impl futures::Stream<Item = Result<(), kube::runtime::watcher::Error>> + Send + 'static,
    changed: Arc<Notify>,
    readiness: Option<crate::admin::Readiness>,
) {
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        let mut starting = readiness;
        let mut last_error = String::new();
        while let Some(ev) = events.next().await {
            match ev {
                Ok(()) => {
                    starting = None;
                    // Counted by bench/scale-foreign.sh: one line per event received.
                    trace!("{what} watch event");
                    changed.notify_one()
                }
                Err(e) => {
                    // The whole cause chain: kube's message alone stops at "client error (Connect)".
                    let error = crate::api::error_chain(&e);
                    // Once per distinct error in a row: a watch retrying a refusal every few
                    // seconds does not flood the log.
                    if error != last_error {
                        warn!(watch = what, error = %error, "watch error; retrying with backoff");
                    }
                    if let Some(readiness) = &starting {
                        readiness.set(Some(format!("starting: the {what} watch fails: {error}")));
                    }
                    last_error = error;
                }
            }
        }
    });
}

/// When the latest change event was relayed to the loop: a new volume's settle window starts
/// there (see core::mounts::settle), not at the debounced pass that found it.
#[derive(Debug, Default)]
pub(crate) struct EventClock {
    latest: std::sync::Mutex<Option<std::time::Instant>>,
}

impl EventClock {
    /// Relays every notification of `raw` to `out`, noting when it was received. A
    /// notification is noted no earlier than it happened, so a window started there is never
    /// longer than the change has lasted.
    pub(crate) fn relay(self: &Arc<Self>, raw: Arc<Notify>, out: Arc<Notify>) {
        let clock = self.clone();
        tokio::spawn(async move {
            loop {
                raw.notified().await;
                if let Ok(mut latest) = clock.latest.lock() {
                    *latest = Some(std::time::Instant::now());
                }
                out.notify_one();
            }
        });
    }

    /// The latest event relayed, if any.
    pub(crate) fn latest(&self) -> Option<std::time::Instant> {
        self.latest.lock().ok().and_then(|l| *l)
    }
}

/// How long the loop lets a burst of change events gather into one pass.
pub(crate) const DEBOUNCE: Duration = Duration::from_millis(100);

/// When a pass woken by an event at `now` runs: after the debounce, or at the loop's next
/// deadline (a volume settling, a retry) when that comes first, so a change event never
/// delays what was already due.
pub(crate) fn debounced(now: tokio::time::Instant, deadline: Option<tokio::time::Instant>) -> tokio::time::Instant {
    let gathered = now + DEBOUNCE;
    deadline.map_or(gathered, |at| at.min(gathered))
}

/// Sleeps until `at`, or for ever when there is no deadline (a `select!` arm that never fires).
pub(crate) async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// SIGTERM and SIGINT, registered when this is made: a signal that arrives while the process is
/// still starting (waiting for its Node, say) is not lost and stops it at once.
pub(crate) struct Shutdown {
    term: Option<tokio::signal::unix::Signal>,
    int: Option<tokio::signal::unix::Signal>,
}

impl Shutdown {
    /// Registers the handlers now. Without them the process still runs; it just cannot stop
    /// gracefully, which is logged.
    pub(crate) fn install() -> Self {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate()).inspect_err(|e| warn!(error = %e, "no SIGTERM handler")).ok();
        let int = signal(SignalKind::interrupt()).inspect_err(|e| warn!(error = %e, "no SIGINT handler")).ok();
        Shutdown { term, int }
    }

    /// Resolves on the next SIGTERM or SIGINT.
    pub(crate) async fn signalled(&mut self) {
        async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            _ = recv(&mut self.term) => {}
            _ = recv(&mut self.int) => {}
        }
    }
}

/// Upstream's resync spread: a random time in [period, 2*period) so nodes do not resync in
/// step; exactly `period` when the operator set it explicitly.
pub(crate) fn jittered(period: Duration, jitter: bool) -> Duration {
    if !jitter {
        return period;
    }
    period + period.mul_f64(random_fraction())
}

/// A random number in [0, 1) for jitter: nothing beyond "not in step with other nodes" is
/// needed (fastrand, seeded per thread from the OS).
pub(crate) fn random_fraction() -> f64 {
    fastrand::f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_waits_out_the_debounce_unless_a_deadline_comes_first() {
        let now = tokio::time::Instant::now();
        let ms = Duration::from_millis;
        let cases = [
            (None, now + DEBOUNCE),
            (Some(now + ms(500)), now + DEBOUNCE),
            (Some(now + DEBOUNCE), now + DEBOUNCE),
            (Some(now + ms(30)), now + ms(30)),
            (Some(now), now),
        ];
        for (deadline, expected) in cases {
            assert_eq!(debounced(now, deadline), expected, "deadline {deadline:?}");
        }
        // A deadline already past: the pass runs at once.
        let later = now + ms(40);
        assert_eq!(debounced(later, Some(now)), now);
    }
}
