//! The agent: reconciles the volumes found on this node (desired) with the PVs labelled for
//! this node (actual). Each pass observes the host once (one blocking call: scan, mount table,
//! disk checks), runs the pure planners (`core::`), and carries out their actions; a failed
//! effect is kept with its own retry deadline, which wakes the loop. Each pass computes
//! everything from scratch, so a restart or a missed event is repaired by the next pass.
//!
//! Layout: `node` (the Node and this agent's identity), `config` (reloads), `observe` (the
//! host, once per pass), `publish` (new PVs, adoption), `marks` (used marks), `presence`
//! (vanished volumes), `fence` (no pod mounts a path that holds another disk), `succession`
//! (PVs of an earlier Node incarnation), `reclaim` (wipes), `health` (failing disks), `effects`
//! (retries) and `report` (events once per occurrence).

mod config;
mod encryption;
mod fence;
mod health;
mod heartbeat;
mod interest;
mod inventory;
mod marks;
mod node;
mod observe;
mod pass;
mod presence;
mod publish;
mod reclaim;
mod report;
mod startup_taint;
mod succession;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::runtime::reflector::Store;
use tokio::sync::{Notify, mpsc};
use tracing::{debug, info, trace, warn};

use crate::admin::{Readiness, parse_listen_address, serve};
use crate::api::{ApiError, ClientOptions, Cluster};
use crate::config::ProvisionerConfig;
use crate::core::health::disk_health::HealthMemory;
use crate::core::mounts::settle::Settler;
use crate::core::reconcile::expectations::Expectations;
use crate::core::reconcile::occurrence::Occurrences;
use crate::core::volumes::naming::LABEL_NODE;
use crate::core::volumes::planner::Identity;
use crate::core::volumes::pv::NodeInfo;
use crate::core::volumes::pv_facts::PvFacts;
use crate::core::wipe::cleanup::PvState;
use crate::host::access::{HostAccess, RealHost};
use crate::host::identity::used_mark::Ledger;
use crate::host::mounts::inotify::Inotify;
use crate::host::mounts::watch::{DirWatcher, MountWatch, Needs, WatchNeeds, watch_block_devices, watch_mounts};
use crate::host::ops::{Operations, Subject};
use crate::host::volumes::kubelet::KubeletView;
use crate::metrics::Metrics;
use crate::runtime::{EventClock, Shutdown, debounced, forward_events_until_synced, jittered, sleep_until_opt};
use crate::wiper::{Cleaner, CleanerOptions, WipeOutcome};

use crate::runtime::effects::Effects;

/// Settings of `run`.
#[derive(Debug, Clone)]
pub(crate) struct AgentOptions {
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
    /// Node-local directory for the ledger of used disks (see host::identity::used_mark).
    pub state_dir: PathBuf,
    /// Where kubelet mounts pods' volumes; no wipe starts while it holds one.
    pub kubelet: KubeletView,
    /// PV creations in flight at once.
    pub create_concurrency: usize,
    /// Wipe limits.
    pub cleaner: CleanerOptions,
    /// Admin server address (metrics, health); upstream's `:8080` form accepted.
    pub listen_address: String,
    /// Path of the metrics endpoint.
    pub metrics_path: String,
    /// The deadline of one host operation on a volume (host::ops).
    pub host_op_timeout: Duration,
    /// Keep this binary in the state directory for the boot fence (host::fence::boot_fence).
    pub install_boot_fence: bool,
    /// Namespace of the heartbeat Lease this agent renews (core::cluster::heartbeat); None: no heartbeat.
    pub heartbeat_namespace: Option<String>,
}

/// Why the agent stopped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AgentError {
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
    State(#[from] crate::host::identity::used_mark::MarkError),
}

