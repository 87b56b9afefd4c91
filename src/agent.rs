//! The agent: reconciles the volumes found on this node (desired) with the PVs labelled for
//! this node (actual). Each pass computes everything from scratch, so a restart or a missed
//! event is repaired by the next pass.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::runtime::reflector::Store;
use tokio::sync::Notify;
use tracing::{debug, error, info, warn};

use crate::admin::{Readiness, parse_listen_address, serve};
use crate::api::{ApiError, ClientOptions, Cluster, Created, node_reference, pv_reference};
use crate::cleaner::{Cleaner, CleanerOptions, target_for};
use crate::config::{ConfigError, LoadedConfig, ProvisionerConfig, load_dir};
use crate::core::cleanup::{CleanupAction, PvState, plan_cleanup};
use crate::core::desired::{class_policy, desired_pvs};
use crate::core::naming::{ANN_CLEANUP_RESULT, ANN_VOLUME_IDENTITY, FINALIZER_WIPE};
use crate::core::naming::{LABEL_NODE, node_label_value, provisioner_name};
use crate::core::planner::{
    Action, DesiredPv, ExistingPv, Identity, ObservedPv, classify_existing, plan, plan_adoption,
};
use crate::core::pv::{ClassPolicy, NodeInfo, PvContext};
use crate::discovery::{self, Scan};
use crate::host::identity::volume_identity;
use crate::metrics::Metrics;

