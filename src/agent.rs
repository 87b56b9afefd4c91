//! The agent: reconciles the volumes found on this node (desired) with the PVs labelled for
//! this node (actual). Each pass computes everything from scratch, so a restart or a missed
//! event is repaired by the next pass.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::runtime::reflector::Store;
use tokio::sync::Notify;
use tracing::{debug, error, info, trace, warn};

use crate::admin::{Readiness, parse_listen_address, serve};
use crate::api::{ApiError, ClientOptions, Cluster, Created, class_reference, node_reference, pv_reference};
use crate::cleaner::{Cleaner, CleanerOptions, target_for};
use crate::config::{LoadedConfig, ProvisionerConfig, load_dir};
use crate::core::cleanup::{CleanupAction, PvState, plan_cleanup};
use crate::core::desired::{class_policy, desired_pvs};
use crate::core::naming::{
    ANN_CLEANUP_RESULT, ANN_PROVISIONED_BY, ANN_VOLUME_IDENTITY, ANN_VOLUME_MISSING, ANN_VOLUME_MOVED_TO,
    ANN_VOLUME_STALE, FINALIZER_WIPE,
};
use crate::core::naming::{LABEL_NODE, node_label_value, provisioner_name, pv_name};
use crate::core::occurrence::Occurrences;
use crate::core::planner::{
    Action, DesiredPv, ExistingPv, Identity, ObservedPv, classify_existing, plan, plan_adoption,
};
use crate::core::presence::{PresenceAction, plan_presence, where_moved};
use crate::core::pv::{ClassPolicy, NodeInfo, PvContext};
use crate::core::settle::Settler;
use crate::core::succession::{DiskCheck, SuccessionAction, plan_succession};
use crate::core::used_mark::{UsedMark, UsedRead};
use crate::core::volume_safety::{DiskKey, PublishedDisk, wipe_would_hit_another_pv};
use crate::discovery::{self, Scan};
use crate::host::identity::{check_disk, upgraded_identity, volume_identity, volume_present};
use crate::host::mountinfo::MountTable;
use crate::host::used_mark::{Accept, Ledger, MarkOutcome, mark_volume};
use crate::host::watch::{DirWatcher, watch_mounts};
use crate::metrics::Metrics;
use crate::runtime::{Shutdown, forward_events, jittered, sleep_until_opt};

/// Settings of `run`.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// ConfigMap directory.
    pub config_dir: PathBuf,
    /// This node's name.
    pub node_name: String,
    /// API connection settings.
    pub client: ClientOptions,
    /// Safety-net resync period; `None` uses the config's minResyncPeriod (with jitter).
    pub discovery_period: Option<Duration>,
    /// How long a new or vanished volume must stay so before the agent acts on it.
    pub settle: Duration,
    /// How long a predecessor PV's disk must stay missing or different before it is withdrawn
    /// or marked stale: long enough for a rebooted machine to finish mounting its disks.
    pub succession_settle: Duration,
    /// Node-local directory for the ledger of used disks (see host::used_mark).
    pub state_dir: PathBuf,
    /// PV creations in flight at once.
    pub create_concurrency: usize,
    /// Wipe limits.
    pub cleaner: CleanerOptions,
    /// Admin server address (metrics, health); upstream's `:8080` form accepted.
    pub listen_address: String,
    /// Path of the metrics endpoint.
    pub metrics_path: String,
}

