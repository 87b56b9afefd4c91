//! The agents' heartbeat: every agent renews a coordination.k8s.io Lease named after its node
//! (`local-static-provisioner-agent-<node>`, holder the node's name) every
//! [`HEARTBEAT_RENEW`], with a duration of [`HEARTBEAT_DURATION`], like kubelet's node lease.
//! node-cleanup watches those Leases and fences the node (the node-wide label
//! `local-static-provisioner.io/volumes-unverified=agent-gone`) whose agent stopped renewing
//! it: an agent killed without SIGTERM (SIGKILL, OOM, a crash) sets no fence itself, and while
//! kubelet keeps running nothing else would until the next agent starts. The running agent
//! that merely missed renewals lifts the label after its next pass, as it lifts any value.
//!
//! Whether a Lease lapsed is the one rule of core::cluster::lease ([`expired`]): its record unchanged
//! for its whole duration on node-cleanup's own clock, so clock skew between the node and
//! node-cleanup does not matter. The cost of that: a Lease first seen by node-cleanup (at its
//! start, or after its watch re-listed) counts from then. Pure; node_cleanup feeds it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::core::cluster::lease::{LeaseRecord, expired, remaining};

/// Prefix of an agent's heartbeat Lease name; the rest is its node's name.
pub(crate) const HEARTBEAT_PREFIX: &str = "local-static-provisioner-agent-";
/// How long an agent's heartbeat holds without renewal (kubelet's node lease: 40 s).
pub(crate) const HEARTBEAT_DURATION: Duration = Duration::from_secs(40);
/// How often the agent renews it (kubelet's node lease: a quarter of its duration).
pub(crate) const HEARTBEAT_RENEW: Duration = Duration::from_secs(10);
/// The node-wide fence's value node-cleanup sets (the same window the boot hook names so:
/// no agent has checked the disks since the last one went).
pub(crate) const AGENT_GONE: &str = "agent-gone";

/// The heartbeat Lease of `node`; None when the name would be longer than an object name may
/// be (253 characters; node names are DNS subdomains, so every other character is valid).
pub(crate) fn heartbeat_lease_name(node: &str) -> Option<String> {
    let name = format!("{HEARTBEAT_PREFIX}{node}");
    (!node.is_empty() && name.len() <= 253).then_some(name)
}

/// The node whose heartbeat a Lease named `name` is; None for other Leases (node-cleanup's
/// leader Lease shares the namespace).
pub(crate) fn node_of_heartbeat(name: &str) -> Option<&str> {
    name.strip_prefix(HEARTBEAT_PREFIX).filter(|n| !n.is_empty())
}

/// Since when each heartbeat Lease's record has been seen unchanged, on our clock.
#[derive(Debug, Default)]
pub(crate) struct LeaseClock {
    seen: BTreeMap<String, (LeaseRecord, Instant)>,
}

impl LeaseClock {
    /// Records a Lease as the watch sees it now: its clock restarts when its record changed
    /// (a renewal), and starts when it was not known. True when the fence check must wake to
    /// take up its deadline: the Lease is new, or it had lapsed and is renewed again (a lapsed
    /// Lease has no deadline the check waits for).
    pub(crate) fn observe(&mut self, name: &str, record: LeaseRecord, now: Instant) -> bool {
        match self.seen.get(name) {
            Some((old, _)) if *old == record => false,
            Some((old, since)) => {
                let revived = expired(old, now.saturating_duration_since(*since), HEARTBEAT_DURATION);
                self.seen.insert(name.to_string(), (record, now));
                revived
            }
            None => {
                self.seen.insert(name.to_string(), (record, now));
                true
            }
        }
    }

    /// Forgets a deleted Lease.
    pub(crate) fn forget(&mut self, name: &str) {
        self.seen.remove(name);
    }

    /// Forgets every Lease not in `names` (after a re-list).
    pub(crate) fn retain(&mut self, names: &std::collections::BTreeSet<String>) {
        self.seen.retain(|k, _| names.contains(k));
    }

    /// Each Lease's record and for how long it has been unchanged at `now`.
    pub(crate) fn unchanged(&self, now: Instant) -> BTreeMap<String, (LeaseRecord, Duration)> {
        self.seen
            .iter()
            .map(|(name, (record, since))| (name.clone(), (record.clone(), now.saturating_duration_since(*since))))
            .collect()
    }
}

/// What node-cleanup does about one node's heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HeartbeatVerdict {
    /// Set the node-wide fence to [`AGENT_GONE`]: the agent's Lease lapsed and nothing fences
    /// the node.
    Fence,
    /// Look again after this long: the Lease lapses then unless it is renewed.
    WaitFor(Duration),
    /// Nothing, and no deadline to wake for.
    Nothing,
}

