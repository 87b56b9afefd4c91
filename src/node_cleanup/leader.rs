//! Leader election for node-cleanup: one replica acts, the others wait. A background task
//! keeps trying to take or renew the Lease. Leadership counts only until `renew_deadline` after
//! the start of the last renewal that went through; another replica takes over only after
//! `lease_duration` without a renewal. Every write of node-cleanup is fenced on
//! `is_leader_for(request_deadline)` (see `api::Cluster::with_fence`), so it finishes or is
//! abandoned before leadership ends, with the rest of that gap as a margin.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::api::Cluster;
use crate::api::lease::{ReadLease, Written};
use crate::core::cluster::lease::{LeaseDecision, decide};

/// The longest deadline a fenced request gets, however long the gap.
pub(crate) const MAX_REQUEST_DEADLINE: Duration = Duration::from_secs(10);
/// The smallest gap between renew deadline and lease duration accepted.
pub(crate) const MIN_TAKEOVER_GAP: Duration = Duration::from_secs(1);

/// Lease timings that would let two replicas act at once, or never let one act.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum LeaseTimingError {
    /// The leader would act longer than the lease protects it.
    #[error(
        "--renew-deadline ({renew:?}) must be shorter than --lease-duration ({lease:?}), or two replicas could act at once"
    )]
    RenewNotShorter { renew: Duration, lease: Duration },
    /// No room for a request's deadline between the end of leadership and a takeover.
    #[error(
        "--lease-duration ({lease:?}) must exceed --renew-deadline ({renew:?}) by at least 1s: half of that gap (at most 10s) is the deadline of every write"
    )]
    GapTooSmall { renew: Duration, lease: Duration },
    /// Leadership would lapse between renewals.
    #[error(
        "--retry-period ({retry:?}) must be shorter than --renew-deadline ({renew:?}), or leadership lapses between renewals"
    )]
    RetryNotShorter { retry: Duration, renew: Duration },
    /// Right before a renewal, less leadership is left than a write's deadline: writes refused.
    #[error(
        "--renew-deadline ({renew:?}) must exceed --retry-period ({retry:?}) by more than the write deadline ({deadline:?}, half of --lease-duration minus --renew-deadline), or the leader refuses its own writes between renewals"
    )]
    NoRoomForRequests { renew: Duration, retry: Duration, deadline: Duration },
}

/// Timing and names of the Lease.
#[derive(Debug, Clone)]
pub(crate) struct LeaseOptions {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's identity (its pod name).
    pub identity: String,
    /// How long a lease holds without renewal before others may take it.
    pub lease_duration: Duration,
    /// How long after its last successful renewal the leader still acts.
    pub renew_deadline: Duration,
    /// How often candidates try and the leader renews.
    pub retry_period: Duration,
}

impl LeaseOptions {
    /// The deadline of every fenced write: half the gap between the end of our leadership
    /// (`renew_deadline` after a renewal began) and the earliest takeover (`lease_duration`
    /// unrenewed), at most 10 s. The other half is a margin for what the fence cannot see.
    pub(crate) fn request_deadline(&self) -> Duration {
        (self.lease_duration.saturating_sub(self.renew_deadline) / 2).min(MAX_REQUEST_DEADLINE)
    }

