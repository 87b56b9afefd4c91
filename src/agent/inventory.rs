//! The node inventory (core::cluster::inventory): at the end of each pass the agent builds its node's
//! `LocalStorageNode` status and writes it only when its content changed, so an idle node
//! writes nothing. The same object carries the node's cluster-side copy of its used block disks:
//! written before a block PV is created (after the local mark), read back at start-up to
//! restore a lost ledger, and every node's read before a block disk without a local mark is
//! offered, so a used disk moved from another node is wiped first.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::Agent;
use crate::api::inventory::{Found, LocalStorageNode};
use crate::api::{ApiError, node_reference};
use crate::config::VolumeMode;
use crate::core::cluster::inventory::{
    ClassInput, DeviceInventory, DeviceVerdict, EntryInput, HeldDisk, Inputs, InventoryStatus, PvInput, SupersededPv,
    UsedDiskRecord, WriteWait, build, missing_from_ledger, own_records, prune_superseded, record_witnesses,
    same_content, write_wait,
};
use crate::core::devices::device_claim::{DeviceFacts, Verdict};
use crate::core::identity::disk_trust::{
    Decision, Own, OwnMark, PvWitness, WipeCause, disk_label, hold_words, judge, pv_witness,
};
use crate::core::identity::used_mark::{UsedMark, UsedRead};
use crate::core::reconcile::backoff::{Policy, Retries};
use crate::core::volumes::naming::{ANN_RELEASED_HOLDS, LABEL_DISK_ID};
use crate::core::volumes::planner::DesiredPv;
use crate::core::wipe::cleanup::PvState;
use crate::host::devices::claims::ClaimReport;
use crate::host::volumes::discovery::{Scan, SkipReason};

/// Delays after a failed inventory read or write: a missing CRD or a refused write is fixed
/// by an operator, so the retry grows to minutes.
const RETRY: Policy = Policy { initial: Duration::from_secs(1), max: Duration::from_secs(300) };

/// How long a change waits before it is written: the changes of a burst (a node publishing
/// its volumes; a PV released, wiped, deleted and its volume published again) go out as one
/// write, and a change is in the API within this delay of the pass that saw it.
const DELAY: Duration = Duration::from_millis(250);

/// How long a change that is only the API's view of this node's PVs (a phase, a claim, a
/// released PV's cycle under way; see core::cluster::inventory::only_pv_view_changes) waits before it is
/// written, so it goes out with the changes of a minute: a claim bound or a released PV wiped,
/// deleted and published again costs no write of its own (issue 42: requests per released PV at
/// most 3, the PV's delete, finalizer and create). The PV objects show their phase at once; the
/// inventory's view of them is behind by at most this. Every other change (a disk, a verdict, a
/// problem, the used-disk records another node judges by) goes out after [`DELAY`], and takes
/// the waiting view with it.
pub(super) const VIEW_DELAY: Duration = Duration::from_secs(60);

/// How long a change waits while this node's publishing is under way (core::cluster::inventory::
/// WriteWait::Publishing): the passes of a node coming up (volumes found, settled, their PVs
/// created, the store showing them, the PV controller making them Available) go out in one
/// write. The PV controller is throttled for the whole cluster (about 20 PVs a second): 20
/// nodes of 10 volumes coming up together wrote 1.9 times each with 3 s here (the first write
/// found PVs still Pending, the next showed them Available), once with 15 s. The used-disk
/// records never wait; a publishing that takes longer writes what it has by then.
pub(super) const PUBLISHING_DELAY: Duration = Duration::from_secs(15);

/// What a status write carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Writing {
    /// A pass's whole status; `publishing`: this node's publishing is under way
    /// (core::cluster::inventory::WriteWait::Publishing).
    Whole { publishing: bool },
    /// The used-disk copy over what was last written, before block PVs are created.
    Copy,
}

