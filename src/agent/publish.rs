//! Publishing: new volumes become PVs once they settled and their disk carries its used mark;
//! PVs that upstream or an older version made for this node are adopted.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use futures::{StreamExt, stream};
use tracing::{debug, info, warn};

use super::Agent;
use crate::api::{AnnotationPatch, ApiError, Created, TakeOver, node_reference};
use crate::config::VolumeMode;
use crate::core::identity::used_mark::{UsedMark, UsedRead};
use crate::core::reconcile::backoff::Policy;
use crate::core::reconcile::effect_key::EffectKey;
use crate::core::reconcile::expectations::Expected;
use crate::core::volumes::desired::{class_policy, desired_from};
use crate::core::volumes::naming::{ANN_VOLUME_IDENTITY, FINALIZER_WIPE, LABEL_NODE};
use crate::core::volumes::planner::{
    Action, DesiredPv, ExistingPv, ObservedPv, Refusal, classify_existing, desired_named, needs_adoption,
    plan_adoption, plan_expecting,
};
use crate::core::volumes::pv::{ClassPolicy, PvContext};
use crate::core::volumes::pv_facts::PvFacts;
use crate::core::wipe::cleanup::PvState;
use crate::core::wipe::wipe_history::{ANN_EARLIER_WIPES, ANN_LAST_WIPE};
use crate::host::volumes::discovery::Scan;
use crate::wiper::{Busy, target_at, target_for};

/// Volumes published (or their used marks checked) together. A node that comes up with
/// thousands of volumes publishes them batch after batch in one pass, so the marks, requests and
/// answers in memory at once are one batch's (measured with bench/bulk-publish.sh 1000: about
/// 2 MiB less at the peak), while a batch is still large enough that its one host call and
/// ledger write cost little.
pub(super) const PUBLISH_BATCH: usize = 100;

/// Delays before a PV name found taken by another volume is tried again: the other PV may be
/// deleted at any time (upstream tries again on its next loop), and a name taken for good
/// costs one create and one read per 5 minutes.
pub(super) const COLLISION_RETRY: Policy =
    Policy { initial: std::time::Duration::from_secs(5), max: std::time::Duration::from_secs(300) };

impl Agent {
    /// Plans and carries out this pass's publishing from the scan. Returns the number of
    /// desired PVs and of actions planned.
    pub(super) async fn publish(&mut self, scan: Scan, revealed: Instant, predecessors: &[PvState]) -> (usize, usize) {
        let mut unpublished_by_reason: BTreeMap<&'static str, i64> = BTreeMap::new();
        for s in &scan.skipped {
            *unpublished_by_reason.entry(s.reason.code()).or_default() += 1;
        }
        self.report_skips(&scan).await;
        self.marks.found_disks = scan.volumes.iter().map(|v| (v.host_path.clone(), v.identity.clone())).collect();
        let mut scan = scan;
        // A new volume is published once it has stayed (same disk at the same path) for the
        // settle window, counted from the event that revealed it.
        let keys = scan.volumes.iter().map(|v| format!("{}\n{}", v.host_path, v.identity));
        let (settled, next_new) =
            self.settles.new_volumes.observe_since(keys, revealed, Instant::now(), self.settles.settle);
        self.settles.next_settle = next_new;
        let found = scan.volumes.len();
        scan.volumes.retain(|v| settled.contains(&format!("{}\n{}", v.host_path, v.identity)));
        self.settles.settling = found - scan.volumes.len();
        let policies = self.class_policies();
        let ctx =
            PvContext { config: &self.config, node: &self.node_info, provisioner_name: &self.identity.provisioner };
        // The scan's volumes move into the desired PVs: one copy of their strings at a time.
        let (mut desired, problems) = desired_from(&ctx, std::mem::take(&mut scan.volumes), &policies);
        drop(scan);
        for p in problems {
            let note = format!("volumes of StorageClass {} are not published: {}", p.class, p.message);
            self.report_node_problem("ClassUnavailable", note).await;
        }
        let pvs = self.pv_store.state();
        let observed: Vec<ObservedPv> = pvs.iter().map(|pv| ObservedPv::from_pv(pv)).collect();
        // PVs left by an earlier incarnation of this Node: their names wait for succession to
        // decide (re-adopt or withdraw) instead of being reported as taken.
        desired.retain(|d| !predecessors.iter().any(|p| p.name == d.name));
        // The PVs this agent created that the store does not show yet (core::reconcile::expectations).
        let expected = self.expectations.pending();
        let names: BTreeSet<&str> = pvs.iter().filter_map(|pv| pv.metadata.name.as_deref()).collect();
        let is_new = |d: &DesiredPv| {
            !names.contains(d.name.as_str()) && !expected.iter().any(|e| e.is(&d.name, &d.host_path, &d.identity))
        };
        let judged = self.consult_cluster_records(&mut desired, is_new).await;
        self.find_mark_holders(&mut desired, &expected, &judged).await;
        let waiting = self.waiting_collisions(&desired);
        let actions = plan_expecting(&self.identity, &desired, &observed, &waiting, &expected);
        for action in &actions {
            match action {
                Action::Refuse { reason, .. } => *unpublished_by_reason.entry(reason.code()).or_default() += 1,
                Action::WipeFirst { .. } => *unpublished_by_reason.entry("wipe-first").or_default() += 1,
                Action::Create { .. } => {}
            }
        }
        self.metrics.set_unpublished(&unpublished_by_reason);
        let planned = actions.len();
        self.execute(actions, &desired).await;
        (desired.len(), planned)
    }

