//! `node-cleanup`: the cluster-wide Deployment that releases local PVs (and their claims) of
//! Nodes that are gone for good, or that the agent of a re-created Node found stale. Every
//! replica watches PVs and Nodes and tracks absent Nodes, so a failover does not restart the
//! grace period; only the holder of the Lease acts. Every write is fenced: right before it goes
//! out (after the rate limiter), leadership must hold for the write's whole deadline, and the
//! first refusal abandons the rest of the pass.
//!
//! Nodes are watched (metadata only, trimmed to name and hostname label), not listed on every
//! pass: one long request per replica whatever the number of Nodes. Until the Node watch has
//! synced, nothing is done; before acting on a Node taken for gone, its absence is confirmed by
//! a direct query, so a Node that registered again is never acted upon from a stale store.
//!
//! Roles: this module runs the loop, `worker` plans and carries out each pass, `leader` elects
//! the one replica that acts.

pub(crate) mod leader;
mod worker;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::runtime::watcher;
use tokio::sync::Notify;
use tracing::{debug, info, warn};

use crate::admin::{Readiness, parse_listen_address, serve};
use crate::api::lease::lease_record;
use crate::api::{ApiError, ClientOptions, Cluster, NodeMeta};
use crate::core::cluster::heartbeat::{LeaseClock, node_of_heartbeat};
use crate::metrics::{Metrics, Role};
use k8s_openapi::api::coordination::v1::Lease;
use leader::LeaseOptions;
use worker::{Views, Worker};

/// Settings of `node-cleanup`.
#[derive(Debug, Clone)]
pub(crate) struct NodeCleanupOptions {
    /// StorageClasses opted in; PVs of other classes are never touched.
    pub classes: BTreeSet<String>,
    /// How long a Node must be gone (or a PV stale) before its claims and PVs are released.
    pub grace: Duration,
    /// Safety-net pass period (passes also follow PV changes and grace deadlines).
    pub resync: Duration,
    /// The leader Lease.
    pub lease: LeaseOptions,
    /// API connection settings.
    pub client: ClientOptions,
    /// Admin server address.
    pub listen_address: String,
    /// Path of the metrics endpoint.
    pub metrics_path: String,
}

/// Why node-cleanup stopped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NodeCleanupError {
    /// The API could not be used at start.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The admin server could not start.
    #[error(transparent)]
    Admin(#[from] crate::admin::AdminError),
    /// The PV watch never became ready.
    #[error("watching persistentvolumes: {0}")]
    Watch(String),
    /// Nothing to do: no class opted in.
    #[error("no StorageClass opted in: pass --storage-classes (node-cleanup never acts on other classes)")]
    NoClasses,
}

/// Runs until SIGTERM or SIGINT; releases the Lease on the way out.
pub(crate) async fn run(opts: NodeCleanupOptions) -> Result<(), NodeCleanupError> {
    if opts.classes.is_empty() {
        return Err(NodeCleanupError::NoClasses);
    }
    let metrics = Metrics::for_role(Role::NodeCleanup);
    let readiness = Readiness::new("starting: waiting for the PV watch");
    serve(parse_listen_address(&opts.listen_address)?, opts.metrics_path.clone(), metrics.clone(), readiness.clone())
        .await?;
    let cluster =
        Cluster::connect_as(&opts.client, "node-cleanup", &opts.lease.identity).await?.with_metrics(metrics.clone());
    info!(
        classes = ?opts.classes,
        grace_s = opts.grace.as_secs(),
        identity = %opts.lease.identity,
        "node-cleanup starting"
    );

    let changed = Arc::new(Notify::new());
    let (pv_store, pv_events) = cluster.watch_pvs(None);
    crate::runtime::forward_events("persistentvolumes", pv_events, changed.clone());
    let (node_store, node_events) = cluster.watch_node_metadata();
    let node_watch_error = follow_nodes(node_events, changed.clone());
    pv_store.wait_until_ready().await.map_err(|e| NodeCleanupError::Watch(e.to_string()))?;
    readiness.set(None);
    // Candidates only once they can see PVs: a replica whose watch cannot sync never holds the
    // Lease while doing nothing.
    let elector = {
        let (metrics, changed) = (metrics.clone(), changed.clone());
        leader::spawn(cluster.for_leader_election(), opts.lease.clone(), move |leads| {
            metrics.set_leader(leads);
            if leads {
                changed.notify_one(); // Act at once on what is already due.
            } else {
                warn!("leadership lost; not acting until it is regained");
            }
        })
    };

    let request_deadline = opts.lease.request_deadline();
    let cluster = {
        let leadership = elector.leadership.clone();
        cluster.with_fence(request_deadline, move |d| leadership.is_leader_for(d))
    };

    // The agents' heartbeats (core::cluster::heartbeat): a Lease seen for the first time, or a re-list,
    // wakes a fence check; a renewal wakes nothing (its deadline moves; the check wakes at the
    // earliest one).
    let heartbeats = Arc::new(Mutex::new(LeaseClock::default()));
    let heartbeat_seen = Arc::new(Notify::new());
    follow_heartbeats(cluster.watch_leases(&opts.lease.namespace), heartbeats.clone(), heartbeat_seen.clone());
    let views = Views { heartbeats, pvs: pv_store, nodes: node_store, node_watch_error };
    let mut worker =
        Worker::new(cluster, metrics, readiness, elector.leadership.clone(), request_deadline, views, opts.clone());
    let mut shutdown = crate::runtime::Shutdown::install();
    let mut next_due: Option<Instant> = None;
    let mut fence_due: Option<Instant> = None;
    let mut full = true;
    loop {
        if full {
            worker.pass(&mut next_due).await;
        }
        worker.fence_lapsed_agents(&mut fence_due).await;
        let wake = next_due.map(tokio::time::Instant::from_std);
        let fence_wake = fence_due.map(tokio::time::Instant::from_std);
        full = tokio::select! {
            _ = shutdown.signalled() => break,
            _ = tokio::time::sleep(opts.resync) => { debug!("periodic pass"); true }
            _ = changed.notified() => {
                // Let a burst of PV events (or Node deletions) settle into one pass.
                tokio::time::sleep(Duration::from_millis(200)).await;
                true
            }
            _ = crate::runtime::sleep_until_opt(wake) => { debug!("pass for a grace deadline"); true }
            _ = crate::runtime::sleep_until_opt(fence_wake) => { debug!("heartbeat deadline"); false }
            _ = heartbeat_seen.notified() => false,
        };
    }
    info!("shutting down");
    elector.release().await;
    Ok(())
}

