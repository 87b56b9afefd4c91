//! A block disk's history across nodes, judged from evidence no single node can forge.
//!
//! A block device cannot carry its used mark (core::identity::used_mark), so when a disk shows up on a
//! node whose own ledger says nothing (or says it was used here, and it went away since), what
//! other nodes know of it is in the API: the PVs that name it (every PV this agent makes
//! carries [`LABEL_DISK_ID`](crate::core::volumes::naming::LABEL_DISK_ID), a hash of the whole disk's stable
//! ID, next to the full identity annotation), and the used-disk records in other nodes'
//! `LocalStorageNode` status (core::cluster::inventory).
//!
//! Not all of it is worth the same. A node's token may write its own `LocalStorageNode` status
//! and create unclaimed PVs pinned to its own node, with any labels and annotations (the
//! admission policies allow both): such a record or PV says only what one node claims. What a
//! node token cannot make is a PV with `spec.claimRef` (the policy refuses it on create, and
//! refuses any change of the spec on update): a claimRef with a UID was put there by the PV
//! binder for a real claim, so a tenant could write to the disk through it. Marks on the disk
//! itself and this node's own ledger are this node's own knowledge.
//!
//! [`judge`] is the rule (docs/data-safety.md, "The cluster's word on a block disk"):
//! - a claimed PV of another node that is not released holds the disk (a tenant may use it
//!   now: a disk seen by two nodes at once, a SAN LUN);
//! - a record any node token can write (another node's used-disk record, an unclaimed PV of
//!   another node naming the disk) may hold the disk, and is said as such, but never makes
//!   this node destroy data: and it never holds a disk this node's own records show it
//!   published and let go (released and wiped here); a used-disk
//!   record without a PV does not hold a disk this node's own mark says is used (that mark
//!   has it wiped: whatever the record says, no tenant uses the disk through a PV now);
//! - this node's own used mark, a claimed PV of another node that was released (a claim used
//!   the disk, and let it go) and a record an operator released make it wiped first;
//! - a PV (or record) whose disk this node wiped since is superseded: it counts no more.
//!
//! Pure: the agent gathers the evidence; this module says what it means.

use crate::core::identity::disk_identity::{DiskIdentity, LoopKey};
use crate::core::identity::used_mark::relation_keys;

/// How many hex digits of the SHA-256 of a disk's stable ID the label keeps (160 bits): a label
/// value may hold 63 characters; a collision only makes a PV a candidate that the full identity
/// comparison ([`names_disk`]) then rejects.
const LABEL_HEX: usize = 40;

/// The whole disk an identity is on, by its stable ID (a partition's disk): what names the
/// device on any node. `None` for an identity named by numbers only.
pub fn whole_disk(identity: &str) -> Option<String> {
    // A loop device by its key in the current format (an id of an earlier version names the
    // file by path and has its filesystem's device number in `backing`), so both formats agree.
    let canonical_loop = DiskIdentity::parse(identity)
        .and_then(|d| d.loop_key())
        .and_then(|k| LoopKey { part: None, ..k }.render())
        .map(|id| format!("disk:{id}"));
    canonical_loop.or_else(|| relation_keys(identity).into_iter().find(|k| k.starts_with("disk:")))
}

/// The value of the disk-id label for a volume of this identity: lowercase hex of the first
/// bytes of SHA-256 over the whole disk's key (`disk:<stable id>`). `None` when the identity
/// names no device by a stable ID (a directory, a device named by numbers only).
pub fn disk_label(identity: &str) -> Option<String> {
    let key = whole_disk(identity)?;
    let digest = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    Some(hex[..LABEL_HEX].to_string())
}

/// The disk-id label one of this node's PVs should carry and does not: `Some(value)` when its
/// recorded identity names a device by a stable ID and the label is absent or another value (a
/// PV made before the label existed, by an older version or adopted from upstream, or one whose
/// label was changed by hand), so that another node about to offer that disk finds the PV.
pub fn missing_disk_label(identity: Option<&str>, label: Option<&str>) -> Option<String> {
    let want = disk_label(identity?)?;
    (label != Some(want.as_str())).then_some(want)
}

/// Whether a PV's recorded identity (its annotation) names the same whole disk as the identity
/// found: the label only finds candidates, a forged or colliding label proves nothing.
pub fn names_disk(recorded: Option<&str>, found: &str) -> bool {
    recorded.is_some_and(|r| same_whole_disk(r, found))
}

/// Whether two identities name one whole disk: the same stable ID and, for loop devices, a
/// backing file born at the same time where both sides know it. An inode number is reused once
/// its file is deleted; a file born later at that inode is other data, so a record of the
/// deleted one holds nothing on it. The one rule for PVs and used-disk records alike.
pub fn same_whole_disk(recorded: &str, found: &str) -> bool {
    let (Some(a), Some(b)) = (whole_disk(recorded), whole_disk(found)) else { return false };
    let born = |identity: &str| DiskIdentity::parse(identity).and_then(|d| d.loop_key()).and_then(|k| k.born);
    a == b && (born(recorded).zip(born(found))).is_none_or(|(x, y)| x == y)
}