    /// The PV names found taken by another volume whose retry is not due: the planner refuses
    /// them without a request. Names no longer wanted are forgotten; a due one is tried again.
    fn waiting_collisions(&mut self, desired: &[DesiredPv]) -> BTreeMap<String, String> {
        self.foreign.retain(|name, _| desired.iter().any(|d| d.name == *name));
        let names: Vec<String> = self.foreign.keys().cloned().collect();
        names
            .into_iter()
            .filter(|name| !self.effects.due(&EffectKey::Collision(name.clone())))
            .filter_map(|name| Some((name.clone(), self.foreign.get(&name)?.clone())))
            .collect()
    }

    fn class_policies(&self) -> BTreeMap<String, Result<ClassPolicy, String>> {
        let classes = self.sc_store.state();
        self.config
            .storage_class_map
            .keys()
            .map(|class| {
                let policy = match classes.iter().find(|sc| sc.metadata.name.as_deref() == Some(class)) {
                    Some(sc) => class_policy(class, sc.reclaim_policy.as_deref(), sc.mount_options.as_deref()),
                    None => Err(format!(
                        "StorageClass {class:?} does not exist; create it (provisioner kubernetes.io/no-provisioner)"
                    )),
                };
                (class.clone(), policy)
            })
            .collect()
    }

    async fn execute(&mut self, actions: Vec<Action>, desired: &[DesiredPv]) {
        let mut creates = Vec::new();
        let busy = self.cleaner.busy(&[]);
        for action in actions {
            match action {
                Action::Create { name, host_path } => {
                    let Some(d) = desired_named(desired, &name, &host_path) else { continue };
                    if self.effects.due(&EffectKey::Create(name.clone())) {
                        creates.push(d);
                    }
                }
                Action::WipeFirst { name, host_path, identity, mark } => {
                    let words =
                        format!("held the data of PV {} (node {}); wiped before it is published", mark.pv, mark.node);
                    self.inventory_refused(&host_path, "wipe-first", words);
                    self.wipe_first(&busy, desired, name, host_path, identity, mark).await;
                }
                Action::Refuse { name, host_path, reason } => {
                    self.inventory_refused(&host_path, reason.code(), reason.to_string());
                    // The PV that holds the disk may be another node's (its deletion is no
                    // event here), and unreadable records may become readable: looked at again
                    // on a growing deadline, not only at the resync.
                    if matches!(reason, Refusal::DiskPublished { .. } | Refusal::UsedUnknown { .. }) {
                        self.effects.wait_out(&EffectKey::Held(host_path.clone()), &reason.to_string());
                    }
                    let note = format!("volume at {host_path} not published as {name}: {reason}");
                    if self.report_unpublished(format!("refuse/{name}/{host_path}/{reason}"), &name, note).await {
                        warn!(pv = %name, path = %host_path, "volume not published: {reason}");
                    }
                }
            }
        }
        for batch in creates.chunks(PUBLISH_BATCH) {
            self.publish_batch(batch.to_vec()).await;
        }
    }