/// Why the agent stopped.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The API could not be used.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// This node's Node object is unusable.
    #[error("node {node}: {message}")]
    Node { node: String, message: String },
    /// The admin server could not start.
    #[error(transparent)]
    Admin(#[from] crate::admin::AdminError),
    /// The state directory (the ledger of used disks) cannot be used.
    #[error("state directory: {0}")]
    State(#[from] crate::host::used_mark::MarkError),
}

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(opts: AgentOptions) -> Result<(), AgentError> {
    let mut shutdown = Shutdown::install();
    let metrics = Metrics::new();
    let readiness = Readiness::new("starting: waiting for the Node and the PV watch");
    // An invalid config at start-up does not stop the agent: it publishes nothing, says so in
    // readiness, and picks up the config as soon as it is fixed.
    let (config, config_problem) = match load_dir(&opts.config_dir) {
        Ok(LoadedConfig { config, warnings }) => {
            for w in &warnings {
                warn!(config_dir = %opts.config_dir.display(), "{w}");
            }
            info!(classes = config.storage_class_map.len(), config_dir = %opts.config_dir.display(), "configuration loaded");
            (Some(config), None)
        }
        Err(e) => {
            error!(error = %e, "configuration invalid; nothing is published until it is fixed");
            (None, Some(e.to_string()))
        }
    };
    metrics.set_config_valid(config_problem.is_none());
    let addr = parse_listen_address(&opts.listen_address)?;
    serve(addr, opts.metrics_path.clone(), metrics.clone(), readiness.clone()).await?;

    let cluster = Cluster::connect(&opts.client, &opts.node_name).await?.with_metrics(metrics.clone());
    let node = tokio::select! {
        node = wait_for_node(&cluster, &opts.node_name, &readiness) => node,
        _ = shutdown.signalled() => {
            info!("stopped before the Node could be read");
            return Ok(());
        }
    };
    let node_info = node_info(&node)?;
    let use_node_name_only = config.as_ref().is_some_and(|c| c.use_node_name_only);
    let identity = identity_for(&node_info, use_node_name_only);
    info!(node = %identity.node, provisioner = %identity.provisioner, "agent starting");

    let changed = Arc::new(Notify::new());
    let selector = format!("{LABEL_NODE}={}", identity.node_label);
    let (pv_store, pv_events) = cluster.watch_pvs(Some(&selector));
    let (sc_store, sc_events) = cluster.watch_storage_classes();
    forward_events("persistentvolumes", pv_events, changed.clone());
    forward_events("storageclasses", sc_events, changed.clone());
    pv_store
        .wait_until_ready()
        .await
        .map_err(|e| AgentError::Node { node: identity.node.clone(), message: e.to_string() })?;
    sc_store
        .wait_until_ready()
        .await
        .map_err(|e| AgentError::Node { node: identity.node.clone(), message: e.to_string() })?;

    if let Err(e) = watch_mounts(changed.clone()) {
        warn!(error = %e, "mount events unavailable; new mounts are found by the periodic resync");
    }
    let dir_watcher = match DirWatcher::new(changed.clone()) {
        Ok(w) => Some(w),
        Err(e) => {
            warn!(error = %e, "directory events unavailable; relying on mount events and resync");
            None
        }
    };
    let ledger = Ledger::open(&opts.state_dir)?;
    info!(ledger = %ledger.path().display(), "ledger of used disks opened");
    let (cleaner, mut wipes_done) =
        Cleaner::new(cluster.clone(), opts.cleaner.clone(), metrics.clone(), ledger.clone());
    let mut agent = Agent {
        cleaner,
        ledger,
        marked: BTreeMap::new(),
        found_disks: Vec::new(),
        metrics,
        cluster,
        config: config.clone().unwrap_or_default(),
        has_config: config.is_some(),
        config_problem,
        config_dir: opts.config_dir.clone(),
        dir_watcher,
        readiness,
        settle: opts.settle,
        succession_settle: opts.succession_settle.max(opts.settle),
        new_volumes: Settler::default(),
        vanished: Settler::default(),
        stale: Settler::default(),
        next_settle: None,
        node,
        node_info,
        identity,
        pv_store,
        sc_store,
        concurrency: opts.create_concurrency.max(1),
        adopted: false,
        foreign: BTreeMap::new(),
        reported: BTreeSet::new(),
        unpublished: Occurrences::default(),
    };

    let mut resync_at = tokio::time::Instant::now();
    loop {
        let wake = [agent.cleaner.next_retry(), agent.next_settle].into_iter().flatten().min();
        let wake = wake.map(tokio::time::Instant::from_std);
        tokio::select! {
            _ = shutdown.signalled() => break,
            _ = tokio::time::sleep_until(resync_at) => {
                let period = opts.discovery_period.unwrap_or(agent.config.min_resync_period);
                resync_at = tokio::time::Instant::now() + jittered(period, opts.discovery_period.is_none());
                debug!(next_in_s = (resync_at - tokio::time::Instant::now()).as_secs(), "periodic resync");
                agent.refresh_node().await;
            }
            _ = changed.notified() => {
                trace!("pass triggered by an event");
                // Let a burst of watch events settle into one pass.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Some(outcome) = wipes_done.recv() => agent.cleaner.finished(&outcome),
            _ = sleep_until_opt(wake) => trace!("pass triggered by a settle or retry deadline"),
        }
        agent.reconcile().await;
    }
    // Wipes in flight are abandoned safely: their PVs keep our finalizer and are wiped again
    // from the start after the restart.
    let running = agent.cleaner.cancel_all();
    info!(running_wipes = running, "shutting down");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while agent.cleaner.running() > 0 {
        match tokio::time::timeout_at(deadline, wipes_done.recv()).await {
            Ok(Some(outcome)) => agent.cleaner.finished(&outcome),
            _ => break,
        }
    }
    Ok(())
}

fn identity_for(node: &NodeInfo, use_node_name_only: bool) -> Identity {
    Identity {
        node: node.name.clone(),
        provisioner: provisioner_name(&node.name, &node.uid, use_node_name_only),
        node_label: node_label_value(&node.name),
        use_node_name_only,
    }
}

struct Agent {
    cleaner: Cleaner,
    /// The node-local record of used disks that cannot carry their own mark.
    ledger: Ledger,
    /// UIDs of PVs whose disk was found carrying their complete used mark, and whether it
    /// records a claim: not read again until a claim shows up on an unclaimed one.
    marked: BTreeMap<String, bool>,
    /// (host path, identity) of every volume the last scan found, settled or not: where a PV's
    /// disk that left its path went.
    found_disks: Vec<(String, String)>,
    metrics: Metrics,
    cluster: Cluster,
    /// The configuration in use: the last valid one read.
    config: ProvisionerConfig,
    /// Whether any valid configuration has been read yet.
    has_config: bool,
    /// Why the configuration on disk is not the one in use, if it is not.
    config_problem: Option<String>,
    config_dir: PathBuf,
    dir_watcher: Option<DirWatcher>,
    readiness: Readiness,
    settle: Duration,
    succession_settle: Duration,
    /// Since when each found volume (path and identity) has been seen.
    new_volumes: Settler,
    /// Since when each PV's volume has been missing.
    vanished: Settler,
    /// Since when each PV of an earlier incarnation of this Node has looked stale.
    stale: Settler,
    /// When the next volume settles, so the loop wakes up for it.
    next_settle: Option<Instant>,
    node: Node,
    node_info: NodeInfo,
    identity: Identity,
    pv_store: Store<PersistentVolume>,
    sc_store: Store<StorageClass>,
    concurrency: usize,
    adopted: bool,
    /// PV names found (through AlreadyExists) to belong to another volume.
    foreign: BTreeMap<String, String>,
    /// Problems already reported, so each is logged and evented once, not every pass.
    reported: BTreeSet<String>,
    /// Entries not published (skips and refusals), reported once per occurrence.
    unpublished: Occurrences,
}

impl Agent {
    /// Re-reads this Node on each resync. When it was deleted and registered again (new UID)
    /// while the agent kept running, the agent becomes the new incarnation: its earlier PVs turn
    /// into predecessors and succession decides about them from the disks, as after a restart.
    /// A Node that cannot be read changes nothing.
    async fn refresh_node(&mut self) {
        let node = match self.cluster.node(&self.identity.node).await {
            Ok(node) => node,
            Err(e) => return debug!(error = %e, "re-reading the Node failed; keeping what we know"),
        };
        let Ok(info) = node_info(&node) else { return };
        if info.uid != self.node_info.uid {
            warn!(node = %info.name, old_uid = %self.node_info.uid, new_uid = %info.uid, "the Node was re-created; taking over as its new incarnation");
            self.identity = identity_for(&info, self.config.use_node_name_only);
            self.adopted = false;
        }
        self.node = node;
        self.node_info = info;
    }

    async fn reconcile(&mut self) {
        let started = Instant::now();
        self.reload_config().await;
        self.watch_dirs();
        if !self.has_config {
            return;
        }
        if !self.adopted {
            self.adopted = self.adopt().await;
        }
        let config = self.config.clone();
        let published: BTreeSet<String> = self
            .pv_store
            .state()
            .iter()
            .filter(|pv| self.identity.owns(&ObservedPv::from_pv(pv)))
            .filter_map(|pv| crate::core::pv::local_path(pv).map(str::to_string))
            .collect();
        let ledger = self.ledger.clone();
        let scan = tokio::task::spawn_blocking(move || {
            let mounts = MountTable::read()?;
            let mut scan = discovery::scan_with(&config, &mounts, &published);
            ledger.reload_if_unreadable();
            discovery::read_used_marks(&mut scan.volumes, &config, &mounts, Some(&ledger));
            Ok::<_, crate::host::HostError>(scan)
        });
        let scan = match scan.await {
            Ok(Ok(scan)) => scan,
            Ok(Err(e)) => return error!(error = %e, "discovery failed"),
            Err(e) => return error!(error = %e, "discovery task failed"),
        };
        let discovery_time = started.elapsed();
        self.unpublished.begin_pass();
        let mut unpublished_by_reason: BTreeMap<&'static str, i64> = BTreeMap::new();
        for s in &scan.skipped {
            *unpublished_by_reason.entry(s.reason.code()).or_default() += 1;
        }
        self.report_skips(&scan).await;
        self.found_disks = scan.volumes.iter().map(|v| (v.host_path.clone(), v.identity.clone())).collect();
        let mut scan = scan;
        // A new volume is published once it has stayed (same disk at the same path) for the
        // settle window; its capacity is read in that later pass.
        let keys = scan.volumes.iter().map(|v| format!("{}\n{}", v.host_path, v.identity));
        let (settled, next_new) = self.new_volumes.observe(keys, Instant::now(), self.settle);
        scan.volumes.retain(|v| settled.contains(&format!("{}\n{}", v.host_path, v.identity)));
        let policies = self.class_policies();
        let ctx =
            PvContext { config: &self.config, node: &self.node_info, provisioner_name: &self.identity.provisioner };
        let (mut desired, problems) = desired_pvs(&ctx, &scan.volumes, &policies);
        for p in problems {
            let note = format!("volumes of StorageClass {} are not published: {}", p.class, p.message);
            self.report_node_problem("ClassUnavailable", note).await;
        }
        let pvs = self.pv_store.state();
        let observed: Vec<ObservedPv> = pvs.iter().map(|pv| ObservedPv::from_pv(pv)).collect();
        // PVs left by an earlier incarnation of this Node: their names wait for succession to
        // decide (re-adopt or withdraw) instead of being reported as taken.
        let predecessors: Vec<PvState> = pvs
            .iter()
            .zip(&observed)
            .filter(|(_, o)| self.identity.is_predecessor(o))
            .map(|(pv, _)| PvState::from_pv(pv))
            .collect();
        desired.retain(|d| !predecessors.iter().any(|p| p.name == d.name));
        self.find_mark_holders(&mut desired).await;
        let next_stale = self.succeed(&predecessors).await;
        let actions = plan(&self.identity, &desired, &observed, &self.foreign);
        for action in &actions {
            match action {
                Action::Refuse { reason, .. } => *unpublished_by_reason.entry(reason.code()).or_default() += 1,
                Action::WipeFirst { .. } => *unpublished_by_reason.entry("wipe-first").or_default() += 1,
                Action::Create(_) => {}
            }
        }
        self.metrics.set_unpublished(&unpublished_by_reason);
        let planned = actions.len();
        self.execute(actions, &desired).await;
        // One snapshot of this node's PVs serves presence, cleanup and the metrics of this pass;
        // what they change shows up in the next pass (level-triggered).
        let states = self.own_states();
        let (missing, next_missing) = self.missing_volumes(&states).await;
        self.next_settle = [next_new, next_missing, next_stale].into_iter().flatten().min();
        self.follow_presence(&states, &missing).await;
        self.upgrade_identities(&states, &missing).await;
        self.ensure_marks(&states, &missing).await;
        self.clean(&states, &missing).await;
        debug!(
            desired = desired.len(),
            observed = observed.len(),
            actions = planned,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "pass done"
        );
        let mut by_phase = BTreeMap::new();
        for pv in &states {
            *by_phase.entry(pv.phase.clone()).or_insert(0) += 1;
        }
        self.metrics.set_volumes(&by_phase);
        self.metrics.pass_done(started.elapsed(), discovery_time);
    }

    /// Labels the PVs upstream (or an older version) made for this node. Returns whether the
    /// pass completed; it is retried on the next pass otherwise.
    async fn adopt(&self) -> bool {
        let all = match self.cluster.list_all_pvs().await {
            Ok(all) => all,
            Err(e) => {
                warn!(error = %e, "listing PVs for adoption failed; will retry");
                return false;
            }
        };
        let observed: Vec<ObservedPv> = all.iter().map(ObservedPv::from_pv).collect();
        let names = plan_adoption(&self.identity, &observed);
        let mut ok = true;
        for name in names {
            let Some(pv) = all.iter().find(|pv| pv.metadata.name.as_deref() == Some(name.as_str())) else { continue };
            // A PV of an earlier incarnation of this Node only gets our label here, so the watch
            // sees it; succession then decides from the disk whether to take it over.
            let result = if self.identity.owns(&ObservedPv::from_pv(pv)) {
                self.take_over(pv).await
            } else {
                let labels = serde_json::json!({ LABEL_NODE: self.identity.node_label });
                let rv = pv.metadata.resource_version.as_deref();
                self.cluster.patch_pv_metadata(&name, rv, labels, serde_json::json!({}), None).await
            };
            match result {
                Ok(()) => info!(pv = %name, "adopted existing PV of this node"),
                Err(e) => {
                    warn!(pv = %name, error = %e, "adopting PV failed; will retry");
                    ok = false;
                }
            }
        }
        ok
    }

    /// Puts our label, our finalizer and (when the volume is there) its identity on a PV made
    /// for this node by upstream or an older version, in one patch guarded by resourceVersion.
    async fn take_over(&self, pv: &PersistentVolume) -> Result<(), ApiError> {
        let name = pv.metadata.name.clone().unwrap_or_default();
        let mut finalizers = pv.metadata.finalizers.clone().unwrap_or_default();
        if !finalizers.iter().any(|f| f == FINALIZER_WIPE) {
            finalizers.push(FINALIZER_WIPE.to_string());
        }
        let state = PvState::from_pv(pv);
        let mut annotations = serde_json::json!({});
        if state.identity.is_none() {
            let class = self.config.storage_class_map.get(&state.class);
            if let Ok(target) = target_for(&state, class) {
                match volume_identity(&target.path) {
                    Ok(id) => annotations[ANN_VOLUME_IDENTITY] = serde_json::json!(id),
                    Err(e) => warn!(pv = %name, error = %e, "cannot record the volume identity of an adopted PV"),
                }
            }
        }
        let labels = serde_json::json!({ LABEL_NODE: self.identity.node_label });
        let rv = pv.metadata.resource_version.as_deref();
        self.cluster.patch_pv_metadata(&name, rv, labels, annotations, Some(&finalizers)).await
    }

    /// Plans and starts cleanup for this node's PVs (see core::cleanup). Volumes that are
    /// missing are not wiped until they are back.
    async fn clean(&mut self, states: &[PvState], missing: &BTreeSet<String>) {
        let busy = self.cleaner.busy();
        let actions = plan_cleanup(states, &busy);
        let shared = self.disks_shared_with_live_pvs(states, &actions).await;
        for action in actions {
            match action {
                CleanupAction::AddFinalizer { name } => {
                    let pvs = self.pv_store.state();
                    let Some(pv) = pvs.iter().find(|pv| pv.metadata.name.as_deref() == Some(name.as_str())) else {
                        continue;
                    };
                    match self.take_over(pv).await {
                        Ok(()) => info!(pv = %name, "added our wipe finalizer"),
                        Err(e) => warn!(pv = %name, error = %e, "adding our finalizer failed; will retry"),
                    }
                }
                CleanupAction::Wipe { pv, .. } if missing.contains(&pv.uid) => {
                    let note = format!("volume of PV {} is missing; it will be wiped when it is back", pv.name);
                    self.report_pv_problem(&pv.name, "VolumeMissing", note).await;
                }
                CleanupAction::Wipe { pv, .. } if shared.contains_key(&pv.uid) => {
                    let note = format!("refusing to wipe PV {}: {}", pv.name, shared[&pv.uid]);
                    self.report_pv_problem(&pv.name, "VolumeFailedDelete", note).await;
                }
                CleanupAction::Wipe { pv, after } => {
                    match target_for(&pv, self.config.storage_class_map.get(&pv.class)) {
                        Ok(target) => {
                            info!(pv = %pv.name, path = %target.path.display(), ?after, "starting wipe");
                            self.cleaner.start(pv, after, target);
                        }
                        Err(msg) => {
                            let note = format!("cannot clean PV {}: {msg}", pv.name);
                            self.report_pv_problem(&pv.name, "VolumeFailedDelete", note).await;
                        }
                    }
                }
                CleanupAction::Withdraw { name, resource_version } => {
                    let Some(uid) = states.iter().find(|s| s.name == name).map(|s| s.uid.clone()) else { continue };
                    match self.cluster.delete_pv(&name, &uid, Some(&resource_version)).await {
                        Ok(()) => info!(pv = %name, "withdrew Available PV for the requested cleanup"),
                        Err(e) => {
                            warn!(pv = %name, error = %e, "withdrawing PV failed (changed meanwhile?); will retry")
                        }
                    }
                }
                CleanupAction::ReleaseFinalizer { name, uid } => {
                    match self.cluster.remove_finalizer(&name, &uid, FINALIZER_WIPE).await {
                        Ok(()) => {
                            self.note_withdrawn(&uid).await;
                            info!(pv = %name, "PV deleted before any claim used it; nothing to wipe")
                        }
                        Err(e) => warn!(pv = %name, error = %e, "removing our finalizer failed; will retry"),
                    }
                }
                CleanupAction::Refuse { name, refusal } => {
                    if refusal.answers_request() {
                        let ann = serde_json::json!({ ANN_CLEANUP_RESULT: refusal.to_string() });
                        if let Err(e) =
                            self.cluster.patch_pv_metadata(&name, None, serde_json::json!({}), ann, None).await
                        {
                            warn!(pv = %name, error = %e, "recording the cleanup refusal failed");
                        }
                    }
                    self.report_pv_problem(&name, refusal.reason(), refusal.to_string()).await;
                }
            }
        }
    }

    /// Re-records, in the current format, the identities that older versions recorded, once the
    /// old record proves the disk there is the same one: later swaps (a clone with the same
    /// filesystem UUID, another XFS on the same device) are then caught by the stronger
    /// identity. Guarded by the resourceVersion, so a concurrent change is never overwritten.
    async fn upgrade_identities(&self, states: &[PvState], missing: &BTreeSet<String>) {
        let legacy: Vec<(PvState, PathBuf)> = states
            .iter()
            .filter(|pv| !pv.deleting && !missing.contains(&pv.uid))
            .filter(|pv| pv.identity.as_deref().is_some_and(crate::core::disk_identity::is_legacy))
            .filter_map(|pv| {
                Some((pv.clone(), target_for(pv, self.config.storage_class_map.get(&pv.class)).ok()?.path))
            })
            .collect();
        if legacy.is_empty() {
            return;
        }
        let upgrades = tokio::task::spawn_blocking(move || {
            let Ok(mounts) = MountTable::read() else { return Vec::new() };
            legacy
                .into_iter()
                .filter_map(|(pv, path)| {
                    let new = upgraded_identity(&path, pv.identity.as_deref()?, &mounts)?;
                    Some((pv, new))
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        for (pv, identity) in upgrades {
            let ann = serde_json::json!({ ANN_VOLUME_IDENTITY: identity });
            let rv = Some(pv.resource_version.as_str());
            match self.cluster.patch_pv_metadata(&pv.name, rv, serde_json::json!({}), ann, None).await {
                Ok(()) => info!(pv = %pv.name, %identity, "volume identity re-recorded in the current format"),
                Err(e) => warn!(pv = %pv.name, error = %e, "re-recording the volume identity failed; will retry"),
            }
        }
    }

    /// For each PV about to be wiped, why its disk must not be wiped because another live PV
    /// of this node names the same disk (two PVs of one disk made before the one-disk rule, or
    /// by upstream). Reads the disks of all this node's PVs in one blocking task, only when
    /// there is something to wipe.
    async fn disks_shared_with_live_pvs(
        &self,
        states: &[PvState],
        actions: &[CleanupAction],
    ) -> BTreeMap<String, String> {
        let wipes: Vec<&PvState> = actions
            .iter()
            .filter_map(|a| if let CleanupAction::Wipe { pv, .. } = a { Some(pv) } else { None })
            .collect();
        if wipes.is_empty() {
            return BTreeMap::new();
        }
        let located: Vec<(PvState, PathBuf)> = states
            .iter()
            .filter_map(|pv| {
                let target = target_for(pv, self.config.storage_class_map.get(&pv.class)).ok()?;
                Some((pv.clone(), target.path))
            })
            .collect();
        let wipe_uids: BTreeSet<String> = wipes.iter().map(|pv| pv.uid.clone()).collect();
        // Fails closed: when the disks cannot be read, no wipe starts in this pass.
        let all_blocked = |why: &str| -> BTreeMap<String, String> {
            wipes
                .iter()
                .map(|pv| {
                    (pv.uid.clone(), format!("the disks of this node's PVs cannot be compared now ({why}); retrying"))
                })
                .collect()
        };
        let located_uids = wipe_uids.clone();
        let result = tokio::task::spawn_blocking(move || {
            let Ok(mounts) = MountTable::read() else { return None };
            let facts = mounts.facts();
            let disks: Vec<(PvState, DiskKey)> = located
                .into_iter()
                .filter_map(|(pv, path)| discovery::disk_at(&path, &mounts, &facts).map(|d| (pv, d)))
                .collect();
            let others: Vec<PublishedDisk> = disks
                .iter()
                .map(|(pv, disk)| PublishedDisk {
                    name: pv.name.clone(),
                    phase: pv.phase.clone(),
                    deleting: pv.deleting,
                    disk: disk.clone(),
                })
                .collect();
            Some(
                disks
                    .iter()
                    .filter(|(pv, _)| located_uids.contains(&pv.uid))
                    .filter_map(|(pv, disk)| {
                        Some((pv.uid.clone(), wipe_would_hit_another_pv(&pv.name, disk, &others)?))
                    })
                    .collect::<BTreeMap<_, _>>(),
            )
        })
        .await;
        match result {
            Ok(Some(shared)) => shared,
            Ok(None) => all_blocked("the mount table is unreadable"),
            Err(e) => all_blocked(&format!("the check failed: {e}")),
        }
    }

    fn class_policies(&self) -> BTreeMap<String, Result<ClassPolicy, String>> {
        self.config
            .storage_class_map
            .keys()
            .map(|class| {
                let policy = match self.sc_store.state().iter().find(|sc| sc.metadata.name.as_deref() == Some(class)) {
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
        let busy = self.cleaner.busy();
        for action in actions {
            match action {
                Action::Create(pv) => creates.push(pv),
                Action::WipeFirst { name, host_path, identity, mark } => {
                    self.wipe_first(&busy, desired, name, host_path, identity, mark).await;
                }
                Action::Refuse { name, host_path, reason } => {
                    let key = format!("refuse/{name}/{host_path}/{reason}");
                    if self.unpublished.first_seen(key) {
                        warn!(pv = %name, path = %host_path, "volume not published: {reason}");
                        let note = format!("volume at {host_path} not published as {name}: {reason}");
                        let related = Some(pv_reference(&name));
                        self.cluster
                            .event_related(
                                &node_reference(&self.node),
                                related,
                                true,
                                "VolumeNotPublished",
                                "Publish",
                                note,
                            )
                            .await;
                    }
                }
            }
        }
        let creates = self.mark_before_create(creates, desired).await;
        let mut created = Vec::new();
        let cluster = &self.cluster;
        let results: Vec<(Box<PersistentVolume>, Result<Created, ApiError>)> = stream::iter(creates)
            .map(|pv| async move {
                let r = cluster.create_pv(&pv).await;
                (pv, r)
            })
            .buffer_unordered(self.concurrency)
            .collect()
            .await;
        for (pv, result) in results {
            let name = pv.metadata.name.clone().unwrap_or_default();
            let path = crate::core::pv::local_path(&pv).unwrap_or_default().to_string();
            match result {
                Ok(Created::Created { uid }) => {
                    info!(pv = %name, path = %path, "created PV");
                    let d = desired.iter().find(|d| d.name == name && d.host_path == path);
                    if let Some(d) = d.filter(|_| !uid.is_empty()) {
                        let class = pv.spec.as_ref().and_then(|s| s.storage_class_name.clone()).unwrap_or_default();
                        created.push(PvState {
                            name: name.clone(),
                            uid,
                            host_path: path.clone(),
                            class,
                            phase: "Available".into(),
                            identity: Some(d.identity.clone()),
                            ..Default::default()
                        });
                    }
                    let mode = pv.spec.as_ref().and_then(|s| s.volume_mode.as_deref()).unwrap_or("Filesystem");
                    let capacity =
                        desired.iter().find(|d| d.name == name && d.host_path == path).map_or(0, |d| d.capacity_bytes);
                    self.metrics.pv_created(if mode == "Block" { "block" } else { "fs" }, capacity);
                }
                Ok(Created::AlreadyExists(existing)) => {
                    let Some(d) = desired.iter().find(|d| d.name == name && d.host_path == path) else { continue };
                    match classify_existing(&self.identity, d, &ObservedPv::from_pv(&existing)) {
                        ExistingPv::Ours { needs_label: true } => match self.take_over(&existing).await {
                            Ok(()) => info!(pv = %name, path = %path, "adopted existing PV"),
                            Err(e) => warn!(pv = %name, path = %path, error = %e, "adopting PV failed"),
                        },
                        ExistingPv::Ours { needs_label: false } => debug!(pv = %name, "PV already exists"),
                        ExistingPv::Foreign { owner } => {
                            warn!(pv = %name, path = %path, "PV name taken by {owner}; not overwriting it");
                            let note = format!("volume at {path} not published: PV name {name} is taken by {owner}");
                            self.cluster
                                .event(&pv_reference(&name), true, "VolumeNameCollision", "Publish", note)
                                .await;
                            self.foreign.insert(name, owner);
                        }
                    }
                }
                Err(e) if e.is_refusal() => {
                    // An admission policy or RBAC said no: an operator must act. Reported as a
                    // Warning once per occurrence, logged at every retry.
                    warn!(pv = %name, path = %path, error = %e, "the API refused to create the PV; will retry");
                    if self.unpublished.first_seen(format!("create-refused/{name}/{path}")) {
                        let note = format!("volume at {path} not published as {name}: the API refused it: {e}");
                        let note: String = note.chars().take(1000).collect();
                        self.cluster
                            .event_related(
                                &node_reference(&self.node),
                                Some(pv_reference(&name)),
                                true,
                                "VolumeNotPublished",
                                "Publish",
                                note,
                            )
                            .await;
                    }
                }
                Err(e) => error!(pv = %name, path = %path, error = %e, "creating PV failed; will retry"),
            }
        }
        // The UID goes on the disk's mark at once: from now on the mark alone says the disk was
        // offered, whatever happens to the PV while this agent is down.
        self.mark_pvs(created).await;
    }

    /// Records in the ledger that this PV was let go while no claim was on it (a precondition
    /// or the PV's own state proved it): its disk's mark then counts as offered, not used, and
    /// the disk is published again without a wipe. A failure only costs that wipe.
    async fn note_withdrawn(&self, uid: &str) {
        let (ledger, uids) = (self.ledger.clone(), vec![uid.to_string()]);
        match tokio::task::spawn_blocking(move || ledger.record_withdrawn(&uids)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                warn!(uid, error = %e, "cannot record an unclaimed withdrawal; its disk is wiped before it returns")
            }
            Err(e) => warn!(uid, error = %e, "recording an unclaimed withdrawal failed"),
        }
    }

    /// For disks whose used mark names a PV that is not one of this node's (a disk moved here
    /// from another node, or a PV already gone), reads that PV once: the planner holds the disk
    /// back while that PV records it, and wipes it first when no live PV does. A PV that cannot
    /// be read leaves the disk unknown, so it is neither published nor wiped this pass.
    async fn find_mark_holders(&mut self, desired: &mut [DesiredPv]) {
        let store = self.pv_store.state();
        let busy = self.cleaner.busy();
        let mut fetched: BTreeMap<String, Result<Option<PersistentVolume>, String>> = BTreeMap::new();
        for d in desired.iter_mut() {
            let (UsedRead::Marked(mark) | UsedRead::Offered(mark)) = &d.used else { continue };
            let name = mark.pv.clone();
            // Also when it names the PV this disk would be published as: a PV of that name
            // missing from the label-scoped store (its label removed) still holds the disk.
            if store.iter().any(|pv| pv.metadata.name.as_deref() == Some(name.as_str())) {
                continue;
            }
            // Being wiped first (or backing off after a failed wipe-first): decided already.
            if busy.contains(&format!("wipe-first/{}", d.host_path)) {
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

    /// Starts wiping a used disk that no live PV names (see core::used_mark), once per
    /// occurrence reported; a failed wipe backs off in the cleaner before it is tried again.
    async fn wipe_first(
        &mut self,
        busy: &BTreeSet<String>,
        desired: &[DesiredPv],
        name: String,
        host_path: String,
        identity: String,
        mark: UsedMark,
    ) {
        let key = format!("wipe-first/{host_path}");
        if busy.contains(&key) {
            return;
        }
        let Some(d) = desired.iter().find(|d| d.name == name && d.host_path == host_path) else { return };
        let class = d.pv.spec.as_ref().and_then(|s| s.storage_class_name.clone()).unwrap_or_default();
        let located = PvState { host_path: host_path.clone(), class: class.clone(), ..Default::default() };
        let target = match target_for(&located, self.config.storage_class_map.get(&class)) {
            Ok(target) => target,
            Err(e) => return warn!(path = %host_path, error = %e, "cannot locate a used volume to wipe it"),
        };
        let note = format!(
            "volume at {host_path} held the data of PV {} (node {}, {}), which no longer names it; it is wiped before it is published as {name}",
            mark.pv, mark.node, mark.path
        );
        if self.unpublished.first_seen(format!("wipe-first/{host_path}/{identity}")) {
            warn!(path = %host_path, pv = %mark.pv, "{note}");
            self.cluster.event_related(&node_reference(&self.node), None, true, "VolumeUsed", "Wipe", note).await;
        }
        self.cleaner.start_wipe_first(key, &name, &host_path, &identity, target, node_reference(&self.node));
    }

    /// Writes the used mark on every disk about to be published, before its PV is created (see
    /// core::used_mark), proving on the descriptor written through that it is the disk found.
    /// Returns the PVs whose disks are marked now; the others wait for the next pass.
    #[allow(clippy::vec_box)] // The planner's boxed PVs are passed through as they are.
    async fn mark_before_create(
        &mut self,
        creates: Vec<Box<PersistentVolume>>,
        desired: &[DesiredPv],
    ) -> Vec<Box<PersistentVolume>> {
        if creates.is_empty() {
            return creates;
        }
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let mut jobs = Vec::new();
        for pv in creates {
            let name = pv.metadata.name.clone().unwrap_or_default();
            let path = crate::core::pv::local_path(&pv).unwrap_or_default().to_string();
            let Some(d) = desired.iter().find(|d| d.name == name && d.host_path == path) else { continue };
            let class = pv.spec.as_ref().and_then(|s| s.storage_class_name.clone()).unwrap_or_default();
            let located = PvState { host_path: path.clone(), class: class.clone(), ..Default::default() };
            let Ok(target) = target_for(&located, self.config.storage_class_map.get(&class)) else { continue };
            let mark = UsedMark {
                pv: name,
                node: self.identity.node.clone(),
                path,
                identity: d.identity.clone(),
                at: now.clone(),
                uid: None,
                root: None,
                claimed: false,
                wiped_filesystems: Vec::new(),
            };
            // The mark discovery judged (gone PV, offered only, or a create that never
            // happened) may be replaced; any other found on the disk now stops the create.
            let judged = match &d.used {
                UsedRead::Marked(m) | UsedRead::Offered(m) => Some(m.clone()),
                _ => None,
            };
            jobs.push((pv, target.path, mark, judged));
        }
        let ledger = self.ledger.clone();
        let marked = tokio::task::spawn_blocking(move || {
            let mounts = MountTable::read().map_err(|e| e.to_string())?;
            let mut marked: Vec<_> = jobs
                .into_iter()
                .map(|(pv, path, mark, judged)| {
                    let recorded = mark.identity.clone();
                    let replaceable = |there: Option<&UsedMark>| match there {
                        None => true,
                        Some(m) if m.uid.is_none() && m.pv == mark.pv => true,
                        Some(m) => judged.as_ref().is_some_and(|j| j.pv == m.pv && j.uid == m.uid),
                    };
                    let outcome =
                        mark_volume(&path, &recorded, None, Accept::Proven, &mark, &ledger, &mounts, replaceable);
                    (pv, mark, outcome.map_err(|e| e.to_string()))
                })
                .collect();
            // One durable ledger write for the whole batch, before any of these PVs exists.
            ledger.record_outcomes(marked.iter_mut().map(|(_, _, outcome)| outcome));
            Ok::<_, String>(marked)
        })
        .await;
        let marked = match marked {
            Ok(Ok(marked)) => marked,
            Ok(Err(e)) => {
                warn!(error = %e, "cannot read the mount table to mark new volumes; nothing is published this pass");
                return Vec::new();
            }
            Err(e) => {
                error!(error = %e, "marking new volumes failed; nothing is published this pass");
                return Vec::new();
            }
        };
        let mut ready = Vec::new();
        for (pv, mark, outcome) in marked {
            match outcome {
                Ok(MarkOutcome::Written(_)) => ready.push(pv),
                Ok(MarkOutcome::NotTheDisk(why)) => {
                    debug!(pv = %mark.pv, path = %mark.path, "the volume changed since discovery ({why}); not published yet")
                }
                Ok(MarkOutcome::Kept(there)) => {
                    let other = there.map(|m| m.pv).unwrap_or_default();
                    warn!(pv = %mark.pv, path = %mark.path, other = %other, "the disk carries another PV's used mark since discovery read it; not published this pass");
                }
                Err(e) => {
                    warn!(pv = %mark.pv, path = %mark.path, error = %e, "cannot mark the volume as used; not published");
                    if self.unpublished.first_seen(format!("mark-failed/{}/{e}", mark.path)) {
                        let note = format!(
                            "volume at {} not published as {}: its used mark cannot be written ({e})",
                            mark.path, mark.pv
                        );
                        self.cluster
                            .event_related(
                                &node_reference(&self.node),
                                Some(pv_reference(&mark.pv)),
                                true,
                                "VolumeNotPublished",
                                "Publish",
                                note,
                            )
                            .await;
                    }
                }
            }
        }
        ready
    }

    /// Keeps the used mark on the disks of this node's PVs: completes it with the PV's UID once
    /// the PV exists (the mark written before the create could not know it), and puts it on
    /// PVs made by upstream or older versions once a claim uses them. The disk is proven to be
    /// the PV's recorded one on the descriptor written through; PVs whose mark is complete are
    /// not read again by this process.
    async fn ensure_marks(&mut self, states: &[PvState], missing: &BTreeSet<String>) {
        self.marked.retain(|uid, _| states.iter().any(|s| &s.uid == uid));
        let busy = self.cleaner.busy();
        let candidates: Vec<PvState> = states
            .iter()
            .filter(|pv| !pv.deleting && !missing.contains(&pv.uid) && !busy.contains(&pv.uid))
            .filter(|pv| match self.marked.get(&pv.uid) {
                Some(claimed) => !claimed && pv.used_by_a_claim(),
                None => true,
            })
            .cloned()
            .collect();
        self.mark_pvs(candidates).await;
    }

    /// The work of [`Self::ensure_marks`] for the given PVs (also called right after creates, so
    /// the UID is on the disk at once rather than on the next pass).
    async fn mark_pvs(&mut self, candidates: Vec<PvState>) {
        let node = self.identity.node.clone();
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let mut jobs = Vec::new();
        for pv in &candidates {
            let Ok(target) = target_for(pv, self.config.storage_class_map.get(&pv.class)) else { continue };
            let used = pv.used_by_a_claim();
            // A used PV's disk is marked even when its identity proves nothing (an old-format or
            // missing record): kubelet mounts whatever is at the path, so that holds the data.
            let (recorded, accept) = match (&pv.identity, used) {
                (Some(id), false) => (id.clone(), Accept::Proven),
                (Some(id), true) => (id.clone(), Accept::Plausible),
                (None, true) => (String::new(), Accept::Anything),
                (None, false) => continue,
            };
            let mark = UsedMark {
                pv: pv.name.clone(),
                node: node.clone(),
                path: pv.host_path.clone(),
                identity: recorded.clone(),
                at: now.clone(),
                uid: Some(pv.uid.clone()),
                root: None,
                claimed: used,
                wiped_filesystems: Vec::new(),
            };
            jobs.push((pv.clone(), target.path, recorded, accept, mark, used));
        }
        if jobs.is_empty() {
            return;
        }
        let ledger = self.ledger.clone();
        let done = tokio::task::spawn_blocking(move || {
            let mounts = match MountTable::read() {
                Ok(mounts) => mounts,
                Err(e) => {
                    warn!(error = %e, "cannot read the mount table to keep used marks; will retry");
                    return Vec::new();
                }
            };
            let mut done: Vec<_> = jobs
                .into_iter()
                .map(|(pv, path, recorded, accept, mark, used)| {
                    let uid = pv.uid.clone();
                    let ours = |m: &UsedMark| m.pv == pv.name && m.uid.as_deref().is_none_or(|u| u == uid);
                    let outcome = mark_volume(
                        &path,
                        &recorded,
                        pv.identity_confirmed.as_deref(),
                        accept,
                        &mark,
                        &ledger,
                        &mounts,
                        |there| match there {
                            // Complete: nothing to do.
                            Some(m) if ours(m) && m.uid.is_some() && (m.claimed || !used) => false,
                            // Ours, without the UID (written before the create) or the claim.
                            Some(m) if ours(m) => true,
                            // Upstream's or an older version's PV: marked once a claim uses it.
                            _ => used,
                        },
                    );
                    (pv, outcome.map_err(|e| e.to_string()))
                })
                .collect();
            ledger.record_outcomes(done.iter_mut().map(|(_, outcome)| outcome));
            done
        })
        .await
        .unwrap_or_default();
        for (pv, outcome) in done {
            match outcome {
                Ok(MarkOutcome::Written(m)) => {
                    debug!(pv = %pv.name, claimed = m.claimed, "used mark written");
                    self.marked.insert(pv.uid.clone(), m.claimed);
                }
                Ok(MarkOutcome::Kept(Some(m))) if m.pv == pv.name && m.uid.as_deref() == Some(pv.uid.as_str()) => {
                    self.marked.insert(pv.uid.clone(), m.claimed);
                }
                Ok(MarkOutcome::NotTheDisk(why)) => {
                    debug!(pv = %pv.name, "not marking: the disk at its path is not proven to be its own ({why})")
                }
                Ok(MarkOutcome::Kept(_)) => {}
                Err(e) => warn!(pv = %pv.name, error = %e, "cannot keep the used mark on the PV's disk; will retry"),
            }
        }
    }

    /// Reads the config directory and applies a valid new config at once. An invalid one is
    /// refused with every problem listed (log, Warning event, metric, readiness detail) and the
    /// last good config stays in use. New settings apply to new PVs; existing PVs are not
    /// changed.
    async fn reload_config(&mut self) {
        match load_dir(&self.config_dir) {
            Ok(LoadedConfig { config, warnings }) => {
                if !self.has_config || config != self.config {
                    for w in &warnings {
                        warn!(config_dir = %self.config_dir.display(), "{w}");
                    }
                    if self.has_config {
                        info!(classes = config.storage_class_map.len(), "configuration reloaded");
                        let note = format!("configuration reloaded: {} classes", config.storage_class_map.len());
                        self.cluster.event(&node_reference(&self.node), false, "ConfigReloaded", "Reload", note).await;
                    }
                    self.identity = identity_for(&self.node_info, config.use_node_name_only);
                    self.config = config;
                    self.has_config = true;
                }
                if self.config_problem.take().is_some() {
                    info!("configuration valid again");
                }
                self.readiness.set(None);
                self.readiness.set_detail(None);
                self.metrics.set_config_valid(true);
            }
            Err(e) => {
                let problem = e.to_string();
                if self.config_problem.as_deref() != Some(problem.as_str()) {
                    error!(error = %problem, "configuration change refused; the last valid configuration stays in use");
                    let note = format!("configuration change refused, last valid configuration kept: {problem}");
                    self.cluster.event(&node_reference(&self.node), true, "ConfigInvalid", "Reload", note).await;
                    self.config_problem = Some(problem.clone());
                }
                self.metrics.set_config_valid(false);
                if self.has_config {
                    self.readiness.set_detail(Some(format!("config: last change refused: {problem}")));
                } else {
                    self.readiness.set(Some(format!("no valid configuration: {problem}")));
                }
            }
        }
    }

    /// inotify on the config directory and every class's discovery directory.
    fn watch_dirs(&mut self) {
        let Some(watcher) = self.dir_watcher.as_mut() else { return };
        let mut dirs = BTreeSet::from([self.config_dir.clone()]);
        dirs.extend(self.config.storage_class_map.values().map(|c| PathBuf::from(&c.mount_dir)));
        for e in watcher.watch_exactly(&dirs) {
            let key = format!("watch/{e}");
            if self.reported.insert(key) {
                warn!(error = %e, "cannot watch directory; changes there are found by mount events and resync");
            }
        }
    }

    /// UIDs of this node's PVs whose volume has been gone for the settle window, and when the
    /// next one would be. Only PVs of configured classes are checked: a removed class's PVs
    /// are left alone.
    async fn missing_volumes(&mut self, states: &[PvState]) -> (BTreeSet<String>, Option<Instant>) {
        let mut checks = Vec::new();
        // PVs being deleted too: a missing volume must wait for its return, not start a wipe
        // that can only be refused.
        for pv in states {
            if let Ok(target) = target_for(pv, self.config.storage_class_map.get(&pv.class)) {
                checks.push((pv.uid.clone(), target.path, pv.identity.clone()));
            }
        }
        let absent = tokio::task::spawn_blocking(move || {
            let Ok(mounts) = MountTable::read() else { return Vec::new() };
            checks
                .into_iter()
                .filter(|(_, path, identity)| !volume_present(path, identity.as_deref(), &mounts))
                .map(|(uid, _, _)| uid)
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        self.vanished.observe(absent, Instant::now(), self.settle)
    }

    /// Withdraws unbound PVs whose volume vanished, flags bound ones, unflags returned ones.
    async fn follow_presence(&mut self, states: &[PvState], missing: &BTreeSet<String>) {
        let moved: BTreeMap<String, String> = states
            .iter()
            .filter(|pv| missing.contains(&pv.uid))
            .filter_map(|pv| Some((pv.uid.clone(), where_moved(pv, &self.found_disks)?)))
            .collect();
        for action in plan_presence(states, missing, &moved) {
            match action {
                PresenceAction::Withdraw { name, uid, resource_version } => {
                    match self.cluster.delete_pv(&name, &uid, Some(&resource_version)).await {
                        Ok(()) => {
                            self.note_withdrawn(&uid).await;
                            info!(pv = %name, "volume vanished; unbound PV withdrawn");
                            let note =
                                format!("volume of PV {name} is gone from the node; the unbound PV is withdrawn");
                            self.cluster.event(&pv_reference(&name), false, "VolumeWithdrawn", "Discover", note).await;
                        }
                        Err(e) => warn!(pv = %name, error = %e, "withdrawing PV failed (bound meanwhile?); will retry"),
                    }
                }
                PresenceAction::Flag { name, moved_to } => {
                    let now = k8s_openapi::jiff::Timestamp::now().to_string();
                    let ann = serde_json::json!({ ANN_VOLUME_MISSING: now, ANN_VOLUME_MOVED_TO: moved_to });
                    match self.cluster.patch_pv_metadata(&name, None, serde_json::json!({}), ann, None).await {
                        Ok(()) => {
                            let note = match &moved_to {
                                Some(to) => format!(
                                    "the volume of PV {name} is not at its path: its disk is at {to} on this node \
                                     now. The PV is kept and the disk is not published there; put it back (or \
                                     delete the claim when its data is not needed)"
                                ),
                                None => format!("the volume of PV {name} is missing from the node; the PV is kept"),
                            };
                            warn!(pv = %name, "{note}");
                            self.cluster.event(&pv_reference(&name), true, "VolumeMissing", "Discover", note).await;
                        }
                        Err(e) => warn!(pv = %name, error = %e, "flagging PV failed; will retry"),
                    }
                }
                PresenceAction::Unflag { name } => {
                    let ann = serde_json::json!({ ANN_VOLUME_MISSING: null, ANN_VOLUME_MOVED_TO: null });
                    match self.cluster.patch_pv_metadata(&name, None, serde_json::json!({}), ann, None).await {
                        Ok(()) => {
                            info!(pv = %name, "volume is back");
                            let note = format!("the volume of PV {name} is back");
                            self.cluster.event(&pv_reference(&name), false, "VolumeBack", "Discover", note).await;
                        }
                        Err(e) => warn!(pv = %name, error = %e, "unflagging PV failed; will retry"),
                    }
                }
            }
        }
    }

    /// Decides about the PVs an earlier incarnation of this Node left (see core::succession):
    /// re-adopts those whose disk is here, withdraws or flags the others once that has held for
    /// the settle window. Returns when the next undecided one settles.
    async fn succeed(&mut self, pvs: &[PvState]) -> Option<Instant> {
        if pvs.is_empty() {
            // The usual case: no mount-table read on every pass for nothing.
            return self.stale.observe(Vec::new(), Instant::now(), self.succession_settle).1;
        }
        let mut checks = Vec::new();
        for pv in pvs {
            match target_for(pv, self.config.storage_class_map.get(&pv.class)) {
                Ok(target) => checks.push((pv.clone(), target.path)),
                Err(msg) => {
                    let note = format!(
                        "PV {} was made for an earlier incarnation of this node and is left alone: {msg}",
                        pv.name
                    );
                    self.report_pv_problem(&pv.name, "VolumeStale", note).await;
                }
            }
        }
        let found = tokio::task::spawn_blocking(move || {
            let mounts = MountTable::read().map_err(|e| e.to_string())?;
            Ok::<_, String>(
                checks
                    .into_iter()
                    .map(|(pv, path)| {
                        let check = check_disk(&path, pv.identity.as_deref(), &mounts);
                        (pv, path, check)
                    })
                    .collect::<Vec<_>>(),
            )
        })
        .await;
        let found = match found {
            Ok(Ok(found)) => found,
            Ok(Err(e)) => {
                warn!(error = %e, "cannot read the mount table; PVs of the earlier node incarnation wait");
                return None;
            }
            Err(e) => {
                warn!(error = %e, "succession check task failed");
                return None;
            }
        };
        // A disk that is not at its path but at another entry of this node moved (or was swapped
        // with another): its data is on this live node, so it is never taken for gone.
        let found: Vec<(PvState, PathBuf, DiskCheck)> = found
            .into_iter()
            .map(|(pv, path, check)| match check {
                DiskCheck::Different | DiskCheck::Missing if where_moved(&pv, &self.found_disks).is_some() => {
                    (pv, path, DiskCheck::Moved)
                }
                check => (pv, path, check),
            })
            .collect();
        let key = |pv: &PvState, check: DiskCheck| format!("{}\n{check:?}", pv.uid);
        let doubtful = found
            .iter()
            .filter(|(_, _, c)| {
                matches!(c, DiskCheck::Different | DiskCheck::Missing | DiskCheck::Unverified | DiskCheck::Moved)
            })
            .map(|(pv, _, c)| key(pv, *c));
        let (settled, next) = self.stale.observe(doubtful, Instant::now(), self.succession_settle);
        for (pv, path, check) in found {
            let doubtful =
                matches!(check, DiskCheck::Different | DiskCheck::Missing | DiskCheck::Unverified | DiskCheck::Moved);
            if doubtful && !settled.contains(&key(&pv, check)) {
                continue;
            }
            let Some(action) = plan_succession(&pv, check) else { continue };
            self.execute_succession(action, &pv, &path, check).await;
        }
        next
    }

    async fn execute_succession(
        &mut self,
        action: SuccessionAction,
        pv: &PvState,
        path: &std::path::Path,
        check: DiskCheck,
    ) {
        let node = self.identity.node.clone();
        match action {
            SuccessionAction::Readopt { name, resource_version, record_identity, unflag } => {
                let mut ann = serde_json::json!({ ANN_PROVISIONED_BY: self.identity.provisioner });
                if unflag {
                    ann[ANN_VOLUME_STALE] = serde_json::Value::Null;
                }
                if pv.moved_to.is_some() {
                    // The disk is back at its path: it has not moved any more.
                    ann[ANN_VOLUME_MOVED_TO] = serde_json::Value::Null;
                }
                if record_identity {
                    match volume_identity(path) {
                        Ok(id) => ann[ANN_VOLUME_IDENTITY] = serde_json::json!(id),
                        Err(e) => return warn!(pv = %name, error = %e, "cannot read the disk identity; will retry"),
                    }
                }
                let patched = self
                    .cluster
                    .patch_pv_metadata(&name, Some(&resource_version), serde_json::json!({}), ann, None)
                    .await;
                match patched {
                    Ok(()) => {
                        let note = format!(
                            "PV re-adopted by the agent of re-created node {node} ({}): {}",
                            self.node_info.uid,
                            check.describe()
                        );
                        info!(pv = %name, path = %path.display(), "{note}");
                        self.cluster.event(&pv_reference(&name), false, "VolumeReadopted", "Adopt", note).await;
                        self.metrics.succession("readopted");
                    }
                    Err(e) => warn!(pv = %name, error = %e, "re-adopting PV failed (changed meanwhile?); will retry"),
                }
            }
            SuccessionAction::Withdraw { name, uid, resource_version } => {
                match self.cluster.delete_pv(&name, &uid, Some(&resource_version)).await {
                    Ok(()) => {
                        self.note_withdrawn(&uid).await;
                        let note = format!(
                            "unbound PV of an earlier incarnation of node {node} withdrawn: {}",
                            check.describe()
                        );
                        info!(pv = %name, "{note}");
                        self.cluster.event(&pv_reference(&name), false, "VolumeWithdrawn", "Adopt", note).await;
                        self.metrics.succession("withdrawn");
                    }
                    Err(e) => {
                        warn!(pv = %name, error = %e, "withdrawing stale PV failed (bound meanwhile?); will retry")
                    }
                }
            }
            SuccessionAction::ReleaseFinalizer { name, uid } => {
                match self.cluster.remove_finalizer(&name, &uid, FINALIZER_WIPE).await {
                    Ok(()) => {
                        self.note_withdrawn(&uid).await;
                        info!(pv = %name, "stale PV never used by a claim; our finalizer released")
                    }
                    Err(e) => warn!(pv = %name, error = %e, "removing our finalizer failed; will retry"),
                }
            }
            SuccessionAction::Report { name } => {
                let note = format!(
                    "PV of an earlier incarnation of node {node} is not re-adopted: {}. If it is the same disk, \
                     remove the annotation {ANN_VOLUME_IDENTITY} from the PV and the agent re-adopts it, recording \
                     the disk anew; if not, delete its claim when the data is not needed",
                    check.describe()
                );
                self.report_pv_problem(&name, "VolumeUnverified", note).await;
                self.metrics.succession("unverified");
            }
            SuccessionAction::FlagMoved { name } => {
                let Some(to) = where_moved(pv, &self.found_disks) else { return };
                let ann = serde_json::json!({ ANN_VOLUME_MOVED_TO: to, ANN_VOLUME_STALE: null });
                let rv = Some(pv.resource_version.as_str());
                match self.cluster.patch_pv_metadata(&name, rv, serde_json::json!({}), ann, None).await {
                    Ok(()) => {
                        let note = format!(
                            "PV of an earlier incarnation of node {node} is not re-adopted: its disk is at {to} on \
                             this node now, not at its path. A claim uses or used it, so it is kept and never \
                             released by node-cleanup, and the disk is not published at {to}. Put the disk back \
                             at its path to have it re-adopted"
                        );
                        warn!(pv = %name, "{note}");
                        self.cluster.event(&pv_reference(&name), true, "VolumeMoved", "Adopt", note).await;
                        self.metrics.succession("flagged_moved");
                    }
                    Err(e) => warn!(pv = %name, error = %e, "flagging the moved PV failed; will retry"),
                }
            }
            SuccessionAction::Flag { name, check } => {
                if !self.reported.insert(format!("stale/{}", pv.uid)) {
                    return;
                }
                let now = k8s_openapi::jiff::Timestamp::now().to_string();
                let ann = serde_json::json!({ ANN_VOLUME_STALE: now, ANN_VOLUME_MOVED_TO: null });
                let rv = Some(pv.resource_version.as_str());
                match self.cluster.patch_pv_metadata(&name, rv, serde_json::json!({}), ann, None).await {
                    Ok(()) => {
                        let note = format!(
                            "PV of an earlier incarnation of node {node} is stale: {}; a claim uses or used it, so it \
                             is kept. Where node-cleanup is enabled for class {}, it releases the claim after its \
                             grace period; otherwise delete the claim when its data is not needed",
                            check.describe(),
                            pv.class
                        );
                        warn!(pv = %name, "{note}");
                        self.cluster.event(&pv_reference(&name), true, "VolumeStale", "Adopt", note).await;
                        self.metrics.succession("flagged_stale");
                    }
                    Err(e) => {
                        self.reported.remove(&format!("stale/{}", pv.uid));
                        warn!(pv = %name, error = %e, "flagging stale PV failed; will retry");
                    }
                }
            }
        }
    }

    /// Cleanup/presence view of this node's PVs.
    fn own_states(&self) -> Vec<PvState> {
        self.pv_store
            .state()
            .iter()
            .filter(|pv| self.identity.owns(&ObservedPv::from_pv(pv)))
            .map(|pv| PvState::from_pv(pv))
            .collect()
    }

    /// Logs each skipped entry once per occurrence; skips that protect data (symlinks, mounts
    /// of the host itself, unsafe or shared discovery directories) are also Warning events.
    async fn report_skips(&mut self, scan: &Scan) {
        for s in &scan.skipped {
            let key = format!("skip/{}/{}/{}", s.class, s.path.display(), s.reason);
            if !self.unpublished.first_seen(key) {
                continue;
            }
            if s.reason.is_safety_refusal() {
                warn!(class = %s.class, path = %s.path.display(), reason = s.reason.code(), "entry refused: {}", s.reason);
                let note = format!("{} (class {}) not published: {}", s.path.display(), s.class, s.reason);
                // The PV the entry would have become (or the class, for a refused directory)
                // keeps each refusal its own Event.
                let related = match s.path.file_name().and_then(|n| n.to_str()) {
                    Some(entry) if !s.reason.is_class_wide() => {
                        pv_reference(&pv_name(entry, &self.identity.node, &s.class))
                    }
                    _ => class_reference(&s.class),
                };
                self.cluster
                    .event_related(
                        &node_reference(&self.node),
                        Some(related),
                        true,
                        "VolumeNotPublished",
                        "Discover",
                        note,
                    )
                    .await;
            } else {
                info!(class = %s.class, path = %s.path.display(), reason = s.reason.code(), "entry skipped: {}", s.reason);
            }
        }
    }

    async fn report_pv_problem(&mut self, name: &str, reason: &str, note: String) {
        if self.reported.insert(format!("pv/{name}/{reason}/{note}")) {
            warn!(pv = name, "{note}");
            self.cluster.event(&pv_reference(name), true, reason, "Clean", note).await;
        }
    }

    async fn report_node_problem(&mut self, reason: &str, note: String) {
        if self.reported.insert(format!("node/{reason}/{note}")) {
            warn!("{note}");
            self.cluster.event(&node_reference(&self.node), true, reason, "Discover", note).await;
        }
    }
}

/// Waits for this node's Node object: at boot the agent can start before kubelet registers, and
/// the API server can be down or refuse us for a while. Every failure is retried with a growing
/// delay and said (once per distinct cause) in the log and in `/readyz`, so "forbidden" points
/// at missing RBAC; only a Node that exists but is unusable stops the agent.
async fn wait_for_node(cluster: &Cluster, name: &str, readiness: &Readiness) -> Node {
    let mut backoff = crate::core::backoff::Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    let mut last = String::new();
    loop {
        let why = match cluster.node(name).await {
            Ok(node) => return node,
            Err(e) if e.is_not_found() => "Node object not found yet; waiting for it to register".to_string(),
            Err(e) if e.is_refusal() => format!("forbidden to read the Node (check the RBAC from deploy/): {e}"),
            Err(e) => format!("cannot read the Node (API server unreachable?): {e}"),
        };
        if why != last {
            warn!(node = name, "{why}; retrying");
            readiness.set(Some(format!("starting: {why}")));
            last = why;
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

fn node_info(node: &Node) -> Result<NodeInfo, AgentError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let uid = node.metadata.uid.clone().unwrap_or_default();
    let labels = node.metadata.labels.clone().unwrap_or_default();
    if uid.is_empty() {
        return Err(AgentError::Node { node: name, message: "has no UID".into() });
    }
    if !labels.contains_key(crate::core::naming::LABEL_HOSTNAME) {
        return Err(AgentError::Node {
            node: name,
            message: "has no kubernetes.io/hostname label; PV node affinity needs it".into(),
        });
    }
    Ok(NodeInfo { name, uid, labels })
}