/// What the agent keeps of its inventory between passes.
#[derive(Default)]
pub(super) struct InventoryState {
    /// The status last written (none yet: the next pass writes).
    written: Option<InventoryStatus>,
    /// Whether this agent read its node's object at start-up (its copy restored the ledger).
    loaded: bool,
    /// The object was found absent and not created since: the next write creates it first
    /// instead of learning that from a refused write (one request less per new node).
    absent: bool,
    /// The CRD is not installed: nothing to write or read, said once.
    absent_crd: bool,
    /// The ledger's generation the copy was last taken at, and the copy.
    ledger_generation: Option<u64>,
    copy: Vec<UsedDiskRecord>,
    /// UIDs of other nodes' records whose disk this node wiped (core::cluster::inventory).
    superseded: BTreeSet<String>,
    /// Wipes-first under way of disks another node's record named: host path -> that UID.
    wiping_foreign: BTreeMap<String, String>,
    /// Released PVs of other nodes whose disk this node wiped: UID -> disk label.
    superseded_pvs: BTreeMap<String, String>,
    /// Wipes-first under way of disks another node's released PV named: host path -> (its
    /// UID, the disk label).
    pv_wipes: BTreeMap<String, (String, String)>,
    /// The disks held back by another node's PV or record at the last look.
    holds: Vec<HeldDisk>,
    /// This pass's gathered inputs, until the pass ends.
    devices: Vec<(DeviceInventory, Vec<bool>)>,
    entries: Vec<EntryInput>,
    capacities: BTreeMap<String, u64>,
    /// Found volumes the planner did not publish: host path -> (code, words).
    refused: BTreeMap<String, (String, String)>,
    retries: Retries<&'static str>,
    /// When the first change not yet written was seen, and when it is due (see [`DELAY`]).
    changed_at: Option<Instant>,
    pending: Option<Instant>,
    /// The object may still be an earlier incarnation's of the Node (owned by its UID): it is
    /// read before the next write, which waits until the garbage collector removed it.
    check_owner: bool,
}

#[cfg(test)]
impl InventoryState {
    /// Lets the write delay and the retry deadlines pass (tests step without sleeping).
    pub(super) fn expire_for_test(&mut self) {
        self.retries.expire_for_test(Instant::now());
        if let Some(at) = self.pending.as_mut() {
            *at = Instant::now();
        }
        if let Some(at) = self.changed_at.as_mut() {
            *at = Instant::now() - VIEW_DELAY;
        }
    }

    /// Makes the change not yet written `by` older (tests step without sleeping).
    pub(super) fn age_change_for_test(&mut self, by: Duration) {
        for at in [self.changed_at.as_mut(), self.pending.as_mut()].into_iter().flatten() {
            *at -= by;
        }
    }

    pub(super) fn superseded_for_test(&self) -> &BTreeSet<String> {
        &self.superseded
    }

    pub(super) fn superseded_pvs_for_test(&self) -> &BTreeMap<String, String> {
        &self.superseded_pvs
    }

    pub(super) fn holds_for_test(&self) -> &[HeldDisk] {
        &self.holds
    }
}

#[cfg(test)]
impl Agent {
    /// Judges one new block volume of this identity at /mnt/disks/d as a pass would.
    pub(super) async fn consult_for_test(&mut self, identity: &str) {
        let mut desired = vec![DesiredPv {
            name: "x".into(),
            host_path: "/mnt/disks/d".into(),
            class: "local".into(),
            policy: Default::default(),
            capacity_bytes: 1,
            identity: identity.into(),
            disk: crate::core::volumes::volume_safety::DiskKey::block("8:16"),
            in_use: None,
            used: UsedRead::Unmarked,
            mark_holder: None,
        }];
        self.consult_cluster_records(&mut desired, |_| true).await;
    }
}

/// The version the inventory shows: the crate version and the commit.
fn version() -> String {
    format!("{} ({})", crate::build_info::VERSION, crate::build_info::GIT_COMMIT)
}