    /// Publishes one batch of volumes: their used marks written in one host call, their PVs
    /// created (`concurrency` requests at a time), then the marks completed with the UIDs.
    async fn publish_batch(&mut self, creates: Vec<&DesiredPv>) {
        let mut creates = self.mark_before_create(creates).await;
        // A block disk's marks go into the cluster-side copy before its PV exists, as they went
        // into the ledger; while they cannot, its PV waits.
        let portable = |d: &&DesiredPv| crate::core::cluster::inventory::is_portable_block(&d.identity);
        if creates.iter().any(portable) && !self.copy_marks_before_create().await {
            creates.retain(|d| !portable(d));
        }
        // A volume of an encrypting class is published only with its key and data directory.
        let keys = self.prepare_encrypted(&mut creates).await;
        let keys = &keys;
        let mut created = Vec::new();
        let mut published = BTreeSet::new();
        let cluster = &self.cluster;
        let ctx =
            PvContext { config: &self.config, node: &self.node_info, provisioner_name: &self.identity.provisioner };
        let ctx = &ctx;
        let cleaner = &self.cleaner;
        // Each object is built as its request starts, so no more than `concurrency` of them
        // exist at once, however many volumes a pass publishes. A volume wiped after its last
        // PV was released carries that wipe on its new PV's annotation (core::wipe::wipe_history),
        // which `kubectl describe pv` shows: no request more than the create; the log tells
        // it in words.
        let results: Vec<(&DesiredPv, Option<String>, Result<Created, ApiError>)> = stream::iter(creates)
            .filter_map(|d| async move {
                let mut pv = ctx.pv_for(d)?;
                if let Some(key) = keys.get(&d.name) {
                    crate::core::volumes::encryption::encrypt_pv(&mut pv, key);
                }
                let last = cleaner.last_wipe_for(&d.host_path, &d.identity);
                if let Some(last) = &last {
                    let annotations = pv.metadata.annotations.get_or_insert_default();
                    annotations.insert(ANN_LAST_WIPE.into(), last.annotation());
                    if let Some(earlier) = last.earlier_annotation() {
                        annotations.insert(ANN_EARLIER_WIPES.into(), earlier);
                    }
                }
                Some((d, last.map(|l| l.note()), pv))
            })
            .map(|(d, told, pv)| async move { (d, told, cluster.create_pv(&pv).await) })
            .buffer_unordered(self.concurrency)
            .collect()
            .await;
        for (d, told, result) in results {
            let (name, path) = (d.name.clone(), d.host_path.clone());
            self.effects.record(&EffectKey::Create(name.clone()), &result);
            if let Some(key) = keys.get(&name) {
                self.settle_readied_key(d, key, &result).await;
            }
            match result {
                Ok(Created::Created { uid }) => {
                    info!(pv = %name, path = %path, "created PV");
                    self.name_free(&name);
                    if let Some(note) = told {
                        info!(pv = %name, uid = %uid, "{note}");
                    }
                    published.insert(path.clone());
                    if !uid.is_empty() {
                        self.expectations.created(Expected {
                            name: name.clone(),
                            uid: uid.clone(),
                            host_path: path.clone(),
                            identity: d.identity.clone(),
                            at: Instant::now(),
                        });
                        created.push(PvState {
                            name: name.clone(),
                            uid,
                            host_path: path.clone(),
                            class: d.class.clone(),
                            phase: "Available".into(),
                            identity: Some(d.identity.clone()),
                            ..Default::default()
                        });
                    }
                    let block = self
                        .config
                        .storage_class_map
                        .get(&d.class)
                        .is_some_and(|c| matches!(c.volume_mode, VolumeMode::Block));
                    self.metrics.pv_created(if block { "block" } else { "fs" }, d.capacity_bytes);
                }
                Ok(Created::AlreadyExists(existing)) => {
                    let classified = classify_existing(&self.identity, d, &ObservedPv::from_pv(&existing));
                    if let ExistingPv::Ours { .. } = classified {
                        self.name_free(&name);
                    }
                    match classified {
                        ExistingPv::Ours { needs_label: true } => {
                            let key = EffectKey::AdoptPv(name.clone());
                            if self.effects.due(&key) {
                                let result = self.take_over(&existing).await;
                                self.effects.record(&key, &result);
                                if result.is_ok() {
                                    info!(pv = %name, path = %path, "adopted existing PV");
                                }
                            }
                        }
                        ExistingPv::Ours { needs_label: false } => debug!(pv = %name, "PV already exists"),
                        ExistingPv::Foreign { owner } => {
                            // Tried again with backoff (the other PV may go); reported once per
                            // occurrence, under the key of the planner's refusal of it meanwhile.
                            let reason = Refusal::NameTaken { owner: owner.clone() };
                            if self.problems.first_seen(format!("refuse/{name}/{path}/{reason}")) {
                                warn!(pv = %name, path = %path, "PV name taken by {owner}; not overwriting it");
                                let note =
                                    format!("volume at {path} not published: PV name {name} is taken by {owner}");
                                self.cluster
                                    .event(&self.pv_ref(&name), true, "VolumeNameCollision", "Publish", note)
                                    .await;
                            } else {
                                debug!(pv = %name, path = %path, "PV name still taken by {owner}");
                            }
                            self.effects.wait_out_for(&EffectKey::Collision(name.clone()), &owner, COLLISION_RETRY);
                            // The create was answered, but did not publish: the retry is no repeat.
                            self.effects.forget(&EffectKey::Create(name.clone()));
                            self.foreign.insert(name, owner);
                        }
                    }
                }
                // An admission policy or RBAC said no: an operator must act. Reported as a
                // Warning once per occurrence; retried with backoff.
                Err(e) if e.is_refusal() => {
                    let note = format!("volume at {path} not published as {name}: the API refused it: {e}");
                    self.report_unpublished(format!("create-refused/{name}/{path}"), &name, note).await;
                }
                Err(_) => {}
            }
        }
        // The UID goes on the disk's mark at once: from now on the mark alone says the disk was
        // offered, whatever happens to the PV while this agent is down.
        self.mark_pvs(created).await;
        // The wipes told on the new PVs are forgotten; so are wipes of paths published now by
        // another disk: they were not its.
        self.cleaner.forget_history(published);
    }

