//! The Node: this node's object and its fence labels, whether a Node exists (node-cleanup), and
//! the metadata-only watch of all Nodes node-cleanup keeps.

use std::collections::BTreeMap;

use futures::{Stream, StreamExt as _};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};

use crate::core::fence::fence_label::LABEL_VOLUMES_UNVERIFIED;
use crate::core::volumes::naming::LABEL_HOSTNAME;

/// An owner reference to the Node `name` with UID `uid`: what a node's own objects (its
/// LocalStorageNode, its agent's heartbeat Lease) carry, so the garbage collector removes them
/// with the Node and nothing of a deleted node is left behind.
pub fn node_owner(name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: name.to_string(),
        uid: uid.to_string(),
        ..Default::default()
    }
}

use super::*;

/// What of its own Node wakes the agent: its UID and labels.
type FenceFacts = (Option<String>, Option<BTreeMap<String, String>>);

/// A Node's metadata, as node-cleanup watches it.
pub type NodeMeta = PartialObjectMeta<Node>;

/// Keeps of a Node's metadata only what node-cleanup reads: its name, UID, its node-wide volume
/// fence label when it carries one, and its `kubernetes.io/hostname` label, the label only when it differs from the name (matching by it
/// then adds nothing; it is nearly always so, and a one-entry map costs more than the rest).
/// A Node carries dozens of labels and annotations (and every status update its kubelet makes
/// rewrites its managedFields) that no decision needs; the type strings are the same for all.
pub(super) fn trim_node(node: &mut NodeMeta) {
    let meta = std::mem::take(&mut node.metadata);
    let mut labels = meta.labels.unwrap_or_default();
    let hostname = labels.remove_entry(LABEL_HOSTNAME).filter(|(_, v)| meta.name.as_ref() != Some(v));
    // The node-wide volume fence: node-cleanup sets it when the agent's heartbeat lapses, unless
    // it is there already (core::cluster::heartbeat).
    let fence = labels.remove_entry(LABEL_VOLUMES_UNVERIFIED);
    let kept: BTreeMap<String, String> = hostname.into_iter().chain(fence).collect();
    node.types = None;
    node.metadata = ObjectMeta {
        name: meta.name,
        uid: meta.uid,
        resource_version: meta.resource_version,
        labels: (!kept.is_empty()).then_some(kept),
        ..ObjectMeta::default()
    };
}

impl Cluster {
    /// Reads this node's Node object (UID and labels go into every PV).
    pub async fn node(&self, name: &str) -> Result<Node, ApiError> {
        let api = Api::<Node>::all(self.client.clone());
        self.call("get", api.get(name)).await.map_err(ApiError::request("get node", name))
    }

    /// Sets (`Some`) or removes (`None`) labels of a Node, nothing else, with a merge patch:
    /// the agent's volume fences on its own Node (core::fence::volume_fence). Returns the Node as it is now.
    pub async fn patch_node_labels(
        &self,
        name: &str,
        labels: &std::collections::BTreeMap<String, Option<String>>,
    ) -> Result<Node, ApiError> {
        let patch = serde_json::json!({ "metadata": { "labels": labels } });
        let api = Api::<Node>::all(self.client.clone());
        self.send("patch", "patch node labels", name, api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)))
            .await?
            .map_err(ApiError::request("patch node labels", name))
    }

    /// Replaces the taints of a Node with `remaining`, nothing else, with a JSON patch that first
    /// tests they are still `expected` (what the caller read): a taint added or removed
    /// meanwhile fails the write (422) instead of being undone. The agent's start-up taint
    /// removal (core::fence::startup_taint). Returns the Node as it is now.
    pub async fn replace_node_taints(
        &self,
        name: &str,
        expected: &[k8s_openapi::api::core::v1::Taint],
        remaining: &[k8s_openapi::api::core::v1::Taint],
    ) -> Result<Node, ApiError> {
        let ops = serde_json::json!([
            {"op": "test", "path": "/spec/taints", "value": expected},
            {"op": "replace", "path": "/spec/taints", "value": remaining},
        ]);
        let patch: json_patch::Patch = serde_json::from_value(ops)
            .map_err(|e| ApiError::Config { source_name: "taint patch".into(), message: e.to_string() })?;
        let api = Api::<Node>::all(self.client.clone());
        let patched = Patch::<()>::Json(patch);
        self.send("patch", "remove node taint", name, api.patch(name, &PatchParams::default(), &patched))
            .await?
            .map_err(ApiError::request("remove node taint", name))
    }

    /// A watch of one Node, `name` (the agent's own), by field selector: the labels its volume
    /// fences are planned from as they are now, not as a read at start-up or at the last resync
    /// left them, so a fence label removed by hand is put back within a pass. The store holds
    /// the Node; the stream yields once the store's Node changed its UID or labels, or came or
    /// went (kubelet's status updates change neither and wake nothing), judged after each event
    /// reached the store (a list's objects reach it together, at its end), and must be polled
    /// to keep the store fresh.
    pub fn watch_own_node(
        &self,
        name: &str,
    ) -> (Store<Node>, impl Stream<Item = Result<(), watcher::Error>> + Send + 'static) {
        let (reader, writer) = reflector::store();
        let api = Api::<Node>::all(self.client.clone());
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let (store, key) = (reader.clone(), reflector::ObjectRef::<Node>::new(name));
        // Before the first list ends there is nothing to compare with.
        let mut last: Option<Option<FenceFacts>> = None;
        let events = super::watch::watch_objects("node", api, config).default_backoff();
        let stream = reflector::reflector(writer, events).filter_map(move |event| {
            let out = match event {
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => None,
                Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone) => {
                    let now = store.get(&key).map(|node| (node.metadata.uid.clone(), node.metadata.labels.clone()));
                    (last.as_ref() != Some(&now)).then(|| {
                        last = Some(now);
                        Ok(())
                    })
                }
                Err(e) => Some(Err(e)),
            };
            futures::future::ready(out)
        });
        (reader, stream)
    }

    /// Whether a Node named `key`, or labelled `kubernetes.io/hostname=key`, exists now: asked
    /// right before node-cleanup acts, so a Node that registered again meanwhile is not taken
    /// for gone.
    pub async fn node_present(&self, key: &str) -> Result<bool, ApiError> {
        let api = Api::<Node>::all(self.client.clone());
        for params in [
            ListParams::default().fields(&format!("metadata.name={key}")).limit(1),
            ListParams::default().labels(&format!("kubernetes.io/hostname={key}")).limit(1),
        ] {
            let page =
                self.call("list", api.list_metadata(&params)).await.map_err(ApiError::request("list nodes", key))?;
            if !page.items.is_empty() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// A reflector over the Nodes of the cluster for node-cleanup: metadata only, each Node
    /// trimmed to its name, UID and hostname label (all that tells a deleted Node from a live
    /// one), so neither the requests (one watch instead of a list per pass) nor the memory grow
    /// much with the number of Nodes. The stream yields every watch event (including the
    /// re-list markers) and must be polled to keep the store fresh.
    pub fn watch_node_metadata(
        &self,
    ) -> (Store<NodeMeta>, impl Stream<Item = Result<watcher::Event<NodeMeta>, watcher::Error>> + Send + 'static) {
        let (reader, writer) = reflector::store();
        // An Api over PartialObjectMeta asks for metadata only (a PartialObjectMetadata list and watch).
        let api = Api::<NodeMeta>::all(self.client.clone());
        let config = watcher::Config::default().page_size(NODE_PAGE);
        let watch = super::watch::watch_objects("nodes", api, config).default_backoff().modify(trim_node);
        (reader, reflector::reflector(writer, watch))
    }
}