/// What this node's own ledger says of the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnMark {
    /// Nothing.
    None,
    /// Published here and withdrawn unclaimed: offered, never used.
    Offered,
    /// Published here and not wiped since.
    Used,
}

/// This node's own evidence about the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Own {
    /// Its ledger's mark.
    pub mark: OwnMark,
    /// Its own records show it published the disk, a claim released it and it was wiped here:
    /// the volume's last wipe, for this very disk, whose new PV is not made yet. Not a disk it
    /// withdrew unclaimed: such a disk may have gone to another node since, been used there and
    /// come back, and that node's record is then the only word of it (held, not published).
    pub let_go: bool,
}

/// A PV in the API whose identity names the disk (found by its disk-id label).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PvWitness {
    /// The node it is pinned to.
    pub node: String,
    /// Its name and UID.
    pub name: String,
    pub uid: String,
    /// `spec.claimRef` with a UID: the binder bound a claim to it (no node token can write it).
    pub claimed: bool,
    /// Phase Released or Failed: its claim is gone.
    pub released: bool,
    /// It is being deleted.
    pub deleting: bool,
    /// It is this node's (the planner judges those: one disk, one PV).
    pub own: bool,
    /// This node wiped the disk since this PV was seen released: it counts no more.
    pub superseded: bool,
    /// An operator released the hold it makes (`release-hold`).
    pub released_by_operator: bool,
}

/// Another node's used-disk record naming the disk (its `LocalStorageNode` status).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordWitness {
    /// The node whose object holds it.
    pub node: String,
    /// The PV it names, and that PV's UID when it was recorded.
    pub pv: String,
    pub uid: Option<String>,
    /// The record says the PV was withdrawn unclaimed: offered, never used.
    pub offered: bool,
    /// This node wiped the disk since: it counts no more.
    pub superseded: bool,
    /// An operator released the hold it makes (`release-hold`).
    pub released_by_operator: bool,
}

/// Why a disk is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldWhy {
    /// A claim is bound to a PV of another node naming it: a tenant may be using it.
    ClaimedPv,
    /// An unclaimed PV of another node names it (any node's token could have written that).
    UnclaimedPv,
    /// Another node's used-disk record names it and no PV corroborates it (any node's token
    /// could have written that).
    Record,
}

impl HoldWhy {
    /// A stable code (metric label, status).
    pub fn code(self) -> &'static str {
        match self {
            HoldWhy::ClaimedPv => "claimed-pv",
            HoldWhy::UnclaimedPv => "unclaimed-pv",
            HoldWhy::Record => "record",
        }
    }

    /// Whether the hold rests on a record one node's credentials can write, so an operator may
    /// release it (a claimed PV is released by deleting it, not by word).
    pub fn releasable(self) -> bool {
        !matches!(self, HoldWhy::ClaimedPv)
    }
}

/// Why a disk is wiped before it is published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WipeCause {
    /// This node's own ledger marks it used.
    OwnMark,
    /// A claim used it through this PV of another node, which was released since.
    ReleasedPv { node: String, pv: String, uid: String },
    /// An operator released the hold of this record: it is taken as its node's mark.
    ReleasedRecord { node: String, pv: String, uid: Option<String> },
}

/// What the agent may do with the disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Publish as usual (with this node's own offered mark, if any).
    Publish,
    /// Wipe it, then publish it clean.
    WipeFirst { because: WipeCause },
    /// Neither publish nor wipe: `node`'s `record` (a PV's or a record's name, and its UID)
    /// names the disk.
    Hold { node: String, record: String, uid: Option<String>, why: HoldWhy },
    /// The evidence could not be read: neither publish nor wipe.
    Unknown(String),
}

