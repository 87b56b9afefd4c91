//! The volume fence's labels and the node-affinity requirements that honour them (see
//! core::fence::volume_fence for what the fence is). Below fence's planning, so that pv_facts and pv can read
//! a PV's affinity without importing the planner (fence re-exports all of it).

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, VolumeNodeAffinity};

/// Prefix of the per-PV fence label: `fence.local-static-provisioner.io/<pv name>`.
pub const FENCE_PREFIX: &str = "fence.local-static-provisioner.io/";
/// The node-wide fence: set when the agent stops, removed by the next agent's first pass.
pub const LABEL_VOLUMES_UNVERIFIED: &str = "local-static-provisioner.io/volumes-unverified";
/// Value of the node-wide fence.
pub const AGENT_STOPPED: &str = "agent-stopped";

/// Why a PV is fenced; the value of its label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FenceReason {
    /// Its path holds a disk that is provably not the one it recorded (swapped, replaced).
    NotItsDisk,
    /// Nothing is mounted (no device) at its path: kubelet would mount the bare directory on
    /// the root filesystem, and the claim's writes would land there.
    DiskMissing,
    /// Its disk did not answer the first pass after the agent started: not checked yet.
    Unverified,
    /// Its disk is there, but the key of its encrypted volume cannot be had in the kernel (the
    /// node's stored copy lost, or its data directory is not the one published): a pod would
    /// get a directory it cannot read (core::volumes::encryption).
    KeyUnavailable,
}

impl FenceReason {
    /// The label value.
    pub fn label_value(self) -> &'static str {
        match self {
            FenceReason::NotItsDisk => "not-its-disk",
            FenceReason::DiskMissing => "disk-missing",
            FenceReason::Unverified => "unverified",
            FenceReason::KeyUnavailable => "key-unavailable",
        }
    }

    /// The reason a label value names (an unknown value counts as unverified: it fences all
    /// the same, and the next check replaces it).
    pub fn from_label_value(value: &str) -> FenceReason {
        match value {
            "not-its-disk" => FenceReason::NotItsDisk,
            "disk-missing" => FenceReason::DiskMissing,
            "key-unavailable" => FenceReason::KeyUnavailable,
            _ => FenceReason::Unverified,
        }
    }

    /// What an operator or the claim's owner reads in the event.
    pub fn describe(self) -> &'static str {
        match self {
            FenceReason::NotItsDisk => "its path holds a disk that is not the PV's own (disks swapped or replaced)",
            FenceReason::DiskMissing => "nothing is mounted at its path (its disk is missing)",
            FenceReason::Unverified => "its disk has not answered since the agent started",
            FenceReason::KeyUnavailable => "its encryption key cannot be loaded on this node (its data cannot be read)",
        }
    }
}

/// The per-PV fence label key, or `None` when the PV's name cannot be a label name (over 63
/// characters, or other characters): such a PV is made without a fence requirement.
pub fn fence_key(pv_name: &str) -> Option<String> {
    let bytes = pv_name.as_bytes();
    let edge_ok = |b: Option<&u8>| b.is_some_and(u8::is_ascii_alphanumeric);
    let valid = !bytes.is_empty()
        && bytes.len() <= 63
        && edge_ok(bytes.first())
        && edge_ok(bytes.last())
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    valid.then(|| format!("{FENCE_PREFIX}{pv_name}"))
}

/// The requirements every node-selector term of a new PV gets: its own fence label and the
/// node-wide one must be absent.
pub fn fence_requirements(pv_name: &str) -> Vec<NodeSelectorRequirement> {
    let absent = |key: String| NodeSelectorRequirement { key, operator: "DoesNotExist".into(), values: None };
    fence_key(pv_name).into_iter().map(absent).chain([absent(LABEL_VOLUMES_UNVERIFIED.to_string())]).collect()
}

/// Whether a PV's node affinity honours its fence: every term requires its fence label to be
/// absent (a term without it would let kubelet mount the volume all the same). PVs made before
/// fences existed, and upstream's, do not: node affinity cannot be changed after creation.
pub fn honours_fence(pv_name: &str, affinity: Option<&VolumeNodeAffinity>) -> bool {
    let Some(key) = fence_key(pv_name) else { return false };
    let terms = affinity.and_then(|a| a.required.as_ref()).map(|r| r.node_selector_terms.as_slice()).unwrap_or(&[]);
    !terms.is_empty()
        && terms.iter().all(|t| {
            t.match_expressions
                .iter()
                .flatten()
                .any(|e| e.key == key && e.operator == "DoesNotExist" && e.values.as_ref().is_none_or(Vec::is_empty))
        })
}

/// Removes the fence requirements from every term of a PV's node affinity (as it is stored:
/// see core::volumes::pv_facts, which keeps whether they were there).
pub fn strip_fence_requirements(affinity: &mut Option<VolumeNodeAffinity>) {
    let terms = affinity.as_mut().and_then(|a| a.required.as_mut()).map(|r| r.node_selector_terms.iter_mut());
    for term in terms.into_iter().flatten() {
        if let Some(expressions) = term.match_expressions.as_mut() {
            expressions.retain(|e| {
                !(e.operator == "DoesNotExist"
                    && (e.key.starts_with(FENCE_PREFIX) || e.key == LABEL_VOLUMES_UNVERIFIED))
            });
            expressions.shrink_to_fit();
        }
    }
}
