//! Leader election for node-cleanup: one replica acts, the others wait. A background task
//! keeps trying to take or renew the Lease; the actor asks `is_leader()` right before every
//! deletion, and leadership counts only until `renew_deadline` after the last renewal that
//! went through, which is shorter than the time another replica must wait before taking over.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::api::Cluster;
use crate::api::lease::{ReadLease, Written};
use crate::core::lease::{LeaseDecision, decide};

/// Timing and names of the Lease.
#[derive(Debug, Clone)]
pub struct LeaseOptions {
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
pub struct Leadership {
    state: Arc<Mutex<State>>,
}

impl Leadership {
    /// Whether this replica may act now.
    pub fn is_leader(&self) -> bool {
        self.state.lock().ok().and_then(|s| s.valid_until).is_some_and(|until| Instant::now() < until)
    }
}

/// Runs the election in a background task; returns the shared view and a handle whose
/// `release` gives the lease up on shutdown so another replica takes over at once.
pub fn spawn(cluster: Cluster, opts: LeaseOptions, on_change: impl Fn(bool) + Send + 'static) -> Elector {
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
pub struct Elector {
    /// Shared view of leadership.
    pub leadership: Leadership,
    task: tokio::task::JoinHandle<()>,
    cluster: Cluster,
    opts: LeaseOptions,
}

impl Elector {
    /// Stops trying and, if we hold the lease, releases it.
    pub async fn release(self) {
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