/// One device's verdicts, in the inventory's words, and whether each needs an operator.
fn device_inventory(d: &DeviceFacts, report: &ClaimReport) -> (DeviceInventory, Vec<bool>) {
    let mut verdicts = Vec::new();
    let mut needs = Vec::new();
    for decision in report.plan.decisions.iter().filter(|x| x.device == d.name) {
        let (verdict, reason, message, need) = match &decision.verdict {
            Verdict::Claimed { name } => ("Claimed", None, format!("claimed (link {name})"), false),
            Verdict::Claim { name, target, .. } => ("Claiming", None, format!("linking as {name} -> {target}"), false),
            Verdict::NotSelected(why) => ("NotSelected", None, why.clone(), false),
            Verdict::Refused(r) => ("Refused", Some(r.code().to_string()), r.to_string(), r.needs_operator()),
        };
        verdicts.push(DeviceVerdict { class: decision.class.clone(), verdict: verdict.into(), reason, message });
        needs.push(need);
    }
    let link = d.stable_id.as_deref().map(crate::core::devices::device_claim::link_name);
    for (held, verdict) in [(&report.plan.held, "Held"), (&report.plan.kept, "Kept")] {
        for (class, name, what) in held.iter() {
            if link.as_deref() == Some(name.as_str()) {
                verdicts.push(DeviceVerdict {
                    class: class.clone(),
                    verdict: verdict.into(),
                    reason: None,
                    message: what.clone(),
                });
                needs.push(verdict == "Held");
            }
        }
    }
    let inventory = DeviceInventory {
        name: d.name.clone(),
        dev: d.dev.clone(),
        kind: d.kind.as_ref().map(ToString::to_string),
        size: d.size,
        model: d.model.clone(),
        stable_id: d.stable_id.clone(),
        by_id: d.by_id.clone(),
        rotational: d.rotational,
        read_only: d.read_only,
        content: d.content_text(),
        classes: verdicts,
    };
    (inventory, needs)
}

impl Agent {
    /// Notes this pass's devices and verdicts, before the claim report is used up; without a
    /// claim pass, the devices listed without probing (`listed`), with no verdicts.
    pub(super) fn inventory_devices(&mut self, report: Option<&ClaimReport>, listed: &[DeviceFacts]) {
        self.inventory.devices = match report {
            Some(r) if r.failed.is_none() => {
                r.devices.iter().filter(|d| !d.is_unattached_loop()).map(|d| device_inventory(d, r)).collect()
            }
            Some(_) => Vec::new(),
            None => {
                let none = ClaimReport::default();
                listed.iter().filter(|d| !d.is_unattached_loop()).map(|d| device_inventory(d, &none)).collect()
            }
        };
    }

    /// Notes this pass's discovery entries, before publishing uses the scan up.
    pub(super) fn inventory_entries(&mut self, scan: &Scan) {
        let mut entries = Vec::new();
        self.inventory.capacities.clear();
        for v in &scan.volumes {
            self.inventory.capacities.insert(v.host_path.clone(), v.capacity_bytes);
            entries.push(EntryInput {
                class: v.class.clone(),
                host_path: v.host_path.clone(),
                capacity_bytes: Some(v.capacity_bytes),
                ..Default::default()
            });
        }
        for s in &scan.skipped {
            if matches!(s.reason, SkipReason::DeviceHeld(_)) || s.reason.is_class_wide() {
                continue;
            }
            let Some(class) = self.config.storage_class_map.get(&s.class) else { continue };
            let Some(entry) = s.path.file_name().and_then(|n| n.to_str()) else { continue };
            entries.push(EntryInput {
                class: s.class.clone(),
                host_path: crate::core::volumes::pv::host_path(&class.host_dir, entry),
                capacity_bytes: None,
                refused: Some((s.reason.code().to_string(), s.reason.to_string())),
                unresponsive: matches!(s.reason, SkipReason::Unresponsive(_)),
                needs_operator: s.reason.is_evented(),
            });
        }
        self.inventory.entries = entries;
        self.inventory.refused.clear();
    }

    /// Notes a found volume the planner did not publish this pass, and why.
    pub(super) fn inventory_refused(&mut self, host_path: &str, code: &str, words: String) {
        self.inventory.refused.insert(host_path.to_string(), (code.to_string(), words));
    }

