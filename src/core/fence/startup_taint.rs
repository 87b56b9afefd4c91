//! Upstream's `removeNodeNotReadyTaint`: a node pool registers its Nodes with a start-up taint
//! (`provisionerNotReadyNodeTaintKey`) that keeps workloads off until this node's volumes are
//! published; the agent removes that one taint from its own Node after its first pass that
//! left nothing to publish, and never touches another taint. Pure: what the pass left, and
//! which taints remain.

use k8s_openapi::api::core::v1::Taint;

/// What one pass left of publishing this node's volumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PassOutcome {
    /// A valid configuration was in use for the pass.
    pub configured: bool,
    /// Volumes found that are still inside their settle window (published by a later pass).
    pub settling: usize,
    /// PV creates of this pass that failed (tried again with backoff).
    pub failed_creates: usize,
}

impl PassOutcome {
    /// Whether the pass published every volume it may publish: nothing waits to settle and
    /// no create failed. Volumes the planner refused (a name or disk held by another PV, a
    /// used disk to wipe first) are decided, not pending: they would keep the node tainted for
    /// good, which is what upstream's flag exists to avoid.
    pub fn published_all(&self) -> bool {
        self.configured && self.settling == 0 && self.failed_creates == 0
    }
}

/// What the agent does about the start-up taint after a pass.
#[derive(Debug, Clone, PartialEq)]
pub enum TaintStep {
    /// Nothing: the feature is off, already done, or the pass left volumes to publish.
    Wait,
    /// The Node carries no taint with the key: nothing to remove, and done.
    Absent,
    /// Write these taints (every taint but the key's, in their order): `expected` is the list
    /// as read, which the write must find unchanged.
    Remove { expected: Vec<Taint>, remaining: Vec<Taint> },
}

/// The step for the Node's `taints` now, with the feature `key` (`None`: off) after a pass that
/// ended as `outcome`. `done`: the taint was removed (or found absent) earlier in this process,
/// as upstream removes it once per start.
pub fn step(key: Option<&str>, done: bool, outcome: &PassOutcome, taints: &[Taint]) -> TaintStep {
    let Some(key) = key.filter(|k| !k.is_empty()) else { return TaintStep::Wait };
    if done || !outcome.published_all() {
        return TaintStep::Wait;
    }
    match remaining_taints(taints, key) {
        Some(remaining) => TaintStep::Remove { expected: taints.to_vec(), remaining },
        None => TaintStep::Absent,
    }
}

/// Every taint of `taints` but those with `key` (any effect, any value, as upstream), in order;
/// `None` when none has the key.
pub fn remaining_taints(taints: &[Taint], key: &str) -> Option<Vec<Taint>> {
    if !taints.iter().any(|t| t.key == key) {
        return None;
    }
    Some(taints.iter().filter(|t| t.key != key).cloned().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "sig-storage-local-static-provisioner/agent-not-ready";

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint { key: key.into(), value: value.map(Into::into), effect: effect.into(), time_added: None }
    }

    fn done_pass() -> PassOutcome {
        PassOutcome { configured: true, settling: 0, failed_creates: 0 }
    }

    #[test]
    fn only_the_configured_key_goes_and_the_others_keep_their_order() {
        let taints = vec![
            taint("node.cilium.io/agent-not-ready", Some("true"), "NoExecute"),
            taint(KEY, None, "NoSchedule"),
            taint("dedicated", Some("storage"), "NoSchedule"),
            taint(KEY, Some("x"), "NoExecute"),
        ];
        let remaining = remaining_taints(&taints, KEY).unwrap();
        assert_eq!(remaining, vec![taints[0].clone(), taints[2].clone()]);
        // A look-alike key (prefix, other case) is another taint.
        let others =
            vec![taint(&format!("{KEY}-x"), None, "NoSchedule"), taint(&KEY.to_uppercase(), None, "NoSchedule")];
        assert_eq!(remaining_taints(&others, KEY), None);
        assert_eq!(remaining_taints(&[], KEY), None);
        assert_eq!(remaining_taints(&[taint(KEY, None, "NoSchedule")], KEY), Some(vec![]));
    }

    #[test]
    fn the_taint_goes_only_after_a_pass_that_published_everything() {
        let taints = vec![taint("a", None, "NoSchedule"), taint(KEY, None, "NoSchedule")];
        let remove = TaintStep::Remove { expected: taints.clone(), remaining: vec![taints[0].clone()] };
        assert_eq!(step(Some(KEY), false, &done_pass(), &taints), remove);
        for outcome in [
            PassOutcome { configured: false, ..done_pass() },
            PassOutcome { settling: 1, ..done_pass() },
            PassOutcome { failed_creates: 2, ..done_pass() },
            PassOutcome::default(),
        ] {
            assert!(!outcome.published_all(), "{outcome:?}");
            assert_eq!(step(Some(KEY), false, &outcome, &taints), TaintStep::Wait, "{outcome:?}");
        }
    }

    #[test]
    fn off_done_or_absent_touches_nothing() {
        let taints = vec![taint(KEY, None, "NoSchedule")];
        // Off: no key, or an empty one (upstream's binary has no default key).
        assert_eq!(step(None, false, &done_pass(), &taints), TaintStep::Wait);
        assert_eq!(step(Some(""), false, &done_pass(), &taints), TaintStep::Wait);
        // Removed once per start: a taint put back later is the operator's.
        assert_eq!(step(Some(KEY), true, &done_pass(), &taints), TaintStep::Wait);
        assert_eq!(step(Some(KEY), false, &done_pass(), &[taint("other", None, "NoSchedule")]), TaintStep::Absent);
        assert_eq!(step(Some(KEY), false, &done_pass(), &[]), TaintStep::Absent);
    }
}