/// Polls the Lease watch in the background and keeps `clock` (since when each agent's
/// heartbeat has been unchanged) fresh; wakes `seen` for a heartbeat not known before, one
/// renewed after it lapsed, and at the end of each (re-)list, never for a live one's renewal.
fn follow_heartbeats(
    events: impl futures::Stream<Item = Result<watcher::Event<Lease>, watcher::Error>> + Send + 'static,
    clock: Arc<Mutex<LeaseClock>>,
    seen: Arc<Notify>,
) {
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        let mut listing = BTreeSet::new();
        let mut last_error: Option<String> = None;
        while let Some(event) = events.next().await {
            let now = Instant::now();
            let Ok(mut clock) = clock.lock() else { return };
            let observe = |lease: &Lease, clock: &mut LeaseClock| -> bool {
                let Some(name) = lease.metadata.name.as_deref().filter(|n| node_of_heartbeat(n).is_some()) else {
                    return false;
                };
                clock.observe(name, lease_record(lease), now)
            };
            match event {
                Ok(watcher::Event::Apply(lease)) => {
                    if observe(&lease, &mut clock) {
                        seen.notify_one();
                    }
                }
                Ok(watcher::Event::Delete(lease)) => {
                    if let Some(name) = lease.metadata.name.as_deref() {
                        clock.forget(name);
                    }
                }
                Ok(watcher::Event::Init) => listing.clear(),
                Ok(watcher::Event::InitApply(lease)) => {
                    let _ = observe(&lease, &mut clock); // InitDone wakes the check.
                    listing.extend(lease.metadata.name.clone());
                }
                Ok(watcher::Event::InitDone) => {
                    clock.retain(&std::mem::take(&mut listing));
                    seen.notify_one();
                }
                Err(e) => {
                    let text = crate::api::error_chain(&e);
                    if last_error.as_deref() != Some(text.as_str()) {
                        warn!(watch = "leases", error = %text, "watch error (agents' heartbeats); retrying with backoff");
                    }
                    last_error = Some(text);
                    continue;
                }
            }
            last_error = None;
        }
    });
}

/// The last error of the Node watch, cleared by its next answer: said when a pass cannot run
/// for want of Nodes.
pub(crate) type NodeWatchError = Arc<Mutex<Option<String>>>;

/// Polls the Node watch in the background (it must be polled to keep its store fresh). Only a
/// deletion, or the end of a (re-)list, wakes a pass: a deletion starts a grace period. A Node
/// that appears changes nothing until the next pass (and is checked live before anything of it
/// is released), and the steady stream of updates that kubelets' status reports cause on a big
/// cluster must not each cost a pass.
fn follow_nodes(
    events: impl futures::Stream<Item = Result<watcher::Event<NodeMeta>, watcher::Error>> + Send + 'static,
    changed: Arc<Notify>,
) -> NodeWatchError {
    let last_error = NodeWatchError::default();
    let error = last_error.clone();
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            let failed = match event {
                Ok(event) => {
                    if matches!(event, watcher::Event::Delete(_) | watcher::Event::InitDone) {
                        changed.notify_one();
                    }
                    None
                }
                Err(e) => {
                    // The whole cause chain, said once per distinct error in a row (as the
                    // other watches in runtime::forward_events).
                    let text = crate::api::error_chain(&e);
                    if error.lock().ok().and_then(|last| last.clone()).as_deref() != Some(text.as_str()) {
                        warn!(watch = "nodes", error = %text, "watch error; retrying with backoff");
                    }
                    Some(text)
                }
            };
            if let Ok(mut last) = error.lock() {
                *last = failed;
            }
        }
    });
    last_error
}