/// Runs the agent until SIGTERM or SIGINT.
pub(crate) async fn run(opts: AgentOptions) -> Result<(), AgentError> {
    let mut shutdown = Shutdown::install();
    let metrics = Metrics::new();
    let readiness = Readiness::new("starting: waiting for the Node and the PV watch");
    // Where every host operation that may hang runs under its deadline (host::ops): the
    // config read below already. The agent's only executor: every user (the config read, the
    // directory watcher, the host, the cleaner, the agent) takes it in its constructor, so
    // none can make a second pool by being forgotten.
    let ops = Operations::new();
    let mut source = crate::config::ConfigSource::new(&opts.config_dir);
    let first = config::first_load(&mut source, &readiness, &ops, opts.host_op_timeout).await;
    metrics.set_config_valid(first.problem.is_none());
    let addr = parse_listen_address(&opts.listen_address)?;
    serve(addr, opts.metrics_path.clone(), metrics.clone(), readiness.clone()).await?;

    let cluster = Cluster::connect(&opts.client, &opts.node_name).await?.with_metrics(metrics.clone());
    // This node's Node, watched from here on: its fence labels as they are now (a label removed
    // by hand wakes a pass that puts it back). The watch's first event is the Node itself.
    let (node_store, node_events) = cluster.watch_own_node(&opts.node_name);
    let mut node_events = Box::pin(node_events);
    let node = tokio::select! {
        node = node::wait_for_node(&cluster, &opts.node_name, &node_store, &mut node_events, &readiness) => node,
        _ = shutdown.signalled() => {
            info!("stopped before the Node could be read");
            return Ok(());
        }
    };
    let node =
        node.ok_or_else(|| AgentError::Node { node: opts.node_name.clone(), message: "its watch ended".into() })?;
    let node_info = node::node_info(&node)?;
    let use_node_name_only = first.config.as_ref().is_some_and(|c| c.use_node_name_only);
    let identity = node::identity_for(&node_info, use_node_name_only);
    info!(node = %identity.node, provisioner = %identity.provisioner, "agent starting");

    // Host and API events reach the loop through the clock, which notes when they happened.
    let raw = Arc::new(Notify::new());
    let changed = Arc::new(Notify::new());
    let clock = Arc::new(EventClock::default());
    clock.relay(raw.clone(), changed.clone());
    let selector = format!("{LABEL_NODE}={}", identity.node_label);
    let (pv_store, pv_events) = cluster.watch_pvs(Some(&selector));
    let (sc_store, sc_events) = cluster.watch_storage_classes();
    readiness.set(Some("starting: waiting for the PV and StorageClass watches to sync".into()));
    forward_events_until_synced("persistentvolumes", pv_events, raw.clone(), Some(readiness.clone()));
    forward_events_until_synced("storageclasses", sc_events, raw.clone(), Some(readiness.clone()));
    let synced = async {
        pv_store.wait_until_ready().await?;
        sc_store.wait_until_ready().await
    };
    tokio::select! {
        ready = synced => ready.map_err(|e| AgentError::Node { node: identity.node.clone(), message: e.to_string() })?,
        _ = shutdown.signalled() => {
            info!("stopped before the PV watch synced");
            return Ok(());
        }
    }
    forward_events_until_synced("node", node_events, raw.clone(), None);
    // Which mounts wake a pass: each pass says (Agent::say_interest).
    let mount_watch = Arc::new(MountWatch::new(Some(opts.kubelet.dir.clone())));
    if let Err(e) = watch_mounts(raw.clone(), mount_watch.clone()) {
        warn!(error = %e, "mount events unavailable; new mounts are found by the periodic resync");
    }
    // The claimed devices of unbound PVs: the claim pass names them, the watch follows their
    // write counters.
    let watched = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    // What the watch reads periodically: each pass says (Agent::say_watch_needs).
    let watch_needs = Arc::new(WatchNeeds::new(watched.clone()));
    // One inotify instance for the whole agent (host::mounts::inotify): the block-device watch and the
    // directory watcher share it. When instances or watches run out, it says so (the pass
    // tells it on the Node, Agent::say_watch_shortage) and retries on its own.
    let inotify = match Inotify::start(raw.clone()) {
        Ok(inotify) => Some(inotify),
        Err(e) => {
            warn!(error = %e, "inotify unavailable; changes are found by mount events and the periodic resync");
            None
        }
    };
    if let Some(inotify) = &inotify
        && let Err(e) = watch_block_devices(raw.clone(), watch_needs.clone(), inotify.clone())
    {
        warn!(error = %e, "block device changes unavailable; new disks are claimed at the periodic resync");
    }
    // A stuck operation that returns (a disk that answers again) wakes a pass.
    let answered = raw.clone();
    ops.on_wake(move || answered.notify_one());
    // The kernel log's disk-failure lines (core::health::kernel_log): the only sign of a disk that
    // fails only writes. Without CAP_SYSLOG (dmesg_restrict) the sign is not seen: said once.
    let kernel_log = Arc::new(std::sync::Mutex::new(crate::core::health::kernel_log::KernelLogMemory::default()));
    let kmsg = std::path::Path::new(crate::host::health::kernel_log::KMSG);
    match crate::host::health::kernel_log::watch_kernel_log(kmsg, kernel_log.clone(), raw.clone()) {
        Ok(()) => info!("following the kernel log for disk I/O errors"),
        Err(e) => warn!(
            error = %e,
            "the kernel log is not readable (CAP_SYSLOG, kernel.dmesg_restrict): a disk that fails only writes is not \
             seen (the sign kernel-log); every other failing-disk sign still is"
        ),
    }
    let dir_watcher = inotify.clone().map(|i| DirWatcher::new(i, raw.clone(), ops.clone(), opts.host_op_timeout));
    let ledger = Ledger::open(&opts.state_dir)?;
    info!(ledger = %ledger.path().display(), "ledger of used disks opened");
    // The boot fence's binary on the host (deploy/host/): this agent's version. In the
    // background: it reads this binary and the installed one whole (and writes and syncs it
    // when they differ), which nothing in the first pass waits for.
    if opts.install_boot_fence {
        let state_dir = opts.state_dir.clone();
        tokio::task::spawn_blocking(move || {
            let own = std::path::Path::new("/proc/self/exe");
            match crate::host::fence::boot_fence::install_binary(own, &state_dir) {
                Ok(true) => {
                    let path = crate::host::fence::boot_fence::installed_path(&state_dir);
                    info!(path = %path.display(), "boot fence binary installed")
                }
                Ok(false) => {}
                Err(e) => warn!(error = %e, "could not install the boot fence's binary on the host (deploy/host/)"),
            }
        });
    }
    // A full read (verify: full) that progresses or ends wakes a pass, like a host change.
    let wake = raw.clone();
    let real = RealHost::new(ledger, opts.kubelet.clone(), ops.clone(), opts.host_op_timeout)
        .watching(watched)
        .on_full_read_change(move || wake.notify_one());
    let host: Arc<dyn HostAccess> = Arc::new(real);
    let (cleaner, wipes_done) =
        Cleaner::new(cluster.clone(), host.clone(), ops.clone(), opts.cleaner.clone(), metrics.clone());
    let parts = Parts { cluster, host, ops, cleaner, metrics, readiness, node, pv_store, sc_store };
    let mut agent = Agent::new(parts, &opts, first.config, first.problem, source)?;
    agent.config_state.left_out_classes = first.left_out;
    agent.config_state.config_warnings = first.warnings;
    agent.say_readiness();
    agent.watches.dir_watcher = dir_watcher;
    agent.watches.inotify = inotify;
    agent.watches.watch_needs = Some(watch_needs);
    agent.watches.mount_watch = Some(mount_watch);
    agent.kernel_log = kernel_log;
    agent.node_store = Some(node_store);
    // Before anything else: no pod newly mounts a volume of this node until this agent's first
    // pass has checked every disk (the agent before may have been killed without fencing).
    agent.fence_at_start().await;
    // Its own task and its own rate limiter (the election's): a burst of PV writes never
    // delays a renewal, and a renewal never wakes a pass. Ends with the process.
    let heartbeat = opts.heartbeat_namespace.clone().and_then(|ns| {
        let uid = agent.node_info.uid.clone();
        heartbeat::spawn(agent.cluster.for_leader_election(), ns, opts.node_name.clone(), uid)
    });
    agent.run_loop(&opts, changed, clock, wipes_done, &mut shutdown).await;
    // Stopped (SIGTERM): no more renewals. The Lease is left to lapse; the stopping agent's
    // own fence (agent-stopped) is on the Node, so node-cleanup has nothing to add.
    if let Some(heartbeat) = heartbeat {
        heartbeat.abort();
    }
    Ok(())
}

