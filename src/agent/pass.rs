//! One pass of the agent, as a pipeline in kubelet's reconciler shape: each stage takes what
//! the stage before it returned, so no stage can read what another has not prepared, and the
//! order the steps depend on is the order of the types, not of comments.
//!
//! ```text
//! prepare ──> read_api ──> ApiView ──> read_host ──> HostView ──> judge ──> Judgement
//!                                                                            │
//!            finish <── Applied <── apply (publish, succession, presence, keys,
//!                                          fences, identities, marks, wipes, health)
//! ```
//!
//! Every stage is level-triggered: it computes what to do from this pass's views alone, so
//! after any event or restart the next pass is right from scratch.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use tracing::debug;

use super::Agent;
use super::health::Judged;
use crate::core::fence::startup_taint::PassOutcome;
use crate::core::health::disk_health::Signs;
use crate::core::reconcile::effect_key::EffectKey;
use crate::core::volumes::planner::ObservedPv;
use crate::core::wipe::cleanup::PvState;
use crate::host::access::Observation;
use crate::host::ops::Subject;
use crate::host::volumes::discovery::SkipReason;

/// What the API holds for this pass: this node's PVs, and those an earlier incarnation of this
/// Node left (read once from the PV store).
pub(super) struct ApiView {
    /// How many PVs the store showed (the pass's log line).
    shown: usize,
    /// This node's PVs.
    states: Vec<PvState>,
    /// The PVs an earlier incarnation of this Node (same name, another UID) left.
    predecessors: Vec<PvState>,
    /// `states` with those this agent deleted marked as being deleted, when there are any (the
    /// store lags its own deletes): the rules that withdraw unbound PVs read these.
    deleting: Option<Vec<PvState>>,
}

impl ApiView {
    /// The PVs for the rules that withdraw unbound PVs (vanished, failing, changed device): one
    /// this agent deleted is being deleted, whatever the lagging store still shows, so it is
    /// not withdrawn (nor told) again. Everything else (its wipe or finalizer, succession)
    /// reads `states`, which shows whether a claim came meanwhile.
    fn going(&self) -> &[PvState] {
        self.deleting.as_deref().unwrap_or(&self.states)
    }
}

/// What the host showed in this pass, with the failing signs gathered in one place.
pub(super) struct HostView {
    observation: Observation,
    /// The failing signs by host path: the scan's, and the I/O errors the presence checks met.
    signs: Vec<(String, Signs)>,
    /// The node's block devices now (an unresponsive device that is gone is forgotten).
    devices: BTreeSet<String>,
    /// Host paths of the entries whose look did not answer in time.
    unresponsive: Vec<String>,
}

/// The disks judged (failing signs and growths), and when the changes this pass may publish
/// were revealed.
pub(super) struct Judgement {
    judged: Judged,
    revealed: Instant,
    /// How long the pass took up to here (the discovery-duration metric).
    discovery_time: Duration,
}

/// What the effects stage did, for the pass's end.
pub(super) struct Applied {
    desired: usize,
    planned: usize,
    discovery_time: Duration,
    /// The earliest settle window of a vanished or stale volume still open.
    next_settle: Option<Instant>,
}

impl Agent {
    /// One pass: the pipeline above. `revealed`: when the latest change event arrived (new
    /// volumes settle from there).
    pub(super) async fn reconcile_once(&mut self, revealed: Option<Instant>) {
        let started = Instant::now();
        if !self.prepare().await {
            return;
        }
        let api = self.read_api();
        let Some(host) = self.read_host(&api).await else { return };
        let (judgement, scan_done) = self.judge(&api, host, revealed, started).await;
        let applied = self.apply(&api, scan_done, judgement).await;
        self.finish(&api, applied, started).await;
    }

    /// The configuration and the watches this pass works with, then adoption and the
    /// inventory: false when there is no usable configuration (nothing else runs).
    async fn prepare(&mut self) -> bool {
        self.follow_watched_node();
        self.reload_config().await;
        self.tell_config_findings().await;
        self.watch_dirs().await;
        self.say_watch_shortage().await;
        if !self.has_config {
            return false;
        }
        self.effects.begin_pass();
        if !self.adopted {
            self.adopt().await;
        }
        self.load_inventory().await;
        true
    }