    /// Reads this node's object once, at the first pass: its superseded UIDs come back, and
    /// marks its copy holds that the ledger lacks (a lost ledger) are put back into the ledger.
    /// Until it is read, block disks without a local mark are not offered.
    pub(super) async fn load_inventory(&mut self) {
        if self.inventory.loaded || !self.inventory.retries.may_try(&"read", Instant::now(), None) {
            return;
        }
        let node = self.node_info.name.clone();
        let status = match self.cluster.get_inventory(&node).await {
            Ok(Found::Present { status, owner_uid }) => {
                self.inventory.check_owner = owner_uid.as_deref() != Some(self.node_info.uid.as_str());
                status
            }
            Ok(Found::Absent) => {
                self.inventory.absent = true;
                None
            }
            // No CRD: nothing to restore, and no record to wait for (the PVs decide).
            Err(e) if self.crd_absent(&e).await => None,
            Err(e) => return self.inventory_failed("read", format!("reading this node's LocalStorageNode: {e}")),
        };
        self.inventory.retries.succeeded(&"read");
        self.inventory.loaded = true;
        let Some(status) = status else { return };
        self.inventory.superseded = status.superseded.iter().cloned().collect();
        self.inventory.superseded_pvs = status.superseded_pvs.iter().map(|p| (p.uid.clone(), p.disk.clone())).collect();
        let copy = status.used_disks.clone();
        let restore =
            move |ledger: &[crate::core::identity::used_mark::UsedMark]| missing_from_ledger(&copy, ledger, &node);
        match self.on_host(move |host| host.restore_marks(&restore)).await {
            Some(Ok(0)) => {}
            Some(Ok(n)) => {
                let note = format!(
                    "{n} used-disk records of this node were in its LocalStorageNode but not in its ledger (a lost or replaced state directory): put back, so those disks are wiped before they are offered again"
                );
                warn!("{note}");
                self.cluster.event(&node_reference(&self.node), true, "UsedMarksRestored", "Discover", note).await;
            }
            Some(Err(e)) => {
                self.inventory.loaded = false;
                self.inventory_failed("read", format!("restoring the ledger from this node's LocalStorageNode: {e}"));
            }
            None => self.inventory.loaded = false,
        }
    }

    fn inventory_failed(&mut self, what: &'static str, why: String) {
        let at = self.inventory.retries.failed(
            &what,
            RETRY,
            why.clone(),
            None,
            Instant::now(),
            crate::runtime::random_fraction(),
        );
        warn!(error = %why, retry_in_ms = at.saturating_duration_since(Instant::now()).as_millis() as u64, "node inventory: failed; will retry");
    }

    /// When the inventory must be tried again, so the loop wakes for it.
    pub(super) fn inventory_due(&self) -> Option<Instant> {
        // A past deadline whose pass stopped early (no config, the host unreadable) waits for
        // the next pass, which that stop's own retry brings: it must not wake the loop at once.
        let now = Instant::now();
        let pending = self.inventory.pending.filter(|at| *at > now);
        [self.inventory.retries.next_due(now), pending].into_iter().flatten().min()
    }

    /// Whether an answer says the kind does not exist (the CRD is not installed): the agent
    /// works without an inventory then, and says so once.
    async fn crd_absent(&mut self, e: &ApiError) -> bool {
        let absent = matches!(e, ApiError::Request { source: kube::Error::Api(s), .. } if s.code == 404);
        if absent && !self.inventory.absent_crd {
            self.inventory.absent_crd = true;
            let note = "the LocalStorageNode CRD (deploy/base/crd.yaml) is not installed: this node's inventory is not written, and used block disks are recorded on this node only".to_string();
            warn!("{note}");
            self.cluster.event(&node_reference(&self.node), true, "InventoryUnavailable", "Inventory", note).await;
        }
        absent
    }

    /// The ledger's portable block marks, re-read only when the ledger changed.
    async fn refresh_copy(&mut self) {
        let since = self.inventory.ledger_generation;
        match self.on_host(move |host| host.used_copy(since)).await {
            Some(Ok(Some((generation, marks)))) => {
                self.inventory.ledger_generation = Some(generation);
                self.inventory.copy = own_records(marks);
            }
            Some(Ok(None)) => {}
            Some(Err(e)) => warn!(error = %e, "the ledger could not be read for the node inventory's copy"),
            None => {}
        }
    }