/// What an agent is made of (real in `run`, a mock API and a fake host in the unit tests).
pub(crate) struct Parts {
    pub cluster: Cluster,
    pub host: Arc<dyn HostAccess>,
    /// The pool of per-volume operations, shared by the host, the cleaner and the agent.
    pub ops: Operations,
    pub cleaner: Cleaner,
    pub metrics: Metrics,
    pub readiness: Readiness,
    pub node: Node,
    pub pv_store: Store<PvFacts>,
    pub sc_store: Store<StorageClass>,
}

/// What reading the configuration remembers between passes: where it comes from, why the one
/// on disk is not in use, what was told of it. Read and written by agent::config only (and the
/// inventory, which reports it).
struct ConfigState {
    /// Where the configuration comes from, re-read only when it changed.
    source: crate::config::ConfigSource,
    /// Why the configuration on disk is not the one in use, if it is not.
    config_problem: Option<String>,
    /// Classes of the ConfigMap left out as invalid (never valid since start-up), with their
    /// problems: their PVs are kept as they are, and a refused wipe says why.
    left_out_classes: BTreeMap<String, String>,
    /// The unknown keys of the configuration on disk (config::LoadedConfig::warnings), and
    /// those last told on the Node: told again only when they change.
    config_warnings: Vec<String>,
    told_warnings: Vec<String>,
    /// Whether the problems of the first read were told (they are read before the API is).
    told_first_load: bool,
    /// Whether the last read of the config directory gave no answer (host::ops).
    config_unread: bool,
}

