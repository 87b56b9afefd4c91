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

use crate::api::{ApiError, ClientOptions, Cluster, Created, node_reference, pv_reference};
use crate::config::{ConfigError, LoadedConfig, ProvisionerConfig, load_dir};
use crate::core::desired::{class_policy, desired_pvs};
use crate::core::naming::{LABEL_NODE, node_label_value, provisioner_name};
use crate::core::planner::{
    Action, DesiredPv, ExistingPv, Identity, ObservedPv, classify_existing, plan, plan_adoption,
};
use crate::core::pv::{ClassPolicy, NodeInfo, PvContext};
use crate::discovery::{self, Scan};

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
}

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(opts: AgentOptions) -> Result<(), AgentError> {
    let LoadedConfig { config, warnings } = load_dir(&opts.config_dir)?;
    for w in &warnings {
        warn!(config_dir = %opts.config_dir.display(), "{w}");
    }
    info!(classes = config.storage_class_map.len(), config_dir = %opts.config_dir.display(), "configuration loaded");

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

    let mut agent = Agent {
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
        tokio::select! {
            _ = &mut shutdown => {
                info!("shutting down");
                return Ok(());
            }
            _ = ticker.tick() => {}
            _ = changed.notified() => {
                // Let a burst of watch events settle into one pass.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        agent.reconcile().await;
    }
}

struct Agent {
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
        debug!(
            desired = desired.len(),
            observed = observed.len(),
            actions = planned,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "pass done"
        );
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
            match self.cluster.label_pv(&name, LABEL_NODE, &self.identity.node_label).await {
                Ok(()) => info!(pv = %name, "adopted existing PV of this node"),
                Err(e) => {
                    warn!(pv = %name, error = %e, "adopting PV failed; will retry");
                    ok = false;
                }
            }
        }
        ok
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
                Ok(Created::Created) => info!(pv = %name, path = %path, "created PV"),
                Ok(Created::AlreadyExists(existing)) => {
                    let Some(d) = desired.iter().find(|d| d.name == name && d.host_path == path) else { continue };
                    match classify_existing(&self.identity, d, &ObservedPv::from_pv(&existing)) {
                        ExistingPv::Ours { needs_label: true } => {
                            match self.cluster.label_pv(&name, LABEL_NODE, &self.identity.node_label).await {
                                Ok(()) => info!(pv = %name, path = %path, "adopted existing PV"),
                                Err(e) => warn!(pv = %name, path = %path, error = %e, "adopting PV failed"),
                            }
                        }
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