    /// Writes `status` when it differs from what was last written; creates the object first
    /// when it does not exist. Returns whether the API holds it now (or there is no CRD).
    /// A pass's whole status waits its delay; the used-disk copy over what was last written
    /// goes now. Only a whole status settles a change seen (its clock and deadline stay until
    /// one is written).
    async fn write_status(&mut self, mut status: InventoryStatus, what: Writing) -> bool {
        let whole = matches!(what, Writing::Whole { .. });
        if self.inventory.written.as_ref().is_some_and(|w| same_content(w, &status)) {
            if whole {
                self.inventory.changed_at = None;
                self.inventory.pending = None;
            }
            return true;
        }
        if !self.inventory.retries.may_try(&"write", Instant::now(), None) {
            return self.inventory.absent_crd;
        }
        if whole {
            let now = Instant::now();
            let since = *self.inventory.changed_at.get_or_insert(now);
            let publishing = matches!(what, Writing::Whole { publishing: true });
            let due = since
                + match write_wait(self.inventory.written.as_ref(), &status, publishing) {
                    WriteWait::Prompt => DELAY,
                    WriteWait::Publishing => PUBLISHING_DELAY,
                    WriteWait::View => VIEW_DELAY,
                };
            if due > now {
                // Written by the pass this deadline wakes, which builds the status anew.
                self.inventory.pending = Some(due);
                return false;
            }
        }
        if whole {
            self.inventory.pending = None;
        }
        if let Err(why) = self.owner_is_current().await {
            self.inventory_failed("write", why);
            return false;
        }
        status.observed_at = Some(k8s_openapi::jiff::Timestamp::now().to_string());
        tracing::debug!(
            ?what,
            volumes = status.summary.volumes,
            available = status.summary.available,
            settling = self.settles.settling,
            expected = !self.expectations.is_empty(),
            first = self.inventory.written.is_none(),
            "node inventory: writing"
        );
        let node = self.node_info.name.clone();
        let mut result =
            if self.inventory.absent { Ok(false) } else { self.cluster.apply_inventory_status(&node, &status).await };
        if let Ok(false) = result {
            result = match self.cluster.create_inventory(&node, &self.node_info.uid).await {
                Ok(()) => {
                    info!(node = %node, "node inventory (LocalStorageNode) created");
                    self.cluster.apply_inventory_status(&node, &status).await
                }
                Err(e) => Err(e),
            };
        }
        match result {
            Ok(true) => {
                self.inventory.retries.succeeded(&"write");
                self.inventory.absent_crd = false;
                self.inventory.absent = false;
                if whole {
                    self.inventory.changed_at = None;
                }
                self.inventory.written = Some(status);
                true
            }
            Ok(false) => {
                self.inventory_failed("write", format!("LocalStorageNode {node} is gone right after it was created"));
                false
            }
            Err(e) => {
                if self.crd_absent(&e).await {
                    // Tried again with backoff (up to 5 minutes): the CRD may be applied later.
                    let random = crate::runtime::random_fraction();
                    self.inventory.retries.failed(&"write", RETRY, e.to_string(), None, Instant::now(), random);
                    return true;
                }
                self.inventory_failed("write", format!("writing LocalStorageNode {node}: {e}"));
                false
            }
        }
    }