/// The watches that wake passes, and what each pass tells them it needs (agent::interest,
/// agent::config).
#[derive(Default)]
struct WatchState {
    dir_watcher: Option<DirWatcher>,
    /// The agent's one inotify instance, and the shortage of it last told on the Node.
    inotify: Option<Arc<Inotify>>,
    told_shortage: crate::core::mounts::inotify::Shortage,
    /// What the block-device watch must read periodically, from what the last pass found.
    watch_needs: Option<Arc<WatchNeeds>>,
    /// Which mount changes wake a pass, from what the last pass read.
    mount_watch: Option<Arc<MountWatch>>,
}

/// Settle windows: a found volume, a vanished one, a stale predecessor must stay so for a while
/// before a pass acts on it; the loop wakes at the next window's end.
#[derive(Default)]
struct SettleState {
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
    /// Found volumes the last publishing left inside their settle window.
    settling: usize,
}

/// What the marking stages remember: disks found carrying their complete used mark, disk-id
/// labels put on, and where every found volume's disk is.
#[derive(Default)]
struct MarkState {
    /// UIDs of PVs whose disk was found carrying their complete used mark, and whether it
    /// records a claim: not read again until a claim shows up on an unclaimed one.
    marked: BTreeMap<String, bool>,
    /// PVs (by UID) this process put the disk-id label on, with the resourceVersion they had:
    /// not patched again while the store still shows that version.
    disk_labelled: BTreeMap<String, String>,
    /// (host path, identity) of every volume the last scan found, settled or not: where a PV's
    /// disk that left its path went.
    found_disks: Vec<(String, String)>,
}

