//! The planner: compares the volumes this node should publish (desired) with the PVs that
//! exist (actual) and returns what to do. It does no I/O, so every decision about creating,
//! adopting or refusing a PV is tested here without a cluster or a disk.

use std::collections::{BTreeMap, BTreeSet};

use crate::core::identity::disk_identity::{DiskIdentity, may_share_disk};
use crate::core::identity::used_mark::{UsedMark, UsedRead, UsedVerdict, used_verdict};
use crate::core::reconcile::expectations::Expected;
use crate::core::volumes::naming::{is_provisioned_for_node, provisioned_by_uid};
pub(crate) use crate::core::volumes::pv_inputs::{DesiredPv, ObservedPv};

/// Who this agent is, for ownership decisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    /// Node name.
    pub node: String,
    /// provisioned-by value for this node.
    pub provisioner: String,
    /// Value of our node label for this node.
    pub node_label: String,
    /// Upstream's useNodeNameOnly setting.
    pub use_node_name_only: bool,
}

impl Identity {
    /// Whether this PV was made for this node (by upstream or by us).
    pub(crate) fn owns(&self, pv: &ObservedPv) -> bool {
        is_provisioned_for_node(
            pv.provisioned_by.as_deref(),
            pv.hostname_label.as_deref(),
            &self.node,
            &self.provisioner,
            self.use_node_name_only,
        )
    }

    /// Whether this PV was made for an earlier incarnation of this Node: same name, another
    /// UID (the Node object was deleted and registered again). The agent decides whether to
    /// take it over by looking at the disk (see core::cluster::succession).
    pub(crate) fn is_predecessor(&self, pv: &ObservedPv) -> bool {
        !self.owns(pv) && pv.provisioned_by.as_deref().is_some_and(|a| provisioned_by_uid(a, &self.node).is_some())
    }
}

/// Why a desired volume is not published in this pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Two entries of this node hash to the same PV name.
    NameCollisionOnNode { other_path: String },
    /// A PV with this name exists for a different volume (another node or another path).
    NameTaken { owner: String },
    /// The host path is already published under another PV name.
    PathInUse { pv: String },
    /// Other entries (of this or another class) are the same disk, or share its data, and
    /// none of them is published yet: which one is meant is ambiguous, so none is.
    SameDisk { others: Vec<String> },
    /// The disk is already published under another path.
    DiskPublished { pv: String, path: String },
    /// The host uses this block device (mounted, held, open exclusively).
    DeviceInUse { why: String },
    /// Whether the disk held a tenant's data cannot be told (its used mark is unreadable).
    UsedUnknown { why: String },
}

impl Refusal {
    /// A short stable name, for metric labels and scripts.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            Refusal::NameCollisionOnNode { .. } => "name-collision",
            Refusal::NameTaken { .. } => "name-taken",
            Refusal::PathInUse { .. } => "path-published",
            Refusal::SameDisk { .. } => "same-disk",
            Refusal::DiskPublished { .. } => "disk-published",
            Refusal::DeviceInUse { .. } => "device-in-use",
            Refusal::UsedUnknown { .. } => "used-unknown",
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NameCollisionOnNode { other_path } => {
                write!(f, "its PV name collides with the volume at {other_path} on this node")
            }
            Refusal::NameTaken { owner } => {
                write!(f, "its PV name is already used by {owner}; refusing to overwrite it")
            }
            Refusal::PathInUse { pv } => write!(f, "the path is already published as PV {pv}"),
            Refusal::SameDisk { others } => write!(
                f,
                "it is the same disk as (or shares data with) {}; none of them is published until only one remains",
                others.join(", ")
            ),
            Refusal::DiskPublished { pv, path } => {
                write!(f, "its disk is already published as PV {pv} at {path}; one disk is published at most once")
            }
            Refusal::DeviceInUse { why } => write!(f, "the block device is in use on the host: {why}"),
            Refusal::UsedUnknown { why } => write!(
                f,
                "it may hold a tenant's data and cannot be checked ({why}); it is neither published nor wiped"
            ),
        }
    }
}

/// One step for the executors.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// Create the PV of the desired volume `name` at `host_path` (built by `PvContext::pv_for`).
    Create { name: String, host_path: String },
    /// Do not publish this volume, and tell the operator why.
    Refuse { name: String, host_path: String, reason: Refusal },
    /// The disk carries our used mark and no live PV names it: it held a tenant's data, so it
    /// is wiped (proving its identity again on the wipe's own descriptor) before it is
    /// published. `name` is the PV it will be published as.
    WipeFirst { name: String, host_path: String, identity: String, mark: UsedMark },
}