    /// The status of this pass, from what it gathered and this node's PVs.
    /// Takes this pass's gathered entries and devices (the next pass gathers its own), so a
    /// node's listing is not copied at every pass.
    fn inventory_status(&mut self, states: &[PvState]) -> InventoryStatus {
        let classes = self
            .config
            .storage_class_map
            .iter()
            .map(|(name, c)| ClassInput {
                name: name.clone(),
                host_dir: c.host_dir.clone(),
                volume_mode: match c.volume_mode {
                    VolumeMode::Block => "Block".into(),
                    VolumeMode::Filesystem => "Filesystem".into(),
                },
                claims_devices: c.devices.is_some(),
            })
            .collect();
        let pvs = states
            .iter()
            .map(|pv| PvInput {
                name: pv.name.clone(),
                class: pv.class.clone(),
                host_path: pv.host_path.clone(),
                phase: pv.phase.clone(),
                capacity_bytes: self.inventory.capacities.get(&pv.host_path).copied(),
                claim: pv.claim.as_ref().map(|(ns, name, _)| format!("{ns}/{name}")),
                deleting: pv.deleting,
                missing: pv.flagged_missing,
                stale: pv.flagged_stale,
                moved_to: pv.moved_to.clone(),
                failing: pv.disk_failing.clone(),
            })
            .collect();
        let mut entries = std::mem::take(&mut self.inventory.entries);
        for e in entries.iter_mut() {
            if let Some((code, words)) = self.inventory.refused.get(&e.host_path) {
                e.refused = Some((code.clone(), words.clone()));
                e.needs_operator = code != "wipe-first";
            }
        }
        build(Inputs {
            node: self.node_info.name.clone(),
            version: version(),
            config_problem: self.config_state.config_problem.clone(),
            unknown_keys: self.config_state.config_warnings.clone(),
            classes,
            devices: std::mem::take(&mut self.inventory.devices),
            entries,
            pvs,
            used_disks: self.inventory.copy.clone(),
            superseded: self.inventory.superseded.iter().cloned().collect(),
            superseded_pvs: self.superseded_pvs(),
            held: self.inventory.holds.clone(),
        })
    }

    fn superseded_pvs(&self) -> Vec<SupersededPv> {
        let pvs = &self.inventory.superseded_pvs;
        pvs.iter().map(|(uid, disk)| SupersededPv { uid: uid.clone(), disk: disk.clone() }).collect()
    }

    /// The end of a pass: the inventory is written when its content changed.
    pub(super) async fn write_inventory(&mut self, states: &[PvState]) {
        self.refresh_copy().await;
        let status = self.inventory_status(states);
        // Publishing is under way while volumes settle, while PVs created or deleted are not
        // yet in the store, and while this node's new PVs wait for the PV controller to make
        // them Available (it is throttled: 20 a second for the whole cluster).
        let publishing = self.settles.settling > 0
            || !self.expectations.is_empty()
            || states.iter().any(|pv| pv.phase == "Pending" && !pv.deleting);
        self.write_status(status, Writing::Whole { publishing }).await;
    }

    /// Before block PVs are created: the copy of the ledger (whose new marks were just
    /// written) goes into the API first, as the local mark went onto the disk. `false`: it
    /// could not, and the block volumes wait (retried with backoff).
    pub(super) async fn copy_marks_before_create(&mut self) -> bool {
        self.refresh_copy().await;
        let Some(written) = self.inventory.written.clone() else {
            // Nothing written yet this run: the whole status goes now.
            let status = InventoryStatus {
                node_name: self.node_info.name.clone(),
                used_disks: self.inventory.copy.clone(),
                superseded: self.inventory.superseded.iter().cloned().collect(),
                superseded_pvs: self.superseded_pvs(),
                ..Default::default()
            };
            return self.write_status(status, Writing::Copy).await;
        };
        if written.used_disks == self.inventory.copy {
            return true;
        }
        let status = InventoryStatus { used_disks: self.inventory.copy.clone(), ..written };
        self.write_status(status, Writing::Copy).await
    }