/// The agent's state between passes: owned sub-states, each read and written by the stages
/// named on it, and the parts shared by all.
pub(crate) struct Agent {
    cluster: Cluster,
    host: Arc<dyn HostAccess>,
    /// Where per-volume host operations run under their deadline (host::ops).
    ops: Operations,
    /// That deadline.
    host_timeout: Duration,
    /// What the failing-disk judge remembers between passes (I/O error counters).
    health: HealthMemory,
    /// The resync period the flag sets (`None`: the config's minResyncPeriod, jittered up to
    /// twice): the longest the loop may wait between passes, for /healthz.
    discovery_period: Option<Duration>,
    cleaner: Cleaner,
    metrics: Metrics,
    readiness: Readiness,
    /// The configuration in use: the last valid one read.
    config: ProvisionerConfig,
    /// Whether any valid configuration has been read yet.
    has_config: bool,
    /// The devices the kernel log said failed (host::health::kernel_log fills it).
    kernel_log: Arc<std::sync::Mutex<crate::core::health::kernel_log::KernelLogMemory>>,
    node: Node,
    /// The watch of this Node (None in unit tests that do not give one), and the
    /// resourceVersion of the copy last taken from it.
    node_store: Option<Store<Node>>,
    watched_version: Option<String>,
    node_info: NodeInfo,
    identity: Identity,
    pv_store: Store<PvFacts>,
    sc_store: Store<StorageClass>,
    concurrency: usize,
    adopted: bool,
    /// PV names found (through AlreadyExists) to belong to another volume, tried again with
    /// backoff (effect `collision/<name>`) and forgotten once free or no longer wanted.
    foreign: BTreeMap<String, String>,
    /// PVs this agent created, or deleted, that its store does not show so yet
    /// (core::reconcile::expectations).
    expectations: Expectations,
    /// What each fence in force last told its owners (core::fence::volume_fence::fences_to_tell).
    fences_told:
        BTreeMap<String, (crate::core::fence::volume_fence::FenceReason, crate::core::fence::volume_fence::FenceFacts)>,
    /// Failed effects and their retry deadlines.
    effects: Effects,
    /// Problems reported in this pass and the last: each is reported once per occurrence and
    /// forgotten when a pass no longer sees it.
    problems: Occurrences,
    /// When the previous scan started: a change event older than that revealed nothing new.
    last_scan: Option<Instant>,
    /// The node inventory: what was last written, this pass's inputs, the used-disk copy.
    inventory: inventory::InventoryState,
    /// Whether the start-up taint was removed (or found absent) since this process started
    /// (core::fence::startup_taint).
    startup_taint_done: bool,
    /// The encrypted volumes' keys: the store's last listing, keys readied lately, keys known
    /// in the kernel (agent::encryption).
    keys: encryption::KeyState,
    config_state: ConfigState,
    watches: WatchState,
    settles: SettleState,
    marks: MarkState,
}

impl Agent {
    pub(crate) fn new(
        parts: Parts,
        opts: &AgentOptions,
        config: Option<ProvisionerConfig>,
        config_problem: Option<String>,
        source: crate::config::ConfigSource,
    ) -> Result<Self, AgentError> {
        let node_info = node::node_info(&parts.node)?;
        let use_node_name_only = config.as_ref().is_some_and(|c| c.use_node_name_only);
        let identity = node::identity_for(&node_info, use_node_name_only);
        Ok(Agent {
            cluster: parts.cluster,
            host: parts.host,
            ops: parts.ops,
            host_timeout: opts.host_op_timeout,
            health: HealthMemory::default(),
            discovery_period: opts.discovery_period,
            cleaner: parts.cleaner,
            metrics: parts.metrics,
            readiness: parts.readiness,
            has_config: config.is_some(),
            config: config.unwrap_or_default(),
            kernel_log: Arc::default(),
            node: parts.node,
            node_store: None,
            watched_version: None,
            node_info,
            identity,
            pv_store: parts.pv_store,
            sc_store: parts.sc_store,
            concurrency: opts.create_concurrency.max(1),
            adopted: false,
            foreign: BTreeMap::new(),
            expectations: Expectations::default(),
            fences_told: BTreeMap::new(),
            effects: Effects::default(),
            problems: Occurrences::default(),
            last_scan: None,
            inventory: inventory::InventoryState::default(),
            startup_taint_done: false,
            keys: encryption::KeyState::default(),
            marks: MarkState { marked: BTreeMap::new(), disk_labelled: BTreeMap::new(), found_disks: Vec::new() },
            settles: SettleState {
                settle: opts.settle,
                succession_settle: opts.succession_settle.max(opts.settle),
                new_volumes: Settler::default(),
                vanished: Settler::default(),
                stale: Settler::default(),
                next_settle: None,
                settling: 0,
            },
            watches: WatchState {
                dir_watcher: None,
                inotify: None,
                told_shortage: Default::default(),
                watch_needs: None,
                mount_watch: None,
            },
            config_state: ConfigState {
                source,
                config_problem,
                left_out_classes: BTreeMap::new(),
                config_warnings: Vec::new(),
                told_warnings: Vec::new(),
                told_first_load: false,
                config_unread: false,
            },
        })
    }