    /// The name `name` is this node's volume's now (created, or found ours): no longer taken.
    fn name_free(&mut self, name: &str) {
        if self.foreign.remove(name).is_some() {
            self.effects.forget(&EffectKey::Collision(name.to_string()));
        }
    }

    /// Labels the PVs upstream (or an older version) made for this node, reading the
    /// cluster's PVs page by page and keeping only this node's. Retried with backoff until
    /// one pass completes.
    pub(super) async fn adopt(&mut self) {
        if !self.effects.due(&EffectKey::Adopt) {
            return;
        }
        let identity = self.identity.clone();
        // Judged page by page from names, labels and annotations alone: only this node's PVs
        // are ever held, however many the cluster has, and no other PV is decoded whole.
        let listed =
            self.cluster.list_pv_ownership_where(|pv| needs_adoption(&identity, &ObservedPv::from_ownership(pv))).await;
        let kept = match listed {
            Ok(kept) => kept,
            Err(e) => {
                return self.effects.record::<(), _>(&EffectKey::Adopt, &Err(format!("listing PVs for adoption: {e}")));
            }
        };
        // Each kept PV read whole (what taking it over reads and its resourceVersion), and
        // judged again below as it is now; one gone meanwhile has nothing to adopt.
        let mut all = Vec::with_capacity(kept.len());
        for name in kept.iter().filter_map(|pv| pv.metadata.name.as_deref()) {
            match self.cluster.get_pv(name).await {
                Ok(Some(pv)) => all.push(pv),
                Ok(None) => {}
                Err(e) => {
                    let why = format!("reading PV {name} for adoption: {e}");
                    return self.effects.record::<(), _>(&EffectKey::Adopt, &Err(why));
                }
            }
        }
        let observed: Vec<ObservedPv> = all.iter().map(ObservedPv::from_pv).collect();
        let names = plan_adoption(&identity, &observed);
        let mut ok = true;
        for name in names {
            let Some(pv) = all.iter().find(|pv| pv.metadata.name.as_deref() == Some(name.as_str())) else { continue };
            // A PV of an earlier incarnation of this Node only gets our label here, so the watch
            // sees it; succession then decides from the disk whether to take it over.
            let result = if identity.owns(&ObservedPv::from_pv(pv)) {
                self.take_over(pv).await
            } else {
                let patch = TakeOver {
                    labels: BTreeMap::from([(LABEL_NODE.to_string(), identity.node_label.clone())]),
                    ..Default::default()
                };
                self.cluster.take_over_pv(&name, pv.metadata.resource_version.as_deref(), &patch).await
            };
            match result {
                Ok(()) => info!(pv = %name, "adopted existing PV of this node"),
                Err(e) => {
                    warn!(pv = %name, error = %e, "adopting PV failed");
                    ok = false;
                }
            }
        }
        let result = if ok { Ok(()) } else { Err("some PVs could not be adopted") };
        self.effects.record(&EffectKey::Adopt, &result);
        self.adopted = ok;
    }

