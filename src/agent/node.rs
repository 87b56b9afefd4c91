//! This node's Node object and the agent's identity derived from it (provisioner name, node
//! label), including a Node deleted and registered again while the agent runs.

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tracing::{debug, warn};

use super::{Agent, AgentError};
use crate::admin::Readiness;
use crate::api::{ApiError, Cluster};
use crate::core::volumes::naming::{node_label_value, provisioner_name};
use crate::core::volumes::planner::Identity;
use crate::core::volumes::pv::NodeInfo;

/// Waits for this node's Node object in the watch of it (`Cluster::watch_own_node`, whose
/// first events are the Node as it is now: no separate read): at boot the agent can start
/// before kubelet registers, and the API server can be down or refuse us for a while. The watch
/// retries every failure with its backoff; each is said (once per distinct cause) in the log
/// and in `/readyz`, so "forbidden" points at missing RBAC. `None`: the watch ended.
pub(super) async fn wait_for_node(
    cluster: &Cluster,
    name: &str,
    store: &Store<Node>,
    events: &mut (impl Stream<Item = Result<(), watcher::Error>> + Unpin),
    readiness: &Readiness,
) -> Option<Node> {
    let mut last = String::new();
    let mut listed = false;
    loop {
        if let Some(node) = store.get(&ObjectRef::new(name)) {
            return Some((*node).clone());
        }
        let why = tokio::select! {
            event = events.next() => match event? {
                Ok(()) => continue,
                Err(e) => why_waiting(cluster, &ApiError::from_watch(format!("node {name}"), e)),
            },
            // The watch has listed what exists, and the Node was not among it.
            ready = store.wait_until_ready(), if !listed => {
                listed = true;
                if ready.is_err() {
                    return None;
                }
                if store.get(&ObjectRef::new(name)).is_some() {
                    continue;
                }
                "Node object not found yet; waiting for it to register".to_string()
            }
        };
        if why != last {
            warn!(node = name, "{why}; retrying");
            readiness.set(Some(format!("starting: {why}")));
            last = why;
        }
    }
}

/// Why the Node could not be read, for the log and `/readyz`.
fn why_waiting(cluster: &Cluster, e: &ApiError) -> String {
    match e {
        e if e.is_refusal() => format!("forbidden to read the Node (check the RBAC from deploy/): {e}"),
        e if e.is_unauthorized() => format!(
            "{} does not accept our credentials (check the kubeconfig or the service account token): {e}",
            cluster.describe_server()
        ),
        e => match e.http_status() {
            Some(code) => format!("cannot read the Node: {} answered {code}: {e}", cluster.describe_server()),
            None => format!("cannot read the Node: cannot reach {}: {e}", cluster.describe_server()),
        },
    }
}

/// The facts of the Node that PVs are built from; a Node without them is unusable.
pub(super) fn node_info(node: &Node) -> Result<NodeInfo, AgentError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let uid = node.metadata.uid.clone().unwrap_or_default();
    let labels = node.metadata.labels.clone().unwrap_or_default();
    if uid.is_empty() {
        return Err(AgentError::Node { node: name, message: "has no UID".into() });
    }
    if !labels.contains_key(crate::core::volumes::naming::LABEL_HOSTNAME) {
        return Err(AgentError::Node {
            node: name,
            message: "has no kubernetes.io/hostname label; PV node affinity needs it".into(),
        });
    }
    Ok(NodeInfo { name, uid, labels })
}

/// Who this agent is to the planners: node, provisioner name, node label.
pub(super) fn identity_for(node: &NodeInfo, use_node_name_only: bool) -> Identity {
    Identity {
        node: node.name.clone(),
        provisioner: provisioner_name(&node.name, &node.uid, use_node_name_only),
        node_label: node_label_value(&node.name),
        use_node_name_only,
    }
}

impl Agent {
    /// Re-reads this Node on each resync (the watch of it, `follow_watched_node`, keeps it
    /// current between; this read is the safety net when the watch fails). A Node that cannot
    /// be read changes nothing.
    pub(super) async fn refresh_node(&mut self) {
        let node = match self.cluster.node(&self.identity.node).await {
            Ok(node) => node,
            Err(e) => return debug!(error = %e, "re-reading the Node failed; keeping what we know"),
        };
        self.take_node(node);
    }

    /// At the start of each pass: the Node as the watch shows it, when it changed since the last
    /// pass took it (an unchanged copy may be older than the Node a fence write of ours
    /// returned). A pass plans its fences from the labels it saw when it started, before it
    /// observed the disks: a label set meanwhile (the boot hook's node-wide fence) is lifted
    /// only by a pass that checked the disks after it was set.
    pub(super) fn follow_watched_node(&mut self) {
        let Some(store) = &self.node_store else { return };
        let Some(node) = store.state().into_iter().find(|n| n.metadata.name.as_deref() == Some(&self.identity.node))
        else {
            return;
        };
        if node.metadata.resource_version.is_some() && node.metadata.resource_version == self.watched_version {
            return;
        }
        self.watched_version = node.metadata.resource_version.clone();
        self.take_node((*node).clone());
    }

    /// When the Node was deleted and registered again (new UID) while the agent kept running,
    /// the agent becomes the new incarnation: its earlier PVs turn into predecessors and
    /// succession decides about them from the disks, as after a restart.
    fn take_node(&mut self, node: Node) {
        let Ok(info) = node_info(&node) else { return };
        if info.uid != self.node_info.uid {
            warn!(node = %info.name, old_uid = %self.node_info.uid, new_uid = %info.uid, "the Node was re-created; taking over as its new incarnation");
            self.identity = identity_for(&info, self.config.use_node_name_only);
            self.adopted = false;
            // The old incarnation's LocalStorageNode goes with it (the garbage collector): the
            // next pass writes the inventory again, creating it owned by this incarnation.
            self.inventory_node_changed();
        }
        self.node = node;
        self.node_info = info;
    }
}