    /// Ready once the watches synced, while a valid configuration is in use; the reason
    /// otherwise.
    fn say_readiness(&self) {
        match (&self.config_state.config_problem, self.has_config) {
            (Some(problem), false) => self.readiness.set(Some(format!("no valid configuration: {problem}"))),
            _ => self.readiness.set(None),
        }
    }

    /// The loop: a pass after every (debounced) change event, at every settle or retry
    /// deadline, after every finished wipe, and at the periodic resync; until a signal.
    async fn run_loop(
        &mut self,
        opts: &AgentOptions,
        changed: Arc<Notify>,
        clock: Arc<EventClock>,
        mut wipes_done: mpsc::UnboundedReceiver<WipeOutcome>,
        shutdown: &mut Shutdown,
    ) {
        let mut resync_at = tokio::time::Instant::now();
        // The Node was read just before the loop: the first resync (the first pass) does not
        // read it again.
        let mut node_fresh = true;
        loop {
            let wake = self.next_wake().map(tokio::time::Instant::from_std);
            tokio::select! {
                _ = shutdown.signalled() => break,
                _ = tokio::time::sleep_until(resync_at) => {
                    let period = opts.discovery_period.unwrap_or(self.config.min_resync_period);
                    resync_at = tokio::time::Instant::now() + jittered(period, opts.discovery_period.is_none());
                    debug!(next_in_s = (resync_at - tokio::time::Instant::now()).as_secs(), "periodic resync");
                    if !std::mem::take(&mut node_fresh) {
                        self.refresh_node().await;
                    }
                }
                _ = changed.notified() => {
                    trace!("pass triggered by an event");
                    // Let a burst of watch events settle into one pass, but never past a settle
                    // or retry deadline: an event that arrives just before a new volume settles
                    // (the PV controller setting the last PV Available) must not delay its PV.
                    tokio::time::sleep_until(debounced(tokio::time::Instant::now(), wake)).await;
                }
                Some(outcome) = wipes_done.recv() => {
                    self.inventory_wipe_done(&outcome.key, outcome.result.is_ok());
                    self.cleaner.finished(&outcome);
                }
                _ = sleep_until_opt(wake) => trace!("pass triggered by a settle or retry deadline"),
            }
            self.reconcile(clock.latest()).await;
        }
        self.shut_down(&mut wipes_done).await;
    }