/// Settings of `run`.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// ConfigMap directory.
    pub config_dir: PathBuf,
    /// This node's name.
    pub node_name: String,
    /// API connection settings.
    pub client: ClientOptions,
    /// Time between discovery passes when nothing else triggers one.
    pub discovery_period: Duration,
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
    /// The configuration could not be used at start-up.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The API could not be used.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// This node's Node object is unusable.
    #[error("node {node}: {message}")]
    Node { node: String, message: String },
    /// The admin server could not start.
    #[error(transparent)]
    Admin(#[from] crate::admin::AdminError),
}

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(opts: AgentOptions) -> Result<(), AgentError> {
    let LoadedConfig { config, warnings } = load_dir(&opts.config_dir)?;
    for w in &warnings {
        warn!(config_dir = %opts.config_dir.display(), "{w}");
    }
    info!(classes = config.storage_class_map.len(), config_dir = %opts.config_dir.display(), "configuration loaded");

    let metrics = Metrics::new();
    metrics.set_config_valid(true);
    let readiness = Readiness::new("starting: waiting for the Node and the PV watch");
    let addr = parse_listen_address(&opts.listen_address)?;
    serve(addr, opts.metrics_path.clone(), metrics.clone(), readiness.clone()).await?;

    let cluster = Cluster::connect(&opts.client, &opts.node_name).await?;
    let node = wait_for_node(&cluster, &opts.node_name).await?;
    let node_info = node_info(&node)?;
    let identity = Identity {
        node: node_info.name.clone(),
        provisioner: provisioner_name(&node_info.name, &node_info.uid, config.use_node_name_only),
        node_label: node_label_value(&node_info.name),
        use_node_name_only: config.use_node_name_only,
    };
    info!(node = %identity.node, provisioner = %identity.provisioner, "agent starting");

    let changed = Arc::new(Notify::new());
    let selector = format!("{LABEL_NODE}={}", identity.node_label);
    let (pv_store, pv_events) = cluster.watch_pvs(&selector);
    let (sc_store, sc_events) = cluster.watch_storage_classes();
    for (what, events) in [("persistentvolumes", pv_events.boxed()), ("storageclasses", sc_events.boxed())] {
        let changed = changed.clone();
        tokio::spawn(async move {
            let mut events = events;
            while let Some(ev) = events.next().await {
                match ev {
                    Ok(()) => changed.notify_one(),
                    Err(e) => warn!(watch = what, error = %e, "watch error; retrying with backoff"),
                }
            }
        });
    }
    pv_store
        .wait_until_ready()
        .await
        .map_err(|e| AgentError::Node { node: identity.node.clone(), message: e.to_string() })?;
    sc_store
        .wait_until_ready()
        .await
        .map_err(|e| AgentError::Node { node: identity.node.clone(), message: e.to_string() })?;

    readiness.set(None);
    let (cleaner, mut wipes_done) = Cleaner::new(cluster.clone(), opts.cleaner.clone(), metrics.clone());
    let mut agent = Agent {
        cleaner,
        metrics,
        cluster,
        config,
        node,
        node_info,
        identity,
        pv_store,
        sc_store,
        concurrency: opts.create_concurrency.max(1),
        adopted: false,
        foreign: BTreeMap::new(),
        reported: BTreeSet::new(),
    };
    let mut ticker = tokio::time::interval(opts.discovery_period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut shutdown = std::pin::pin!(shutdown_signal());
    loop {
        let retry = agent.cleaner.next_retry().map(tokio::time::Instant::from_std);
        tokio::select! {
            _ = &mut shutdown => break,
            _ = ticker.tick() => {}
            _ = changed.notified() => {
                // Let a burst of watch events settle into one pass.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Some(outcome) = wipes_done.recv() => agent.cleaner.finished(&outcome),
            _ = sleep_until_opt(retry) => {}
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

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

struct Agent {
    cleaner: Cleaner,
    metrics: Metrics,
    cluster: Cluster,
    config: ProvisionerConfig,
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
}

impl Agent {
    async fn reconcile(&mut self) {
        let started = std::time::Instant::now();
        if !self.adopted {
            self.adopted = self.adopt().await;
        }
        let config = self.config.clone();
        let scan = match tokio::task::spawn_blocking(move || discovery::scan(&config)).await {
            Ok(Ok(scan)) => scan,
            Ok(Err(e)) => return error!(error = %e, "discovery failed"),
            Err(e) => return error!(error = %e, "discovery task failed"),
        };
        self.report_skips(&scan);
        let policies = self.class_policies();
        let ctx =
            PvContext { config: &self.config, node: &self.node_info, provisioner_name: &self.identity.provisioner };
        let (desired, problems) = desired_pvs(&ctx, &scan.volumes, &policies);
        for p in problems {
            let note = format!("volumes of StorageClass {} are not published: {}", p.class, p.message);
            self.report_node_problem("ClassUnavailable", note).await;
        }
        let observed: Vec<ObservedPv> = self.pv_store.state().iter().map(|pv| ObservedPv::from_pv(pv)).collect();
        let actions = plan(&self.identity, &desired, &observed, &self.foreign);
        let planned = actions.len();
        self.execute(actions, &desired).await;
        self.clean().await;
        debug!(
            desired = desired.len(),
            observed = observed.len(),
            actions = planned,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "pass done"
        );
        self.metrics.pass_done(started.elapsed());
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
            match self.take_over(pv).await {
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

    /// Plans and starts cleanup for this node's PVs (see core::cleanup).
    async fn clean(&mut self) {
        let pvs = self.pv_store.state();
        let states: Vec<PvState> = pvs
            .iter()
            .filter(|pv| self.identity.owns(&ObservedPv::from_pv(pv)))
            .map(|pv| PvState::from_pv(pv))
            .collect();
        let busy = self.cleaner.busy();
        for action in plan_cleanup(&states, &busy) {
            match action {
                CleanupAction::AddFinalizer { name } => {
                    let Some(pv) = pvs.iter().find(|pv| pv.metadata.name.as_deref() == Some(name.as_str())) else {
                        continue;
                    };
                    match self.take_over(pv).await {
                        Ok(()) => info!(pv = %name, "added our wipe finalizer"),
                        Err(e) => warn!(pv = %name, error = %e, "adding our finalizer failed; will retry"),
                    }
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
                        Ok(()) => info!(pv = %name, "PV deleted before any claim used it; nothing to wipe"),
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
        for action in actions {
            match action {
                Action::Create(pv) => creates.push(pv),
                Action::Refuse { name, host_path, reason } => {
                    let key = format!("refuse/{name}/{host_path}/{reason}");
                    if self.reported.insert(key) {
                        warn!(pv = %name, path = %host_path, "volume not published: {reason}");
                        let note = format!("volume at {host_path} not published as {name}: {reason}");
                        self.cluster
                            .event(&node_reference(&self.node), true, "VolumeNotPublished", "Publish", note)
                            .await;
                    }
                }
            }
        }
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
                Ok(Created::Created) => {
                    info!(pv = %name, path = %path, "created PV");
                    let mode = pv.spec.as_ref().and_then(|s| s.volume_mode.as_deref()).unwrap_or("Filesystem");
                    self.metrics.pv_created(if mode == "Block" { "block" } else { "fs" });
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
                Err(e) => error!(pv = %name, path = %path, error = %e, "creating PV failed; will retry"),
            }
        }
    }

    fn report_skips(&mut self, scan: &Scan) {
        for s in &scan.skipped {
            let key = format!("skip/{}/{}/{}", s.class, s.path.display(), s.reason);
            if self.reported.insert(key) {
                info!(class = %s.class, path = %s.path.display(), "entry skipped: {}", s.reason);
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

/// Waits for this node's Node object; at boot the agent can start before kubelet registers.
async fn wait_for_node(cluster: &Cluster, name: &str) -> Result<Node, AgentError> {
    let mut delay = Duration::from_millis(500);
    loop {
        match cluster.node(name).await {
            Ok(node) => return Ok(node),
            Err(e) if e.is_not_found() => {
                warn!(node = name, "Node object not found yet; waiting for it to register");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
            Err(e) => return Err(e.into()),
        }
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

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            // Without signal handlers the agent still runs; it just cannot stop gracefully.
            std::future::pending::<()>().await;
        }
    }
}