/// The rule (see the module's documentation). `pvs`: the PVs naming the disk by identity, or
/// `None` when they could not be listed; `records`: other nodes' used-disk records naming it
/// (empty without the CRD), or `None` when they could not be read.
pub fn judge(own: Own, pvs: Option<&[PvWitness]>, records: Option<&[RecordWitness]>) -> Decision {
    let Some(pvs) = pvs else {
        return Decision::Unknown("the PVs that may name this disk cannot be listed".into());
    };
    let Some(records) = records else {
        return Decision::Unknown("the cluster's used-disk records (LocalStorageNodes) cannot be read".into());
    };
    let others = || pvs.iter().filter(|p| !p.own && !p.superseded);
    // A record counts unless it was only offered, or this node wiped the disk for it (or for
    // the PV of its UID) since.
    let wiped_for = |u: &String| pvs.iter().any(|p| !p.own && p.superseded && &p.uid == u);
    let counts = |r: &RecordWitness| !r.offered && !r.superseded && !r.uid.as_ref().is_some_and(wiped_for);
    // A tenant may be using it now: nothing but that PV's end lets it go.
    if let Some(p) = others().find(|p| p.claimed && !p.released) {
        return hold_pv(p, HoldWhy::ClaimedPv);
    }
    // What one node's credentials can write holds the disk, unless this node's own records
    // show it published the disk and let it go, or an operator released it.
    if !own.let_go {
        if let Some(p) = others().find(|p| !p.claimed && !p.released_by_operator) {
            return hold_pv(p, HoldWhy::UnclaimedPv);
        }
        // A record whose PV of another node is here (by UID) is judged by that PV.
        let corroborated = |r: &RecordWitness| r.uid.as_ref().is_some_and(|u| others().any(|p| &p.uid == u));
        // A record alone does not hold a disk this node's own mark says is used: that mark is
        // what makes it wiped, and a record's data is in use only through a PV.
        let held = |r: &&RecordWitness| counts(r) && !r.released_by_operator && !corroborated(r);
        if let Some(r) = records.iter().filter(|_| own.mark != OwnMark::Used).find(held) {
            return Decision::Hold {
                node: r.node.clone(),
                record: r.pv.clone(),
                uid: r.uid.clone(),
                why: HoldWhy::Record,
            };
        }
    }
    if own.mark == OwnMark::Used {
        return Decision::WipeFirst { because: WipeCause::OwnMark };
    }
    if let Some(p) = others().find(|p| p.claimed && p.released) {
        let because = WipeCause::ReleasedPv { node: p.node.clone(), pv: p.name.clone(), uid: p.uid.clone() };
        return Decision::WipeFirst { because };
    }
    if !own.let_go
        && let Some(r) = records.iter().find(|r| counts(r) && r.released_by_operator)
    {
        let because = WipeCause::ReleasedRecord { node: r.node.clone(), pv: r.pv.clone(), uid: r.uid.clone() };
        return Decision::WipeFirst { because };
    }
    Decision::Publish
}

/// The witness a PV found by the disk-id label makes, when its identity annotation names the
/// disk found as `found` (`None` otherwise: a label alone proves nothing). `own_host`: this
/// node's hostname (a PV pinned to it is this node's); `superseded`: UIDs of PVs whose disk this
/// node wiped since; `released`: UIDs and names an operator released holds of.
pub fn pv_witness(
    pv: &crate::core::volumes::pv_facts::PvFacts,
    found: &str,
    own_host: &str,
    superseded: &dyn Fn(&str) -> bool,
    released: &dyn Fn(&str, &str) -> bool,
) -> Option<PvWitness> {
    use crate::core::volumes::naming::{ANN_VOLUME_IDENTITY, LABEL_HOSTNAME, LABEL_NODE};
    if !names_disk(pv.annotation(ANN_VOLUME_IDENTITY).map(String::as_str), found) {
        return None;
    }
    let name = pv.metadata.name.clone()?;
    let uid = pv.metadata.uid.clone()?;
    // The node it is pinned to (what the admission policy checks against its creator's token).
    let pinned = pv
        .spec
        .node_affinity
        .as_ref()
        .and_then(|a| a.required.as_ref())
        .and_then(|r| r.node_selector_terms.first())
        .and_then(|t| t.match_expressions.iter().flatten().find(|e| e.key == LABEL_HOSTNAME && e.operator == "In"))
        .and_then(|e| e.values.as_ref())
        .and_then(|v| (v.len() == 1).then(|| v[0].clone()));
    let node = pinned.clone().or_else(|| pv.label(LABEL_NODE).cloned()).unwrap_or_else(|| "?".into());
    let claimed = pv.spec.claim_ref.as_ref().is_some_and(|c| c.uid.as_deref().is_some_and(|u| !u.is_empty()));
    Some(PvWitness {
        own: pinned.as_deref() == Some(own_host),
        claimed,
        released: matches!(pv.phase(), "Released" | "Failed"),
        deleting: pv.metadata.deletion_timestamp.is_some(),
        superseded: superseded(&uid),
        released_by_operator: released(&uid, &name),
        node,
        name,
        uid,
    })
}

fn hold_pv(p: &PvWitness, why: HoldWhy) -> Decision {
    Decision::Hold { node: p.node.clone(), record: p.name.clone(), uid: Some(p.uid.clone()), why }
}

/// The words of a hold, for the event, the refusal and the inventory.
pub fn hold_words(node: &str, record: &str, uid: Option<&str>, why: HoldWhy) -> String {
    let uid = uid.map(|u| format!(" (UID {u})")).unwrap_or_default();
    match why {
        HoldWhy::ClaimedPv => format!("a claim is bound to PV {record}{uid} of node {node}, which names this disk"),
        HoldWhy::UnclaimedPv => format!(
            "the unclaimed PV {record}{uid} of node {node} names this disk (written with that node's credentials only; `kubectl local-storage release-hold` releases it)"
        ),
        HoldWhy::Record => format!(
            "node {node}'s LocalStorageNode records this disk as used by PV {record}{uid}, and no PV corroborates it (written with that node's credentials only; `kubectl local-storage release-hold` releases it)"
        ),
    }
}

#[cfg(test)]
#[path = "disk_trust_tests.rs"]
mod tests;