    /// Before new volumes are planned: each block disk named by a stable ID that is not yet
    /// published here is judged by what the cluster knows of it (core::identity::disk_trust): the PVs
    /// that name it (one label-selected list per disk) and other nodes' used-disk records (one
    /// list of the `LocalStorageNode`s, only when there is such a disk; none without the CRD).
    /// Returns the host paths judged so: their marks are not read back again.
    pub(super) async fn consult_cluster_records(
        &mut self,
        desired: &mut [DesiredPv],
        is_new: impl Fn(&DesiredPv) -> bool,
    ) -> BTreeSet<String> {
        let candidates: Vec<usize> = desired
            .iter()
            .enumerate()
            .filter(|(_, d)| !matches!(d.used, UsedRead::Unknown(_)))
            .filter(|(_, d)| disk_label(&d.identity).is_some())
            .filter(|(_, d)| is_new(d))
            .map(|(i, _)| i)
            .collect();
        let mut holds = Vec::new();
        let mut by_reason: BTreeMap<&'static str, i64> = BTreeMap::new();
        let mut decided = BTreeSet::new();
        if candidates.is_empty() {
            self.metrics.set_held_disks(&by_reason);
            self.inventory.holds = holds;
            return decided;
        }
        if !self.inventory.loaded {
            for &i in &candidates {
                let why = "this node's LocalStorageNode (its copy of the used-disk records) is not read yet";
                desired[i].used = UsedRead::Unknown(why.into());
            }
            self.inventory.holds = holds;
            return decided;
        }
        let node = self.node_info.name.clone();
        // Other nodes' records, and the holds an operator released on this node's object (an
        // annotation no agent token may write). Without the CRD: no records, the PVs decide.
        let listed = match self.cluster.list_inventories().await {
            Ok(listed) => Some(listed),
            Err(e) if self.crd_absent(&e).await => Some(Vec::new()),
            Err(e) => {
                warn!(error = %e, "the cluster's used-disk records (LocalStorageNodes) cannot be read");
                None
            }
        };
        let mut released = BTreeSet::new();
        let records: Option<Vec<(String, Vec<UsedDiskRecord>)>> = listed.map(|listed| {
            listed
                .into_iter()
                .filter_map(|o: LocalStorageNode| {
                    let name = o.metadata.name?;
                    if name == node
                        && let Some(list) = o.metadata.annotations.as_ref().and_then(|a| a.get(ANN_RELEASED_HOLDS))
                    {
                        released.extend(list.split(',').map(str::trim).filter(|u| !u.is_empty()).map(String::from));
                    }
                    Some((name, o.status?.used_disks))
                })
                .collect()
        });
        if let Some(records) = &records {
            let recorded: BTreeSet<String> =
                records.iter().flat_map(|(_, r)| r.iter().filter_map(|r| r.uid.clone())).collect();
            prune_superseded(&mut self.inventory.superseded, &recorded);
        }
        let host = self.node_info.hostname().to_string();
        for i in candidates {
            let d = &desired[i];
            let Some(label) = disk_label(&d.identity) else { continue };
            let pvs = match self.cluster.list_pvs_labelled(LABEL_DISK_ID, &label).await {
                Ok(found) => {
                    let superseded = &self.inventory.superseded_pvs;
                    // A superseded PV that is gone supersedes nothing any more.
                    let uids: BTreeSet<&str> = found.iter().filter_map(|p| p.metadata.uid.as_deref()).collect();
                    let gone: Vec<String> = superseded
                        .iter()
                        .filter(|(uid, disk)| **disk == label && !uids.contains(uid.as_str()))
                        .map(|(uid, _)| uid.clone())
                        .collect();
                    let witnesses: Vec<PvWitness> = found
                        .iter()
                        .filter_map(|p| {
                            pv_witness(p, &d.identity, &host, &|u| superseded.contains_key(u), &|u, n| {
                                released.contains(u) || released.contains(n)
                            })
                        })
                        .collect();
                    for uid in gone {
                        self.inventory.superseded_pvs.remove(&uid);
                    }
                    Some(witnesses)
                }
                Err(e) => {
                    warn!(path = %d.host_path, error = %e, "the PVs that may name a block disk cannot be listed");
                    None
                }
            };
            let recs = records.as_ref().map(|records| {
                let lists = records.iter().map(|(n, r)| (n.as_str(), r.as_slice()));
                record_witnesses(lists, &self.inventory.superseded, &released, &node, &d.identity)
            });
            let mark = match &d.used {
                UsedRead::Marked(_) => OwnMark::Used,
                UsedRead::Offered(_) => OwnMark::Offered,
                _ => OwnMark::None,
            };
            // This node published the disk, a claim released it and it wiped it here (its last
            // wipe, of this very disk). A disk it withdrew unclaimed is not let go in this sense:
            // it may have been used on another node since (core::identity::disk_trust::Own).
            let let_go = self.cleaner.last_wipe_for(&d.host_path, &d.identity).is_some();
            let decision = judge(Own { mark, let_go }, pvs.as_deref(), recs.as_deref());
            decided.insert(d.host_path.clone());
            let d = &mut desired[i];
            match decision {
                Decision::Publish | Decision::WipeFirst { because: WipeCause::OwnMark } => {}
                Decision::WipeFirst { because: WipeCause::ReleasedPv { node: owner, pv, uid } } => {
                    info!(path = %d.host_path, pv = %pv, node = %owner, "a block disk a claim used on another node (its PV released): wiped before it is offered");
                    self.inventory.pv_wipes.insert(d.host_path.clone(), (uid.clone(), label.clone()));
                    d.used = UsedRead::Marked(foreign_mark(&owner, &pv, Some(uid), &d.identity));
                }
                Decision::WipeFirst { because: WipeCause::ReleasedRecord { node: owner, pv, uid } } => {
                    info!(path = %d.host_path, pv = %pv, node = %owner, "a block disk another node recorded, its hold released by an operator: wiped before it is offered");
                    d.used = UsedRead::Marked(foreign_mark(&owner, &pv, uid, &d.identity));
                }
                Decision::Hold { node: owner, record, uid, why } => {
                    let words = hold_words(&owner, &record, uid.as_deref(), why);
                    *by_reason.entry(why.code()).or_default() += 1;
                    info!(path = %d.host_path, "block disk held: {words}");
                    holds.push(HeldDisk {
                        path: d.host_path.clone(),
                        node: owner,
                        record,
                        uid,
                        reason: why.code().to_string(),
                        message: words.clone(),
                    });
                    d.used = UsedRead::Unknown(words);
                }
                Decision::Unknown(why) => d.used = UsedRead::Unknown(why),
            }
        }
        self.metrics.set_held_disks(&by_reason);
        self.inventory.holds = holds;
        decided
    }