    /// The earliest settle or retry deadline: the loop wakes for it, whatever else happens.
    fn next_wake(&self) -> Option<Instant> {
        // An expectation that expires lets the store judge its disk again (a past one waits for
        // the next pass: a pass that stops early must not wake the loop at once for it).
        let expiry = self.expectations.next_expiry().filter(|at| *at > Instant::now());
        [
            self.cleaner.next_retry(),
            self.settles.next_settle,
            self.effects.next_due(),
            self.ops.next_retry(),
            expiry,
            self.inventory_due(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Wipes in flight are abandoned safely: their PVs keep our finalizer and are wiped again
    /// from the start after the restart. Waits up to 10 s for them to stop.
    async fn shut_down(&mut self, wipes_done: &mut mpsc::UnboundedReceiver<WipeOutcome>) {
        let running = self.cleaner.cancel_all();
        self.fence_on_stop().await;
        info!(running_wipes = running, "shutting down");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.cleaner.running() > 0 {
            match tokio::time::timeout_at(deadline, wipes_done.recv()).await {
                Ok(Some(outcome)) => self.cleaner.finished(&outcome),
                _ => break,
            }
        }
    }

    /// One pass. `revealed`: when the latest change event arrived (new volumes settle from
    /// there).
    async fn reconcile(&mut self, revealed: Option<Instant>) {
        // The resync timer fires within twice its period (jitter): a pass at least that often.
        self.readiness.pass_started(self.discovery_period.unwrap_or(self.config.min_resync_period) * 2);
        self.reconcile_once(revealed).await;
        self.readiness.pass_ended();
    }

    /// `pvs` with those this agent deleted (the store not showing it yet) marked as being
    /// deleted; borrowed when there are none.
    fn deleted_as_deleting<'a>(&self, pvs: &'a [PvState]) -> std::borrow::Cow<'a, [PvState]> {
        if !pvs.iter().any(|pv| !pv.deleting && self.expectations.is_deleted(&pv.uid)) {
            return std::borrow::Cow::Borrowed(pvs);
        }
        let marked = pvs
            .iter()
            .map(|pv| PvState { deleting: pv.deleting || self.expectations.is_deleted(&pv.uid), ..pv.clone() });
        std::borrow::Cow::Owned(marked.collect())
    }

    /// Tells the block-device watch what to read periodically (host::mounts::watch::WatchNeeds), from
    /// this pass's scan: the device list while a class claims devices, ext4 error counts and
    /// SCSI error counters while a volume has them, superblock options while a volume is a
    /// filesystem on a disk (device major not 0: not tmpfs). Nothing while there is none.
    fn say_watch_needs(
        &self,
        scan: &crate::host::volumes::discovery::Scan,
        signs: &[(String, crate::core::health::disk_health::Signs)],
    ) {
        let Some(watch) = &self.watches.watch_needs else { return };
        let on_disk = |v: &crate::core::volumes::pv::FoundVolume| match &v.disk {
            crate::core::volumes::volume_safety::DiskKey::Filesystem { device, .. } => !device.starts_with("0:"),
            crate::core::volumes::volume_safety::DiskKey::Block { .. } => false,
        };
        let ext4 = signs.iter().any(|(_, s)| s.fs_errors.is_some());
        watch.set(Needs {
            claims: self.config.storage_class_map.values().any(|c| c.devices.is_some()),
            ext4,
            io_counters: signs.iter().any(|(_, s)| s.io_errors.is_some()),
            superblocks: ext4 || scan.volumes.iter().any(on_disk),
        });
    }

    /// The identity of the volume at `path` (its PV's `host_path`), read on the pool of
    /// per-volume operations under the deadline: a wedged disk answers an error, not a hang.
    async fn volume_identity(&self, host_path: &str, path: PathBuf) -> Result<String, String> {
        let (ops, timeout, shared) = (self.ops.clone(), self.host_timeout, self.host.clone());
        let subject = Subject::Volume(host_path.to_string());
        let read = self.on_host(move |_| {
            ops.run(subject, "identity read", timeout, move |on| shared.identity(&path, on))
                .or_error("the identity read is still running (a slow disk); tried again later")
        });
        read.await.unwrap_or_else(|| Err("host task failed".into()))
    }

    /// Runs blocking host work on the blocking pool; `None` when the task itself failed.
    async fn on_host<T: Send + 'static>(&self, f: impl FnOnce(&dyn HostAccess) -> T + Send + 'static) -> Option<T> {
        let host = self.host.clone();
        let _waiting = self.readiness.host_call();
        match tokio::task::spawn_blocking(move || f(host.as_ref())).await {
            Ok(v) => Some(v),
            Err(e) => {
                warn!(error = %e, "host task failed");
                None
            }
        }
    }
}
