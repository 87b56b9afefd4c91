//! Leader election decisions over a coordination.k8s.io Lease, with client-go's rules: a lease
//! is free when nobody holds it, or when its record has not changed for its whole duration as
//! measured on *our* clock (so clock skew between machines does not matter). Pure; the API
//! calls are in `api::lease`.

use std::time::Duration;

/// The parts of a Lease that decide who leads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseRecord {
    /// `spec.holderIdentity`; empty or absent means released.
    pub holder: Option<String>,
    /// `spec.leaseDurationSeconds` as the holder wrote it.
    pub duration: Option<Duration>,
    /// `spec.renewTime` as written (compared for change only, never with our clock).
    pub renew_time: Option<String>,
    /// `spec.leaseTransitions`.
    pub transitions: i32,
}

/// What a candidate does after reading the Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LeaseDecision {
    /// We hold it: write a new renewTime.
    Renew,
    /// It is free or expired: take it (one more transition).
    Acquire,
    /// Someone else holds it and has renewed within its duration.
    Follow { holder: String },
}

/// Decides, given the record now read, for how long that same record has been observed
/// unchanged on our clock, and our own lease duration (used when the record has none).
pub(crate) fn decide(
    record: &LeaseRecord,
    me: &str,
    unchanged_for: Duration,
    default_duration: Duration,
) -> LeaseDecision {
    match record.holder.as_deref() {
        Some(h) if h == me => LeaseDecision::Renew,
        None | Some("") => LeaseDecision::Acquire,
        Some(holder) => {
            if expired(record, unchanged_for, default_duration) {
                LeaseDecision::Acquire
            } else {
                LeaseDecision::Follow { holder: holder.to_string() }
            }
        }
    }
}

/// The one rule for whether a Lease's holder has stopped renewing it: nobody holds it, or its
/// record has stayed unchanged on *our* clock for its whole duration (its own
/// `leaseDurationSeconds`, `default_duration` when it wrote none). Used by the leader election
/// (above) and by node-cleanup for the agents' heartbeats (core::cluster::heartbeat).
pub(crate) fn expired(record: &LeaseRecord, unchanged_for: Duration, default_duration: Duration) -> bool {
    match record.holder.as_deref() {
        None | Some("") => true,
        Some(_) => unchanged_for >= record.duration.filter(|d| !d.is_zero()).unwrap_or(default_duration),
    }
}

/// How long a Lease may still go unrenewed before it counts as expired, on our clock; zero
/// once it has (None: nobody holds it).
pub(crate) fn remaining(record: &LeaseRecord, unchanged_for: Duration, default_duration: Duration) -> Option<Duration> {
    match record.holder.as_deref() {
        None | Some("") => None,
        Some(_) => {
            Some(record.duration.filter(|d| !d.is_zero()).unwrap_or(default_duration).saturating_sub(unchanged_for))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(15);

    fn held_by(h: &str) -> LeaseRecord {
        LeaseRecord { holder: Some(h.into()), duration: Some(D), renew_time: Some("t".into()), transitions: 3 }
    }

    #[test]
    fn holder_renews_even_when_old() {
        assert_eq!(decide(&held_by("me"), "me", Duration::from_secs(3600), D), LeaseDecision::Renew);
    }

    #[test]
    fn free_lease_is_acquired() {
        assert_eq!(decide(&LeaseRecord::default(), "me", Duration::ZERO, D), LeaseDecision::Acquire);
        let released = LeaseRecord { holder: Some(String::new()), ..held_by("x") };
        assert_eq!(decide(&released, "me", Duration::ZERO, D), LeaseDecision::Acquire);
    }

    #[test]
    fn live_holder_is_followed_until_its_record_stops_changing_for_its_duration() {
        let other = held_by("other");
        assert_eq!(decide(&other, "me", Duration::from_secs(14), D), LeaseDecision::Follow { holder: "other".into() });
        assert_eq!(decide(&other, "me", Duration::from_secs(15), D), LeaseDecision::Acquire);
        // The holder's own duration counts, not ours.
        let long = LeaseRecord { duration: Some(Duration::from_secs(60)), ..other.clone() };
        assert_eq!(decide(&long, "me", Duration::from_secs(30), D), LeaseDecision::Follow { holder: "other".into() });
        // No duration written: ours applies.
        let none = LeaseRecord { duration: None, ..other };
        assert_eq!(decide(&none, "me", Duration::from_secs(15), D), LeaseDecision::Acquire);
    }
}