    /// The Node was re-created: what was written went to the old incarnation's object.
    pub(super) fn inventory_node_changed(&mut self) {
        self.inventory.written = None;
        self.inventory.check_owner = true;
    }

    /// Whether the object is this incarnation's (or absent): an earlier incarnation's is left
    /// to the garbage collector, and the write waits (retried) until it is gone.
    async fn owner_is_current(&mut self) -> Result<(), String> {
        if !self.inventory.check_owner {
            return Ok(());
        }
        let node = self.node_info.name.clone();
        match self.cluster.get_inventory(&node).await {
            Ok(Found::Present { owner_uid, .. }) if owner_uid.as_deref() != Some(self.node_info.uid.as_str()) => {
                Err(format!(
                    "LocalStorageNode {node} belongs to an earlier incarnation of the Node; waiting for the garbage collector to remove it"
                ))
            }
            Ok(_) => {
                self.inventory.check_owner = false;
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// A wipe-first of a disk another node's record named is starting at `host_path`.
    pub(super) fn wiping_foreign(&mut self, host_path: &str, uid: Option<&str>, node: &str) {
        if let Some(uid) = uid.filter(|_| node != self.node_info.name) {
            self.inventory.wiping_foreign.insert(host_path.to_string(), uid.to_string());
        }
    }

    /// A wipe finished: a completed wipe-first of a disk another node recorded supersedes that
    /// record here (the disk is clean; it gets this node's own record when published), and one
    /// of a disk another node's released PV named supersedes that PV.
    pub(super) fn inventory_wipe_done(&mut self, key: &crate::core::reconcile::effect_key::EffectKey, ok: bool) {
        let crate::core::reconcile::effect_key::EffectKey::WipeFirst(path) = key else { return };
        if let Some(uid) = self.inventory.wiping_foreign.remove(path)
            && ok
        {
            self.inventory.superseded.insert(uid);
        }
        if let Some((uid, disk)) = self.inventory.pv_wipes.remove(path)
            && ok
        {
            self.inventory.superseded_pvs.insert(uid, disk);
        }
    }
}

/// The mark a wipe-first of another node's disk is carried out under (what its events name):
/// that node's PV, as a used mark of the disk found.
fn foreign_mark(node: &str, pv: &str, uid: Option<String>, identity: &str) -> UsedMark {
    UsedMark {
        pv: pv.to_string(),
        node: node.to_string(),
        path: "?".into(),
        identity: identity.to_string(),
        at: String::new(),
        uid,
        root: None,
        claimed: true,
        wiped_filesystems: Vec::new(),
    }
}