/// Decides for one node: `node` is its Node as watched (None: it does not exist; Some(v):
/// the value of its volumes-unverified label, v None when it carries none), `lease` its
/// agent's heartbeat record with how long it has been unchanged on our clock (None: no
/// heartbeat Lease, a node without an agent or an agent older than the heartbeat).
pub(crate) fn heartbeat_verdict(
    node: Option<Option<&str>>,
    lease: Option<(&LeaseRecord, Duration)>,
) -> HeartbeatVerdict {
    let Some(label) = node else {
        // A gone Node has no pods to protect (the grace period of node-cleanup handles its PVs).
        return HeartbeatVerdict::Nothing;
    };
    let Some((record, unchanged_for)) = lease else {
        return HeartbeatVerdict::Nothing;
    };
    if !expired(record, unchanged_for, HEARTBEAT_DURATION) {
        // Live: wake when it would lapse, fenced or not (the agent may lift the label meanwhile
        // and die right after).
        return match remaining(record, unchanged_for, HEARTBEAT_DURATION) {
            Some(left) if !left.is_zero() => HeartbeatVerdict::WaitFor(left),
            _ => HeartbeatVerdict::Nothing,
        };
    }
    match label {
        // Any value fences (node-booted, agent-stopped, ...): the agent lifts it after a pass.
        Some(_) => HeartbeatVerdict::Nothing,
        None => HeartbeatVerdict::Fence,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: Option<&str>, duration: Option<u64>) -> LeaseRecord {
        LeaseRecord {
            holder: holder.map(str::to_string),
            duration: duration.map(Duration::from_secs),
            renew_time: Some("2026-11-29T02:00:00.000000Z".into()),
            transitions: 0,
        }
    }

    /// Every combination of the Node (gone, unlabelled, labelled with each value seen), the
    /// Lease (absent, held and live, held and lapsed at exactly its duration and after, with its
    /// own duration or the default, released) and what must come out.
    #[test]
    fn verdict_table() {
        let s = Duration::from_secs;
        let held = record(Some("n1"), Some(40));
        let long = record(Some("n1"), Some(120));
        let no_duration = record(Some("n1"), None);
        let zero_duration = record(Some("n1"), Some(0));
        let released = record(Some(""), Some(40));
        let nobody = record(None, Some(40));
        type Row<'a> = (&'a str, Option<(&'a LeaseRecord, Duration)>, Option<Duration>);
        let leases: Vec<Row> = vec![
            // (name, lease, Some(left) when live)
            ("absent", None, None),
            ("fresh", Some((&held, s(0))), Some(s(40))),
            ("live", Some((&held, s(39))), Some(s(1))),
            ("lapsed exactly", Some((&held, s(40))), None),
            ("lapsed long ago", Some((&held, s(3600))), None),
            ("own longer duration, live", Some((&long, s(100))), Some(s(20))),
            ("own longer duration, lapsed", Some((&long, s(120))), None),
            ("no duration: the default, live", Some((&no_duration, s(39))), Some(s(1))),
            ("no duration: the default, lapsed", Some((&no_duration, s(40))), None),
            ("zero duration: the default", Some((&zero_duration, s(39))), Some(s(1))),
            ("released", Some((&released, s(0))), None),
            ("nobody holds it", Some((&nobody, s(0))), None),
        ];
        let nodes: Vec<(&str, Option<Option<&str>>)> = vec![
            ("gone", None),
            ("unlabelled", Some(None)),
            ("agent-stopped", Some(Some("agent-stopped"))),
            ("agent-gone", Some(Some("agent-gone"))),
            ("node-booted", Some(Some("node-booted"))),
            ("kubelet-restarted", Some(Some("kubelet-restarted"))),
            ("empty value", Some(Some(""))),
        ];
        for (lease_name, lease, live_left) in &leases {
            for (node_name, node) in &nodes {
                let want = match (node, lease, live_left) {
                    (None, _, _) | (_, None, _) => HeartbeatVerdict::Nothing,
                    (Some(_), Some(_), Some(left)) => HeartbeatVerdict::WaitFor(*left),
                    (Some(None), Some(_), None) => HeartbeatVerdict::Fence,
                    (Some(Some(_)), Some(_), None) => HeartbeatVerdict::Nothing,
                };
                assert_eq!(heartbeat_verdict(*node, *lease), want, "node {node_name}, lease {lease_name}");
            }
        }
    }

    #[test]
    fn lease_names_round_trip_and_others_are_not_heartbeats() {
        assert_eq!(heartbeat_lease_name("n1").as_deref(), Some("local-static-provisioner-agent-n1"));
        assert_eq!(node_of_heartbeat("local-static-provisioner-agent-n1"), Some("n1"));
        assert_eq!(node_of_heartbeat("local-static-provisioner-node-cleanup"), None);
        assert_eq!(node_of_heartbeat(HEARTBEAT_PREFIX), None);
        assert_eq!(heartbeat_lease_name(""), None);
        let longest = "a".repeat(253 - HEARTBEAT_PREFIX.len());
        assert_eq!(heartbeat_lease_name(&longest).map(|n| n.len()), Some(253));
        assert_eq!(heartbeat_lease_name(&format!("{longest}a")), None);
    }

    #[test]
    fn the_clock_restarts_at_each_renewal_and_only_then() {
        let t0 = Instant::now();
        let mut clock = LeaseClock::default();
        let mut r = record(Some("n1"), Some(40));
        assert!(clock.observe("l", r.clone(), t0), "a new Lease wakes the check");
        // The same record seen again (a re-list, an unrelated update) does not restart it.
        assert!(!clock.observe("l", r.clone(), t0 + Duration::from_secs(30)));
        assert_eq!(clock.unchanged(t0 + Duration::from_secs(41))["l"].1, Duration::from_secs(41));
        // A renewal of a live Lease wakes nothing.
        r.renew_time = Some("live".into());
        assert!(!clock.observe("l", r.clone(), t0 + Duration::from_secs(39)));
        // A renewal after it lapsed wakes the check (its deadline is new again).
        r.renew_time = Some("later".into());
        assert!(clock.observe("l", r.clone(), t0 + Duration::from_secs(39 + 40)));
        assert_eq!(clock.unchanged(t0 + Duration::from_secs(39 + 45))["l"].1, Duration::from_secs(5));
        clock.retain(&std::collections::BTreeSet::new());
        assert!(clock.unchanged(t0).is_empty());
        assert!(clock.observe("m", r, t0));
        clock.forget("m");
        assert!(clock.unchanged(t0).is_empty());
    }
}