    /// This pass's view of the API, from the PV store.
    fn read_api(&mut self) -> ApiView {
        let pvs = self.pv_store.state();
        // What the store shows of the PVs this agent created or deleted (core::reconcile::expectations).
        let shown = pvs.iter().map(|pv| {
            let meta = &pv.metadata;
            (meta.name.as_deref().unwrap_or(""), meta.uid.as_deref().unwrap_or(""), meta.deletion_timestamp.is_some())
        });
        self.expectations.observe(shown, Instant::now());
        let (mut states, mut predecessors) = (Vec::new(), Vec::new());
        for pv in &pvs {
            let observed = ObservedPv::from_pv(pv);
            if self.identity.owns(&observed) {
                states.push(PvState::from_pv(pv));
            } else if self.identity.is_predecessor(&observed) {
                predecessors.push(PvState::from_pv(pv));
            }
        }
        let deleting = match self.deleted_as_deleting(&states) {
            Cow::Owned(marked) => Some(marked),
            Cow::Borrowed(_) => None,
        };
        ApiView { shown: pvs.len(), states, predecessors, deleting }
    }

    /// What the host shows of the API's volumes, entries and devices (one blocking call under
    /// the executor's deadlines); `None` when the host cannot be read (the pass stops, the
    /// failure is retried with backoff). The watches are told what to follow.
    async fn read_host(&mut self, api: &ApiView) -> Option<HostView> {
        let mut observation = self.observe(&api.states, &api.predecessors).await?;
        let devices = observation.claims.iter().flat_map(|c| c.devices.iter().map(|d| d.name.clone())).collect();
        let mut signs = std::mem::take(&mut observation.scan.signs);
        // An I/O error a PV's presence check met is the same sign as one the scan met.
        for (path, what) in std::mem::take(&mut observation.io_failures) {
            match signs.iter_mut().find(|(p, _)| *p == path) {
                Some((_, s)) => {
                    s.io_failure.get_or_insert(what);
                }
                None => signs.push((path, Signs { io_failure: Some(what), ..Default::default() })),
            }
        }
        self.say_watch_needs(&observation.scan, &signs);
        self.say_interest(&observation);
        let unresponsive = observation
            .scan
            .skipped
            .iter()
            .filter(|s| matches!(s.reason, SkipReason::Unresponsive(_)))
            .filter_map(|s| {
                let class = self.config.storage_class_map.get(&s.class)?;
                Some(crate::core::volumes::pv::host_path(&class.host_dir, s.path.file_name()?.to_str()?))
            })
            .collect();
        Some(HostView { observation, signs, devices, unresponsive })
    }

    /// Judges the disks (failing signs, growths, claimed devices a writer touched), reports the
    /// device claims and withdraws tampered ones; hands the scan on with what is left of the
    /// host view.
    async fn judge(
        &mut self,
        api: &ApiView,
        mut host: HostView,
        revealed: Option<Instant>,
        started: Instant,
    ) -> (Judgement, HostView) {
        let judged = self.judge_disks(&host.signs, &api.states);
        self.keep_failing_back(&mut host.observation.scan, &judged.failing);
        let tampered = host.observation.claims.as_ref().map(|c| c.plan.tampered.clone()).unwrap_or_default();
        self.inventory_devices(host.observation.claims.as_ref(), &host.observation.devices);
        self.report_claims(host.observation.claims.take().as_ref()).await;
        self.withdraw_tampered(api.going(), &tampered).await;
        // Only changes since the previous scan can have revealed something it did not see.
        let revealed = revealed.filter(|at| self.last_scan.is_none_or(|last| *at > last)).unwrap_or(started);
        self.last_scan = Some(started);
        (Judgement { judged, revealed, discovery_time: started.elapsed() }, host)
    }