    /// Puts our label, our finalizer and (when the volume is there) its identity on a PV made
    /// for this node by upstream or an older version, in one patch guarded by resourceVersion.
    pub(super) async fn take_over(&self, pv: &PvFacts) -> Result<(), ApiError> {
        let name = pv.metadata.name.clone().unwrap_or_default();
        let mut finalizers = pv.metadata.finalizers.clone().unwrap_or_default();
        if !finalizers.iter().any(|f| f == FINALIZER_WIPE) {
            finalizers.push(FINALIZER_WIPE.to_string());
        }
        let state = PvState::from_pv(pv);
        let mut annotations = AnnotationPatch::new();
        if state.identity.is_none()
            && let Ok(target) = target_for(&state, self.config.storage_class_map.get(&state.class))
        {
            match self.volume_identity(&state.host_path, target.path).await {
                Ok(id) => annotations = annotations.set(ANN_VOLUME_IDENTITY, id),
                Err(e) => warn!(pv = %name, error = %e, "cannot record the volume identity of an adopted PV"),
            }
        }
        let patch = TakeOver {
            labels: BTreeMap::from([(LABEL_NODE.to_string(), self.identity.node_label.clone())]),
            annotations,
            finalizers: Some(finalizers),
        };
        self.cluster.take_over_pv(&name, pv.metadata.resource_version.as_deref(), &patch).await
    }

    /// For disks whose used mark names a PV that is not one of this node's (a disk moved here
    /// from another node, or a PV already gone), reads that PV once: the planner holds the disk
    /// back while that PV records it, and wipes it first when no live PV does. A PV that cannot
    /// be read leaves the disk unknown, so it is neither published nor wiped this pass.
    async fn find_mark_holders(&mut self, desired: &mut [DesiredPv], expected: &[Expected], judged: &BTreeSet<String>) {
        let store = self.pv_store.state();
        let busy = self.cleaner.busy(&[]);
        let mut fetched: BTreeMap<String, Result<Option<PvFacts>, String>> = BTreeMap::new();
        for d in desired.iter_mut() {
            let (UsedRead::Marked(mark) | UsedRead::Offered(mark)) = &d.used else { continue };
            // A block disk judged by every PV that names it (core::identity::disk_trust): a PV of the
            // mark's name that does not name the disk by identity holds nothing.
            if judged.contains(&d.host_path) {
                continue;
            }
            // A volume this agent just created: the planner waits for the store to show it,
            // whatever its mark says, so its PV is not read back.
            if expected.iter().any(|e| e.is(&d.name, &d.host_path, &d.identity)) {
                continue;
            }
            let name = mark.pv.clone();
            // An offered disk (its PV withdrawn unclaimed by this agent: deleted by hand, for
            // one) whose mark names the PV it is about to be published as: the create answers
            // whether a PV of that name exists (AlreadyExists, judged as usual), and no wipe
            // hangs on it, so it is not read first.
            if matches!(d.used, UsedRead::Offered(_)) && name == d.name {
                continue;
            }
            // Also when it names the PV this disk would be published as: a PV of that name
            // missing from the label-scoped store (its label removed) still holds the disk.
            if store.iter().any(|pv| pv.metadata.name.as_deref() == Some(name.as_str())) {
                continue;
            }
            // Being wiped first (or backing off after a failed wipe-first): decided already.
            if busy.paths.contains(&d.host_path) {
                continue;
            }
            if !fetched.contains_key(&name) {
                let got = self.cluster.get_pv(&name).await.map_err(|e| e.to_string());
                fetched.insert(name.clone(), got);
            }
            match &fetched[&name] {
                Ok(Some(pv)) => d.mark_holder = Some(ObservedPv::from_pv(pv)),
                Ok(None) => {}
                Err(e) => {
                    d.used = UsedRead::Unknown(format!("the PV its used mark names, {name}, cannot be read: {e}"));
                }
            }
        }
    }

    /// Starts wiping a used disk that no live PV names (see core::identity::used_mark), once per
    /// occurrence reported; a failed wipe backs off in the cleaner before it is tried again.
    async fn wipe_first(
        &mut self,
        busy: &Busy,
        desired: &[DesiredPv],
        name: String,
        host_path: String,
        identity: String,
        mark: UsedMark,
    ) {
        if busy.paths.contains(&host_path) {
            return;
        }
        let Some(d) = desired_named(desired, &name, &host_path) else { return };
        let target = match target_at(&host_path, &d.class, self.config.storage_class_map.get(&d.class)) {
            Ok(target) => target,
            Err(e) => return warn!(path = %host_path, error = %e, "cannot locate a used volume to wipe it"),
        };
        let note = format!(
            "volume at {host_path} held the data of PV {} (node {}, {}), which no longer names it; it is wiped before it is published as {name}",
            mark.pv, mark.node, mark.path
        );
        if self.problems.first_seen(format!("wipe-first/{host_path}/{identity}")) {
            warn!(path = %host_path, pv = %mark.pv, "{note}");
            self.node_event(None, "VolumeUsed", "Wipe", note).await;
        }
        self.wiping_foreign(&host_path, mark.uid.as_deref(), &mark.node);
        self.cleaner.start_wipe_first(&name, &host_path, &identity, target, node_reference(&self.node));
    }
}
