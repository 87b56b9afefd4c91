//! The node inventory (`LocalStorageNode`, core::cluster::inventory): the agent reads its own at
//! start-up, creates it owned by its Node, applies its status (server-side apply of the status
//! subresource: fields it no longer sets are removed), and lists every node's when it must know
//! which block disks other nodes recorded as used. The kubectl plugin lists them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};

use crate::core::cluster::inventory::{InventorySpec, InventoryStatus};

use super::*;

/// One `LocalStorageNode` object: kube's derive of core::cluster::inventory's types, which also make
/// its CRD.
pub use crate::core::cluster::inventory::LocalStorageNode;

/// The field manager of the agent's status writes.
const FIELD_MANAGER: &str = "local-static-provisioner";

/// What the inventory of a node is when it is read.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    /// None exists.
    Absent,
    /// One exists, owned by the Node with this UID (or by none: `None`), with this status.
    Present { owner_uid: Option<String>, status: Option<Box<InventoryStatus>> },
}

impl Cluster {
    fn inventories(&self) -> Api<LocalStorageNode> {
        Api::all(self.client.clone())
    }

    /// Reads the inventory of node `node`.
    pub async fn get_inventory(&self, node: &str) -> Result<Found, ApiError> {
        let got = self
            .call("get", self.inventories().get_opt(node))
            .await
            .map_err(ApiError::request("get localstoragenode", node))?;
        Ok(match got {
            None => Found::Absent,
            Some(obj) => {
                let owner_uid = obj
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .find(|o| o.kind == "Node" && o.api_version == "v1" && o.name == node)
                    .map(|o| o.uid.clone());
                Found::Present { owner_uid, status: obj.status.map(Box::new) }
            }
        })
    }

    /// Creates the inventory of node `node`, owned by the Node with UID `node_uid` (so the
    /// garbage collector removes it with the Node). One that exists already is fine.
    pub async fn create_inventory(&self, node: &str, node_uid: &str) -> Result<(), ApiError> {
        let obj = LocalStorageNode {
            metadata: ObjectMeta {
                name: Some(node.to_string()),
                owner_references: Some(vec![super::nodes::node_owner(node, node_uid)]),
                ..Default::default()
            },
            spec: InventorySpec { node_name: node.to_string() },
            status: None,
        };
        let api = self.inventories();
        match self.send("create", "create localstoragenode", node, api.create(&PostParams::default(), &obj)).await? {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(ApiError::request("create localstoragenode", node)(e)),
        }
    }

    /// Writes the status of node `node`'s inventory (server-side apply, forced: the agent is its
    /// only writer). `Ok(false)` when the object does not exist (it must be created first).
    pub async fn apply_inventory_status(&self, node: &str, status: &InventoryStatus) -> Result<bool, ApiError> {
        let body = serde_json::json!({
            "apiVersion": LocalStorageNode::api_version(&()),
            "kind": LocalStorageNode::kind(&()),
            "metadata": { "name": node },
            "status": status,
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let api = self.inventories();
        let patch = Patch::Apply(&body);
        let request = api.patch_status(node, &params, &patch);
        match self.send("patch", "apply localstoragenode status", node, request).await? {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(e) => Err(ApiError::request("apply localstoragenode status", node)(e)),
        }
    }

    /// Adds `records` (UIDs or PV names of other nodes' PVs and used-disk records) to the holds
    /// an operator released on node `node`'s inventory: the annotation
    /// `local-static-provisioner.io/released-holds`, which no agent token may write (the
    /// admission policy forbids agents to change metadata). A merge patch under the object's
    /// resourceVersion, so a concurrent release is not lost. Returns the whole list now.
    pub async fn release_holds(&self, node: &str, records: &[String]) -> Result<Vec<String>, ApiError> {
        use crate::core::volumes::naming::ANN_RELEASED_HOLDS;
        let api = self.inventories();
        let obj = self.call("get", api.get(node)).await.map_err(ApiError::request("get localstoragenode", node))?;
        let mut released: Vec<String> = obj
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANN_RELEASED_HOLDS))
            .map(|v| v.split(',').map(str::trim).filter(|u| !u.is_empty()).map(String::from).collect())
            .unwrap_or_default();
        for r in records {
            if !released.contains(r) {
                released.push(r.clone());
            }
        }
        let patch = serde_json::json!({
            "metadata": {
                "resourceVersion": obj.metadata.resource_version,
                "annotations": { ANN_RELEASED_HOLDS: released.join(",") },
            }
        });
        let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
        self.call("patch", api.patch(node, &params, &patch))
            .await
            .map_err(ApiError::request("annotate localstoragenode", node))?;
        Ok(released)
    }

    /// Every node's inventory, page by page.
    pub async fn list_inventories(&self) -> Result<Vec<LocalStorageNode>, ApiError> {
        let api = self.inventories();
        self.list_paged("localstoragenodes", LIST_PAGE, |_| true, async |params: &ListParams| api.list(params).await)
            .await
    }

    /// The inventories of these nodes only, filtered by the API server (a list per node with the
    /// field selector `metadata.name=NODE`: the objects are named after their Nodes), so that
    /// asking for one node of a large cluster does not carry every node's status. A list, not a
    /// get: the same `list` permission as the whole inventory.
    pub async fn list_inventories_of(&self, nodes: &[String]) -> Result<Vec<LocalStorageNode>, ApiError> {
        let api = self.inventories();
        let mut out = Vec::new();
        for node in nodes.iter().collect::<std::collections::BTreeSet<_>>() {
            let selector = format!("metadata.name={node}");
            let page = async |params: &ListParams| api.list(&params.clone().fields(&selector)).await;
            out.extend(self.list_paged("localstoragenodes", LIST_PAGE, |_| true, page).await?);
        }
        Ok(out)
    }
}