/// The desired volume an action names (by PV name and host path, which together are unique).
pub(crate) fn desired_named<'a>(desired: &'a [DesiredPv], name: &str, host_path: &str) -> Option<&'a DesiredPv> {
    desired.iter().find(|d| d.name == name && d.host_path == host_path)
}

/// Plans one reconcile pass. `observed` are the PVs carrying our node label; `foreign` are PV
/// names known (from an earlier AlreadyExists) to belong to someone else, with a description
/// of the owner. The result is sorted by PV name, so equal inputs give equal plans.
pub(crate) fn plan(
    identity: &Identity,
    desired: &[DesiredPv],
    observed: &[ObservedPv],
    foreign: &BTreeMap<String, String>,
) -> Vec<Action> {
    plan_expecting(identity, desired, observed, foreign, &[])
}

/// `plan`, knowing the PVs this agent created that `observed` (its store) does not show yet
/// (core::reconcile::expectations). Such a volume, found at the same path with the same disk identity, is
/// neither created again nor refused for its own used mark: nothing is done for it. Until the
/// store shows it, its path counts as published, so no other entry takes its disk.
pub(crate) fn plan_expecting(
    identity: &Identity,
    desired: &[DesiredPv],
    observed: &[ObservedPv],
    foreign: &BTreeMap<String, String>,
    expected: &[Expected],
) -> Vec<Action> {
    let by_name: BTreeMap<&str, &ObservedPv> = observed.iter().map(|o| (o.name.as_str(), o)).collect();
    // Path -> the smallest name of our PVs on it, so the plan does not depend on store order.
    let mut by_path: BTreeMap<&str, &str> = BTreeMap::new();
    for o in observed.iter().filter(|o| identity.owns(o)) {
        if let Some(path) = o.host_path.as_deref() {
            by_path.entry(path).and_modify(|n| *n = (*n).min(o.name.as_str())).or_insert(o.name.as_str());
        }
    }
    // Created by this agent, not in the store yet: the same name, path and disk only.
    let is_expected = |d: &DesiredPv| {
        !by_name.contains_key(d.name.as_str()) && expected.iter().any(|e| e.is(&d.name, &d.host_path, &d.identity))
    };
    let mut published_paths = by_path.clone();
    for d in desired.iter().filter(|d| is_expected(d)) {
        published_paths.entry(d.host_path.as_str()).or_insert(d.name.as_str());
    }
    // Within one name, the volume already published under it goes first, so a new entry that
    // collides with it is the one refused, never the volume that is already in use.
    let already_published = |d: &DesiredPv| {
        by_name.get(d.name.as_str()).is_some_and(|o| o.host_path.as_deref() == Some(d.host_path.as_str()))
    };
    let mut sorted: Vec<&DesiredPv> = desired.iter().collect();
    sorted.sort_by(|a, b| {
        (&a.name, !already_published(a), &a.host_path).cmp(&(&b.name, !already_published(b), &b.host_path))
    });

    let disk_refusals = plan_disks(identity, desired, observed, &published_paths);
    let mut claimed: BTreeMap<&str, &str> = BTreeMap::new();
    let mut paths_done: BTreeSet<&str> = BTreeSet::new();
    let mut actions = Vec::new();
    for d in sorted {
        let refuse = |reason| Action::Refuse { name: d.name.clone(), host_path: d.host_path.clone(), reason };
        if !paths_done.insert(d.host_path.as_str()) {
            continue; // Discovery reported the same path twice; one PV is enough.
        }
        if let Some(other) = claimed.insert(d.name.as_str(), d.host_path.as_str()) {
            claimed.insert(d.name.as_str(), other);
            actions.push(refuse(Refusal::NameCollisionOnNode { other_path: other.to_string() }));
            continue;
        }
        if is_expected(d) {
            continue; // Created: waiting for the store to show it.
        }
        if let Some(existing) = by_name.get(d.name.as_str()) {
            let same_volume = identity.owns(existing) && existing.host_path.as_deref() == Some(d.host_path.as_str());
            if !same_volume {
                actions.push(refuse(Refusal::NameTaken { owner: describe_owner(existing) }));
            }
            continue;
        }
        if let Some(pv) = published_paths.get(d.host_path.as_str()) {
            actions.push(refuse(Refusal::PathInUse { pv: pv.to_string() }));
            continue;
        }
        if let Some(owner) = foreign.get(&d.name) {
            actions.push(refuse(Refusal::NameTaken { owner: owner.clone() }));
            continue;
        }
        match disk_refusals.get(d.host_path.as_str()) {
            Some(DiskOutcome::Refuse(reason)) => actions.push(refuse(reason.clone())),
            Some(DiskOutcome::WipeFirst(mark)) => actions.push(Action::WipeFirst {
                name: d.name.clone(),
                host_path: d.host_path.clone(),
                identity: d.identity.clone(),
                mark: mark.clone(),
            }),
            None => actions.push(Action::Create { name: d.name.clone(), host_path: d.host_path.clone() }),
        }
    }
    actions
}

