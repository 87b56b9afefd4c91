//! PersistentVolumes (and the claim node-cleanup deletes): reads, creates, deletes, metadata
//! patches, finalizer removal and the label-scoped watch the agent's store is built on.

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};

use crate::core::volumes::pv_facts::{PvFacts, PvOwnership};

use super::*;

/// Where the API serves PVs.
const PV_PATH: &str = "/api/v1/persistentvolumes";

impl Cluster {
    /// PVs as they are read: only the fields decisions need (see core::volumes::pv_facts).
    fn pvs(&self) -> Api<PvFacts> {
        Api::all(self.client.clone())
    }

    /// Deletes a claim only if it is still the one the PV was bound to (UID precondition), so
    /// a claim re-created under the same name is never touched. Already gone counts as done.
    pub async fn delete_claim(&self, namespace: &str, name: &str, uid: &str) -> Result<(), ApiError> {
        let params = DeleteParams {
            preconditions: Some(Preconditions { uid: Some(uid.to_string()), resource_version: None }),
            ..Default::default()
        };
        let api = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace);
        let object = format!("{namespace}/{name}");
        match self.send("delete", "delete persistentvolumeclaim", &object, api.delete(name, &params)).await? {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(ApiError::request("delete persistentvolumeclaim", object)(e)),
        }
    }

    /// The PVs of the cluster that `keep` keeps, judged page by page as they arrive: a cluster
    /// may hold tens of thousands, which are never all held at once. Each PV is read as
    /// `PvFacts` (what decisions read, not metadata only): the caller can act on the PVs it
    /// keeps without reading each again. (Adoption, which judges by metadata alone, uses
    /// `list_pv_ownership_where`.)
    pub async fn list_pvs_where(&self, keep: impl Fn(&PvFacts) -> bool) -> Result<Vec<PvFacts>, ApiError> {
        let pvs = self.pvs();
        self.list_paged("persistentvolumes", LIST_PAGE, keep, async |params| pvs.list(params).await).await
    }

    /// As `list_pvs_where`, each PV read only as its name, labels and annotations
    /// (`PvOwnership`): for a test of whose PV it is (adoption), which reads nothing else.
    /// The API server sends metadata only (a PartialObjectMetadataList: no spec to encode) in
    /// pages of `OWNERSHIP_PAGE`, and the rest of each object's metadata is skipped unbuilt:
    /// among 20,000 PVs of other nodes, decoding each whole and pages of 250 were most of the
    /// agent's start-up (bench/scale-foreign.sh). The caller reads the few it keeps again whole
    /// (`get_pv`).
    pub async fn list_pv_ownership_where(
        &self,
        keep: impl Fn(&PvOwnership) -> bool,
    ) -> Result<Vec<PvOwnership>, ApiError> {
        let client = self.client.clone();
        let page = async |params: &kube::api::ListParams| {
            let request = kube::core::Request::new(PV_PATH).list_metadata(params).map_err(kube::Error::BuildRequest)?;
            client.request::<kube::core::ObjectList<PvOwnership>>(request).await
        };
        self.list_paged("persistentvolumes", OWNERSHIP_PAGE, keep, page).await
    }

    /// Every node's PVs carrying the label `key=value`, in one label-selected list (page by
    /// page): the PVs that may name one disk (core::identity::disk_trust), however large the cluster.
    pub async fn list_pvs_labelled(&self, key: &str, value: &str) -> Result<Vec<PvFacts>, ApiError> {
        let pvs = self.pvs();
        let selector = format!("{key}={value}");
        let page = async |params: &kube::api::ListParams| pvs.list(&params.clone().labels(&selector)).await;
        self.list_paged("persistentvolumes", LIST_PAGE, |_| true, page).await
    }

    /// Creates a PV; an existing PV of the same name is returned instead of an error.
    pub async fn create_pv(&self, pv: &PersistentVolume) -> Result<Created, ApiError> {
        let name = pv.metadata.name.clone().unwrap_or_default();
        let full = Api::<PersistentVolume>::all(self.client.clone());
        match self.send("create", "create pv", &name, full.create(&PostParams::default(), pv)).await? {
            Ok(created) => Ok(Created::Created { uid: created.metadata.uid.unwrap_or_default() }),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let existing = self
                    .call("get", self.pvs().get(&name))
                    .await
                    .map_err(ApiError::request("get existing pv", &name))?;
                Ok(Created::AlreadyExists(Box::new(existing)))
            }
            Err(e) => Err(ApiError::request("create pv", name)(e)),
        }
    }

    /// Reads one PV; None when it does not exist.
    pub async fn get_pv(&self, name: &str) -> Result<Option<PvFacts>, ApiError> {
        let pvs = self.pvs();
        self.call("get", pvs.get_opt(name)).await.map_err(ApiError::request("get pv", name))
    }

    /// Deletes a PV only if it is still the object we decided about (same UID, and same
    /// resourceVersion when given). Already gone counts as done.
    pub async fn delete_pv(&self, name: &str, uid: &str, resource_version: Option<&str>) -> Result<(), ApiError> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: resource_version.map(str::to_string),
            }),
            ..Default::default()
        };
        let pvs = self.pvs();
        match self.send("delete", "delete pv", name, pvs.delete(name, &params)).await? {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(ApiError::request("delete pv", name)(e)),
        }
    }

    /// Removes one finalizer from the PV with this UID, in one request (a PV deleted by hand
    /// costs this and its re-creation, nothing read first): a strategic merge patch that deletes
    /// that value from the finalizer list, so another controller's finalizer is never touched,
    /// and names the UID, which the API server refuses to change (`metadata.uid` is
    /// immutable), so a different object of the same name is never patched. Gone, or a
    /// successor of that name, counts as done.
    pub async fn remove_finalizer(&self, name: &str, uid: &str, finalizer: &str) -> Result<(), ApiError> {
        let patch = serde_json::json!({
            "metadata": { "uid": uid, "$deleteFromPrimitiveList/finalizers": [finalizer] }
        });
        let pvs = self.pvs();
        let patched = Patch::Strategic(&patch);
        match self
            .send("patch", "remove finalizer from pv", name, pvs.patch(name, &PatchParams::default(), &patched))
            .await?
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            // A successor with the same name: not ours to touch.
            Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains("metadata.uid") => Ok(()),
            Err(e) => Err(ApiError::request("remove finalizer from pv", name)(e)),
        }
    }

    /// As `remove_finalizer` (read first, then a JSON patch that tests the UID and the
    /// finalizer's position), and only while the PV's provisioned-by annotation still has the
    /// value `provisioned_by` (when given): node-cleanup never lets a PV go unwiped once an agent has taken it
    /// over (re-adopted it, which changes that annotation) to wipe it.
    pub async fn remove_finalizer_if(
        &self,
        name: &str,
        uid: &str,
        finalizer: &str,
        provisioned_by: Option<&str>,
    ) -> Result<(), ApiError> {
        let Some(pv) = self.get_pv(name).await? else { return Ok(()) };
        if pv.metadata.uid.as_deref() != Some(uid) {
            return Ok(()); // A successor with the same name: not ours to touch.
        }
        let finalizers = pv.metadata.finalizers.unwrap_or_default();
        let Some(index) = finalizers.iter().position(|f| f == finalizer) else { return Ok(()) };
        let mut ops = vec![
            serde_json::json!({"op": "test", "path": "/metadata/uid", "value": uid}),
            serde_json::json!({"op": "test", "path": format!("/metadata/finalizers/{index}"), "value": finalizer}),
        ];
        if let Some(value) = provisioned_by {
            // `/` in the annotation key is escaped as `~1` in a JSON pointer.
            let path = "/metadata/annotations/pv.kubernetes.io~1provisioned-by";
            ops.push(serde_json::json!({"op": "test", "path": path, "value": value}));
        }
        ops.push(serde_json::json!({"op": "remove", "path": format!("/metadata/finalizers/{index}")}));
        let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))
            .map_err(|e| ApiError::Config { source_name: "finalizer patch".into(), message: e.to_string() })?;
        let pvs = self.pvs();
        let patched = Patch::<()>::Json(patch);
        self.send("patch", "remove finalizer from pv", name, pvs.patch(name, &PatchParams::default(), &patched))
            .await?
            .map(|_| ())
            .map_err(ApiError::request("remove finalizer from pv", name))
    }

    /// Merges labels, annotations and (when given) the full finalizer list into a PV, with a
    /// resourceVersion precondition when given so a concurrent change is not overwritten.
    pub async fn patch_pv_metadata(
        &self,
        name: &str,
        resource_version: Option<&str>,
        labels: serde_json::Value,
        annotations: serde_json::Value,
        finalizers: Option<&[String]>,
    ) -> Result<(), ApiError> {
        let mut meta = serde_json::json!({ "labels": labels, "annotations": annotations });
        if let Some(f) = finalizers {
            meta["finalizers"] = serde_json::json!(f);
        }
        if let Some(rv) = resource_version {
            meta["resourceVersion"] = serde_json::json!(rv);
        }
        let patch = serde_json::json!({ "metadata": meta });
        let pvs = self.pvs();
        self.send("patch", "patch pv", name, pvs.patch(name, &PatchParams::default(), &Patch::Merge(&patch)))
            .await?
            .map(|_| ())
            .map_err(ApiError::request("patch pv", name))
    }

    /// A reflector over the PVs carrying `label_selector` (the agent: its own node's PVs), or
    /// over all PVs (node-cleanup, a single replica for the cluster). The stream yields once
    /// per change and must be polled to keep the store fresh.
    pub fn watch_pvs(
        &self,
        label_selector: Option<&str>,
    ) -> (Store<PvFacts>, impl Stream<Item = Result<(), watcher::Error>> + Send + 'static) {
        let (reader, writer) = reflector::store();
        let cfg = match label_selector {
            Some(selector) => watcher::Config::default().labels(selector),
            None => watcher::Config::default(),
        };
        let stream = reflector::reflector(
            writer,
            super::watch::watch_objects("persistentvolumes", self.pvs(), cfg).default_backoff().modify(trim),
        )
        .touched_objects()
        .map(|r| r.map(|_| ()));
        (reader, stream)
    }
}