    /// The effects of this pass, each planned by its pure planner from the views: publish,
    /// succession, vanished volumes, keys, fences, identities, marks, wipes, failing disks.
    async fn apply(&mut self, api: &ApiView, host: HostView, judgement: Judgement) -> Applied {
        let HostView { observation, signs, devices, unresponsive } = host;
        let Judgement { judged, revealed, discovery_time } = judgement;
        self.problems.begin_pass();
        self.inventory_entries(&observation.scan);
        let (desired, planned) = self.publish(observation.scan, revealed, &api.predecessors).await;
        let next_stale = self.succeed(&api.predecessors, &observation.succession).await;
        let (missing, next_missing) = self.missing_volumes(&observation.absent);
        let withdrawn = self.follow_presence(api.going(), &missing).await;
        // A PV withdrawn just now is gone: fencing it would only tell its end as a fence.
        let kept: Vec<PvState> = api.states.iter().filter(|pv| !withdrawn.contains(&pv.uid)).cloned().collect();
        // Encrypted volumes' keys in the kernel before the fences are planned: a PV whose key
        // cannot be had is fenced (and the node-wide fence after a boot lifts only after this).
        let locked = self.follow_keys(&kept, &api.predecessors, &observation.keys_absent).await;
        self.follow_fences(&kept, &api.predecessors, &observation.checks, &observation.succession, &missing, &locked)
            .await;
        self.upgrade_identities(&api.states, &observation.upgrades).await;
        self.label_disks(&observation.upgrades).await;
        self.ensure_marks(&api.states, &missing).await;
        self.clean(&api.states, &missing, observation.disks).await;
        self.follow_health(api.going(), &judged).await;
        self.tell_growths(&api.states, &judged.growths).await;
        self.forget_gone(api, signs, devices, unresponsive);
        Applied {
            desired,
            planned,
            discovery_time,
            next_settle: [next_stale, next_missing].into_iter().flatten().min(),
        }
    }

    /// Forgets what no longer has a PV or an entry: unresponsive subjects of the executor,
    /// wipe failures of PVs that are gone and of used disks no longer found. Nothing only grows.
    fn forget_gone(
        &mut self,
        api: &ApiView,
        signs: Vec<(String, Signs)>,
        devices: BTreeSet<String>,
        unresponsive: Vec<String>,
    ) {
        // Stalls met in this pass's own operations (a used-mark write) are named at once.
        self.report_stalls(&self.ops.stalls());
        // A volume is remembered as unresponsive while it has a PV or an entry.
        let mut subjects: BTreeSet<String> = api.states.iter().map(|s| s.host_path.clone()).collect();
        subjects.extend(signs.into_iter().map(|(p, _)| p));
        subjects.extend(unresponsive);
        self.ops.retain(|s| match s {
            Subject::Volume(p) => subjects.contains(p),
            Subject::Device(d) => devices.contains(d),
            Subject::Directory(_) | Subject::Config(_) | Subject::Host(_) => true,
        });
        self.effects.end_pass();
        let live_pvs: BTreeSet<&str> = api.states.iter().map(|s| s.uid.as_str()).collect();
        let found: BTreeSet<&str> = self.marks.found_disks.iter().map(|(path, _)| path.as_str()).collect();
        self.cleaner.retain(|key| match key {
            EffectKey::Wipe(uid) => live_pvs.contains(uid.as_str()),
            EffectKey::WipeFirst(path) => found.contains(path.as_str()),
            _ => false,
        });
    }

    /// The pass's end: the next settle deadline, metrics, the inventory, the start-up taint.
    async fn finish(&mut self, api: &ApiView, applied: Applied, started: Instant) {
        self.settles.next_settle = [self.settles.next_settle, applied.next_settle].into_iter().flatten().min();
        debug!(
            desired = applied.desired,
            observed = api.shown,
            actions = applied.planned,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "pass done"
        );
        let mut by_phase = BTreeMap::new();
        for pv in &api.states {
            *by_phase.entry(pv.phase.clone()).or_insert(0) += 1;
        }
        self.metrics.set_volumes(&by_phase);
        let count = |flagged: fn(&PvState) -> bool| api.states.iter().filter(|pv| flagged(pv)).count() as i64;
        self.metrics.set_flagged(
            count(|pv| pv.flagged_missing),
            count(|pv| pv.flagged_stale),
            count(|pv| pv.moved_to.is_some()),
        );
        self.metrics.pass_done(started.elapsed(), applied.discovery_time);
        self.write_inventory(&api.states).await;
        let failed_creates = self.effects.failed_keys().filter(|k| matches!(k, EffectKey::Create(_))).count();
        let outcome = PassOutcome { configured: true, settling: self.settles.settling, failed_creates };
        self.follow_startup_taint(outcome).await;
    }
}