/// What `plan_disks` says about a desired volume that would otherwise be created.
enum DiskOutcome {
    Refuse(Refusal),
    WipeFirst(UsedMark),
}

/// One disk, at most one PV, and never a used disk unwiped. For each desired volume not yet
/// published: another entry shares its data (the published one keeps it; with none published,
/// all of them are refused, since which one is meant is ambiguous), a live PV records the same
/// disk and its own disk is not at its path (the disk moved: it holds that PV's data), the host
/// uses the block device, or the disk's used mark says it held data (wiped first) or cannot be
/// read. Volumes already published are never refused here: an existing PV keeps its disk.
fn plan_disks<'a>(
    identity: &Identity,
    desired: &'a [DesiredPv],
    observed: &[ObservedPv],
    published_paths: &BTreeMap<&str, &str>,
) -> BTreeMap<&'a str, DiskOutcome> {
    // Overlapping disks always share a token (device, base disk or file): compare only those.
    let mut by_token: BTreeMap<String, Vec<&DesiredPv>> = BTreeMap::new();
    for d in desired {
        for t in d.disk.tokens() {
            by_token.entry(t).or_default().push(d);
        }
    }
    // (identity, PV name, path) of this node's PVs (and its earlier incarnation's) whose own
    // disk is not at their path now. Where it is, its DiskKey above already settles what
    // overlaps it (two directories of one shared disk do not); a disk gone from its PV's path,
    // or swapped with another, is looked for elsewhere by its identity.
    let found_at: BTreeMap<&str, &str> = desired.iter().map(|d| (d.host_path.as_str(), d.identity.as_str())).collect();
    let recorded: Vec<(&str, &str, &str)> = observed
        .iter()
        .filter(|o| identity.owns(o) || identity.is_predecessor(o))
        .filter_map(|o| Some((o.identity.as_deref()?, o.name.as_str(), o.host_path.as_deref()?)))
        .filter(|(id, _, path)| !found_at.get(path).is_some_and(|found| may_share_disk(id, found)))
        .collect();
    let mut outcomes = BTreeMap::new();
    for d in desired {
        if published_paths.contains_key(d.host_path.as_str()) {
            continue;
        }
        let mut sharing: Vec<&DesiredPv> = d
            .disk
            .tokens()
            .iter()
            .flat_map(|t| by_token[t].iter())
            .filter(|o| o.host_path != d.host_path && o.disk.overlaps(&d.disk))
            // A device the host uses can never be published, so it competes with no one.
            .filter(|o| o.in_use.is_none() || published_paths.contains_key(o.host_path.as_str()))
            .copied()
            .collect();
        sharing.sort_by(|a, b| a.host_path.cmp(&b.host_path));
        sharing.dedup_by(|a, b| a.host_path == b.host_path);
        let refusal = if let Some(why) = &d.in_use {
            Some(Refusal::DeviceInUse { why: why.clone() })
        } else if let Some(p) = sharing.iter().find(|o| published_paths.contains_key(o.host_path.as_str())) {
            Some(Refusal::DiskPublished {
                pv: published_paths[p.host_path.as_str()].to_string(),
                path: p.host_path.clone(),
            })
        } else if !sharing.is_empty() {
            let mut others: Vec<String> = sharing.iter().map(|o| o.host_path.clone()).collect();
            others.sort();
            others.dedup();
            Some(Refusal::SameDisk { others })
        } else {
            // The disk (or a directory of it, or it under another device number) is recorded on
            // a live PV whose own disk is not at its path: it holds that PV's data.
            let holder = recorded
                .iter()
                .find(|(id, _, path)| *path != d.host_path && may_share_disk(id, &d.identity))
                .map(|(_, pv, path)| (pv.to_string(), path.to_string()));
            // The PV the disk's own mark names, if it exists (this node's, or read from the API).
            let mark_pv = match &d.used {
                UsedRead::Marked(m) | UsedRead::Offered(m) => observed
                    .iter()
                    .find(|o| o.name == m.pv)
                    .or_else(|| d.mark_holder.as_ref().filter(|h| h.name == m.pv)),
                _ => None,
            };
            // It holds the disk unless its record proves it is another disk: a PV that recorded
            // no identity, or one in an old format, may well be this disk's.
            let holder = holder.or_else(|| {
                let p = mark_pv?;
                let proven_other = p.identity.as_deref().is_some_and(|id| {
                    DiskIdentity::parse(id).is_some()
                        && DiskIdentity::parse(&d.identity).is_some()
                        && !may_share_disk(id, &d.identity)
                });
                (!proven_other).then(|| {
                    let path = p.host_path.as_deref().unwrap_or("?");
                    let place = if identity.owns(p) || identity.is_predecessor(p) {
                        path.to_string()
                    } else {
                        format!("{path} on {}", p.hostname_label.as_deref().unwrap_or("another node"))
                    };
                    (p.name.clone(), place)
                })
            });
            let mark_pv_exists = mark_pv.is_some();
            let holder = holder.as_ref().map(|(pv, path)| (pv.as_str(), path.as_str()));
            match used_verdict(&d.used, holder, mark_pv_exists) {
                UsedVerdict::Publish => None,
                UsedVerdict::HeldBy { pv, path } => Some(Refusal::DiskPublished { pv, path }),
                UsedVerdict::Unknown(why) => Some(Refusal::UsedUnknown { why }),
                UsedVerdict::WipeFirst => {
                    if let UsedRead::Marked(mark) = &d.used {
                        outcomes.insert(d.host_path.as_str(), DiskOutcome::WipeFirst(mark.clone()));
                    }
                    continue;
                }
            }
        };
        if let Some(r) = refusal {
            outcomes.insert(d.host_path.as_str(), DiskOutcome::Refuse(r));
        }
    }
    outcomes
}