    /// Checks that the timings keep two replicas from acting at once and leave room to act.
    pub(crate) fn validate(&self) -> Result<(), LeaseTimingError> {
        let (lease, renew, retry) = (self.lease_duration, self.renew_deadline, self.retry_period);
        if renew >= lease {
            return Err(LeaseTimingError::RenewNotShorter { renew, lease });
        }
        if lease - renew < MIN_TAKEOVER_GAP {
            return Err(LeaseTimingError::GapTooSmall { renew, lease });
        }
        if retry >= renew {
            return Err(LeaseTimingError::RetryNotShorter { retry, renew });
        }
        let deadline = self.request_deadline();
        if renew - retry <= deadline {
            return Err(LeaseTimingError::NoRoomForRequests { renew, retry, deadline });
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
struct State {
    /// Leadership is valid until then.
    valid_until: Option<Instant>,
    /// The last record read, and since when (our clock) it has been unchanged.
    observed: Option<(String, Instant)>,
    /// The holder last reported, so changes are logged once.
    last_holder: Option<String>,
}

/// Shared view of whether this replica leads.
#[derive(Clone)]
pub(crate) struct Leadership {
    state: Arc<Mutex<State>>,
}

impl Leadership {
    /// Whether this replica may act now.
    pub(crate) fn is_leader(&self) -> bool {
        self.is_leader_for(Duration::ZERO)
    }

    /// Whether this replica leads now and still will `d` from now: a request given `d` to
    /// finish then ends before any other replica can take over.
    pub(crate) fn is_leader_for(&self, d: Duration) -> bool {
        let until = self.state.lock().ok().and_then(|s| s.valid_until);
        until.is_some_and(|until| Instant::now().checked_add(d).is_some_and(|end| end < until))
    }
}

/// Runs the election in a background task; returns the shared view and a handle whose
/// `release` gives the lease up on shutdown so another replica takes over at once.
pub(crate) fn spawn(cluster: Cluster, opts: LeaseOptions, on_change: impl Fn(bool) + Send + 'static) -> Elector {
    let leadership = Leadership { state: Arc::new(Mutex::new(State::default())) };
    let task = {
        let leadership = leadership.clone();
        let cluster = cluster.clone();
        let opts = opts.clone();
        tokio::spawn(async move {
            let mut was_leader = false;
            loop {
                try_once(&cluster, &opts, &leadership).await;
                let leads = leadership.is_leader();
                if leads != was_leader {
                    on_change(leads);
                    was_leader = leads;
                }
                tokio::time::sleep(opts.retry_period).await;
            }
        })
    };
    Elector { leadership, task, cluster, opts }
}

/// The running election.
pub(crate) struct Elector {
    /// Shared view of leadership.
    pub leadership: Leadership,
    task: tokio::task::JoinHandle<()>,
    cluster: Cluster,
    opts: LeaseOptions,
}

impl Elector {
    /// Stops trying and, if we hold the lease, releases it.
    pub(crate) async fn release(self) {
        self.task.abort();
        let held = self.leadership.is_leader();
        if let Ok(mut s) = self.leadership.state.lock() {
            s.valid_until = None;
        }
        if !held {
            return;
        }
        let o = &self.opts;
        match self.cluster.read_lease(&o.namespace, &o.name).await {
            Ok(Some(current)) if current.record.holder.as_deref() == Some(o.identity.as_str()) => {
                match self
                    .cluster
                    .write_lease(&o.namespace, &o.name, Some(&current), "", Duration::from_secs(1), false)
                    .await
                {
                    Ok(_) => info!(lease = %o.name, "leadership released"),
                    Err(e) => warn!(lease = %o.name, error = %e, "releasing the lease failed; it expires by itself"),
                }
            }
            Ok(_) => {}
            Err(e) => warn!(lease = %o.name, error = %e, "reading the lease to release it failed"),
        }
    }
}

async fn try_once(cluster: &Cluster, o: &LeaseOptions, leadership: &Leadership) {
    let started = Instant::now();
    let current = match cluster.read_lease(&o.namespace, &o.name).await {
        Ok(c) => c,
        Err(e) => return warn!(lease = %o.name, error = %e, "reading the leader lease failed"),
    };
    let decision = match &current {
        None => LeaseDecision::Acquire,
        Some(ReadLease { record, object }) => {
            let key = format!("{:?}/{:?}/{:?}", record.holder, record.renew_time, object.metadata.resource_version);
            let unchanged_for = {
                let Ok(mut s) = leadership.state.lock() else { return };
                match &s.observed {
                    Some((k, since)) if *k == key => since.elapsed(),
                    _ => {
                        s.observed = Some((key, Instant::now()));
                        Duration::ZERO
                    }
                }
            };
            decide(record, &o.identity, unchanged_for, o.lease_duration)
        }
    };
    let acquire = match decision {
        LeaseDecision::Follow { holder } => {
            if let Ok(mut s) = leadership.state.lock() {
                s.valid_until = None;
                if s.last_holder.as_deref() != Some(holder.as_str()) {
                    info!(lease = %o.name, leader = %holder, "another replica leads; waiting");
                    s.last_holder = Some(holder);
                }
            }
            return;
        }
        LeaseDecision::Renew => false,
        LeaseDecision::Acquire => true,
    };
    match cluster.write_lease(&o.namespace, &o.name, current.as_ref(), &o.identity, o.lease_duration, acquire).await {
        Ok(Written::Done) => {
            if let Ok(mut s) = leadership.state.lock() {
                // Counted from before the read: a slow request shortens leadership, never extends it.
                s.valid_until = Some(started + o.renew_deadline);
                if s.last_holder.as_deref() != Some(o.identity.as_str()) {
                    info!(lease = %o.name, identity = %o.identity, "leadership acquired");
                    s.last_holder = Some(o.identity.clone());
                }
            }
        }
        Ok(Written::Lost) => {
            if let Ok(mut s) = leadership.state.lock() {
                s.valid_until = None;
            }
        }
        Err(e) => warn!(lease = %o.name, error = %e, "writing the leader lease failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(lease: u64, renew: u64, retry_ms: u64) -> LeaseOptions {
        LeaseOptions {
            namespace: "ns".into(),
            name: "lease".into(),
            identity: "me".into(),
            lease_duration: Duration::from_secs(lease),
            renew_deadline: Duration::from_secs(renew),
            retry_period: Duration::from_millis(retry_ms),
        }
    }

    fn leading_until(until: Option<Instant>) -> Leadership {
        Leadership { state: Arc::new(Mutex::new(State { valid_until: until, ..State::default() })) }
    }

    #[test]
    fn request_deadline_is_half_the_takeover_gap_at_most_ten_seconds() {
        assert_eq!(timing(15, 10, 2000).request_deadline(), Duration::from_millis(2500));
        assert_eq!(timing(4, 2, 500).request_deadline(), Duration::from_secs(1));
        assert_eq!(timing(120, 30, 2000).request_deadline(), MAX_REQUEST_DEADLINE);
        assert_eq!(timing(10, 10, 2000).request_deadline(), Duration::ZERO);
    }

    #[test]
    fn timings_that_could_overlap_or_starve_writes_are_refused() {
        assert_eq!(timing(15, 10, 2000).validate(), Ok(()));
        assert_eq!(timing(4, 3, 500).validate(), Ok(()));
        assert_eq!(timing(6, 4, 500).validate(), Ok(()));
        assert!(matches!(timing(10, 10, 2000).validate(), Err(LeaseTimingError::RenewNotShorter { .. })));
        let tight = LeaseOptions { lease_duration: Duration::from_millis(10_500), ..timing(0, 10, 2000) };
        assert!(matches!(tight.validate(), Err(LeaseTimingError::GapTooSmall { .. })));
        assert!(matches!(timing(15, 2, 2000).validate(), Err(LeaseTimingError::RetryNotShorter { .. })));
        // 28 s gap: 10 s deadline, but only 2 s of leadership are left before each renewal.
        assert!(matches!(timing(32, 4, 2000).validate(), Err(LeaseTimingError::NoRoomForRequests { .. })));
        let message = timing(10, 10, 2000).validate().unwrap_err().to_string();
        assert!(message.contains("--renew-deadline") && message.contains("--lease-duration"), "{message}");
    }

    #[test]
    fn leadership_counts_only_while_it_lasts_the_whole_request() {
        let now = Instant::now();
        let leader = leading_until(Some(now + Duration::from_secs(2)));
        assert!(leader.is_leader());
        assert!(leader.is_leader_for(Duration::from_secs(1)));
        assert!(!leader.is_leader_for(Duration::from_secs(3)));
        assert!(!leading_until(None).is_leader_for(Duration::ZERO));
        assert!(!leading_until(Some(now)).is_leader());
        assert!(!leader.is_leader_for(Duration::MAX));
    }
}