/// PVs made for this node, or for an earlier incarnation of it, that lack our label: they were
/// made by upstream or an older version and must be labelled so the label-scoped watch sees
/// them. Sorted by name.
pub(crate) fn plan_adoption(identity: &Identity, all_pvs: &[ObservedPv]) -> Vec<String> {
    let mut names: Vec<String> =
        all_pvs.iter().filter(|pv| needs_adoption(identity, pv)).map(|pv| pv.name.clone()).collect();
    names.sort();
    names
}

/// Whether `plan_adoption` would name this PV: the test a listing of every PV of the cluster
/// applies page by page, so only the few PVs of this node are kept in memory.
pub(crate) fn needs_adoption(identity: &Identity, pv: &ObservedPv) -> bool {
    (identity.owns(pv) || identity.is_predecessor(pv)) && pv.node_label.as_deref() != Some(identity.node_label.as_str())
}

/// What to do with a PV that the API said already exists when we tried to create `desired`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ExistingPv {
    /// It is the same volume, made for this node: adopt it (add our label) if it lacks it.
    Ours { needs_label: bool },
    /// It belongs to another node or path: never touch it.
    Foreign { owner: String },
}

/// Classifies a PV found under a name we wanted to create.
pub(crate) fn classify_existing(identity: &Identity, desired: &DesiredPv, existing: &ObservedPv) -> ExistingPv {
    if identity.owns(existing) && existing.host_path.as_deref() == Some(desired.host_path.as_str()) {
        ExistingPv::Ours { needs_label: existing.node_label.as_deref() != Some(identity.node_label.as_str()) }
    } else {
        ExistingPv::Foreign { owner: describe_owner(existing) }
    }
}

fn describe_owner(pv: &ObservedPv) -> String {
    format!(
        "PV {} (path {}, provisioned by {})",
        pv.name,
        pv.host_path.as_deref().unwrap_or("<not a local PV>"),
        pv.provisioned_by.as_deref().unwrap_or("<unknown>")
    )
}

#[cfg(test)]
#[path = "planner_tests.rs"]
mod tests;
