//! Executor tests without a cluster or a host: the API is kube's client over a `tower-test`
//! mock service answering by method and path, the host a fake `HostAccess`. They cover what
//! lives only in the shell: retries with growing delays, the cleanup trigger resetting a wipe's
//! backoff, report-once-then-forget, and shutdown during a wipe.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::client::Body;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use tokio::sync::mpsc;

use super::{Agent, AgentOptions, Parts};
use crate::admin::Readiness;
use crate::api::{ClientOptions, Cluster};
use crate::config::{ConfigSource, ProvisionerConfig};
use crate::core::cluster::succession::DiskCheck;
use crate::core::reconcile::effect_key::EffectKey;
use crate::core::volumes::pv::FoundVolume;
use crate::core::volumes::pv_facts::PvFacts;
use crate::core::volumes::volume_safety::DiskKey;
use crate::core::wipe::cleanup::{AfterWipe, PvState};
use crate::host::HostError;
use crate::host::access::{Ask, HostAccess, MarkJob, Observation};
use crate::host::identity::used_mark::MarkOutcome;
use crate::host::mounts::mountinfo::MountTable;
use crate::host::ops::OnDeadline;
use crate::host::volumes::discovery::{Scan, SkipReason, Skipped};
use crate::metrics::Metrics;
use crate::wiper::{Cleaner, CleanerOptions, Progress, WipeError, WipeJob, WipeOutcome, Wiped, target_for};

/// What the fake host shows and how its wipes behave.
#[derive(Default)]
struct FakeHost {
    scan: Mutex<Scan>,
    absent: Mutex<Vec<String>>,
    /// Wipes: refuse at once, or run until cancelled.
    refuse_wipes: AtomicBool,
    /// Wipes: kubelet still holds the volume.
    held_by_pod: AtomicBool,
    wiping: AtomicBool,
    wipes: AtomicUsize,
    /// Claim holds recorded: (host path, why).
    holds: Mutex<Vec<(String, String)>>,
    /// Host paths whose used-mark writes (and wipes) block, as on a frozen filesystem.
    frozen: Mutex<Vec<String>>,
    /// What the presence checks find at each PV's path, by UID (absent: no answer).
    checks: Mutex<Vec<(String, DiskCheck)>>,
    /// What the device claim pass reports (none: no class claims devices).
    claims: Mutex<Option<crate::host::devices::claims::ClaimReport>>,
    /// I/O errors the presence checks meet, by host path.
    io_failures: Mutex<Vec<(String, String)>>,
}

impl HostAccess for FakeHost {
    fn observe(&self, _ask: Ask) -> Result<Observation, HostError> {
        let scan = self.scan.lock().unwrap().clone();
        let absent = self.absent.lock().unwrap().clone();
        let checks = self.checks.lock().unwrap().clone();
        let claims = self.claims.lock().unwrap().clone();
        let io_failures = self.io_failures.lock().unwrap().clone();
        Ok(Observation { scan, absent, checks, claims, io_failures, disks: Some(Vec::new()), ..Default::default() })
    }

    fn mount_table(&self) -> Result<Arc<MountTable>, HostError> {
        Ok(Arc::default())
    }

    fn mark_one(&self, job: &MarkJob, _mounts: &MountTable, _on: &OnDeadline) -> Result<MarkOutcome, String> {
        // A frozen filesystem: the write blocks until it is thawed.
        while self.frozen.lock().unwrap().contains(&job.mark.path) {
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(MarkOutcome::Written(job.mark.clone(), crate::host::identity::used_mark::Carrier::Attribute))
    }

    fn record_marks(&self, _outcomes: &mut [Result<MarkOutcome, String>]) {}

    fn record_withdrawn(&self, _uids: &[String]) -> Result<(), String> {
        Ok(())
    }

    fn identity(&self, path: &Path, _on: &OnDeadline) -> Result<String, String> {
        Ok(format!("id-of-{}", path.display()))
    }

    fn wipe(
        &self,
        _job: &WipeJob,
        cancel: &AtomicBool,
        _progress: &Progress,
        _on: &OnDeadline,
    ) -> Result<Wiped, WipeError> {
        self.wipes.fetch_add(1, Ordering::SeqCst);
        if self.held_by_pod.load(Ordering::SeqCst) {
            return Err(WipeError::InUse {
                path: "/mnt/disks/v".into(),
                by: "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~local-volume/v".into(),
            });
        }
        if self.refuse_wipes.load(Ordering::SeqCst) {
            return Err(WipeError::Refused("an immutable file is in the way".into()));
        }
        self.wiping.store(true, Ordering::SeqCst);
        while !cancel.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        Err(WipeError::Failed("cancelled".into()))
    }

    fn hold_claim(&self, host_path: &str, why: &str) -> Result<(), String> {
        self.holds.lock().unwrap().push((host_path.to_string(), why.to_string()));
        Ok(())
    }
}

/// The mock API: answers each request from `answer(method, path)` (status, JSON body) and
/// keeps the requests it saw.
#[derive(Clone, Default)]
struct MockApi {
    seen: Arc<Mutex<Vec<(String, String)>>>,
    /// Status codes to answer, by "METHOD path-prefix", consumed in order; 200/201 otherwise.
    scripted: Arc<Mutex<BTreeMap<String, Vec<u16>>>>,
    /// The labels of Node n1 as merge patches left them, and the patches.
    node_labels: Arc<Mutex<BTreeMap<String, String>>>,
    node_patches: Arc<Mutex<Vec<serde_json::Value>>>,
    /// Objects answered to a GET of their path (a PV the store does not show).
    objects: Arc<Mutex<BTreeMap<String, serde_json::Value>>>,
    /// The reasons of the events posted, in order.
    event_reasons: Arc<Mutex<Vec<String>>>,
    /// The LocalStorageNode CRD is not installed: its paths answer as the API server does
    /// then (404, not a Status).
    no_crd: Arc<AtomicBool>,
}

impl MockApi {
    fn client(&self) -> kube::Client {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let api = self.clone();
        tokio::spawn(async move {
            while let Some((request, send)) = handle.next_request().await {
                let method = request.method().to_string();
                let path = request.uri().path().to_string();
                let watch = request.uri().query().is_some_and(|q| q.split('&').any(|p| p == "watch=true"));
                let body = request.into_body().collect_bytes().await.unwrap_or_default();
                let (status, reply) = api.answer(&method, &path, watch, &body);
                api.seen.lock().unwrap().push((method, path));
                let response = Response::builder().status(status).body(Body::from(reply.into_bytes())).unwrap();
                send.send_response(response);
            }
        });
        kube::Client::new(service, "default")
    }

    /// Makes the next `codes.len()` requests matching `key` ("POST /api/v1/persistentvolumes")
    /// answer with these codes.
    fn script(&self, key: &str, codes: &[u16]) {
        self.scripted.lock().unwrap().insert(key.to_string(), codes.to_vec());
    }

    fn answer(&self, method: &str, path: &str, watch: bool, body: &[u8]) -> (u16, String) {
        if self.no_crd.load(Ordering::SeqCst) && path.starts_with(INVENTORIES) {
            return (404, "404 page not found\n".into());
        }
        let mut scripted = self.scripted.lock().unwrap();
        for (key, codes) in scripted.iter_mut() {
            if format!("{method} {path}").starts_with(key.as_str()) && !codes.is_empty() {
                let code = codes.remove(0);
                let status = serde_json::json!({
                    "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
                    "reason": match code { 403 => "Forbidden", 404 => "NotFound", _ => "InternalError" },
                    "message": format!("scripted {code}"),
                });
                return (code, status.to_string());
            }
        }
        // A watch of Node n1 (a streaming list): the Node, then the end of the initial events.
        if watch && path == "/api/v1/nodes" {
            let mut node = serde_json::to_value(node()).unwrap_or_default();
            node["metadata"]["resourceVersion"] = serde_json::json!("1");
            let added = serde_json::json!({ "type": "ADDED", "object": node });
            let end = serde_json::json!({ "type": "BOOKMARK", "object": { "kind": "Node", "apiVersion": "v1",
                "metadata": { "resourceVersion": "1", "annotations": { "k8s.io/initial-events-end": "true" } } } });
            return (200, format!("{added}\n{end}\n"));
        }
        if method == "GET"
            && let Some(obj) = self.objects.lock().unwrap().get(path)
        {
            return (200, obj.to_string());
        }
        match method {
            // Creates and event posts echo the object, with a UID.
            "POST" => {
                let mut obj: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
                if path.contains("/events") {
                    let reason = obj["reason"].as_str().unwrap_or_default().to_string();
                    self.event_reasons.lock().unwrap().push(reason);
                }
                obj["metadata"]["uid"] = serde_json::json!("uid-1");
                (201, obj.to_string())
            }
            // Patches answer with the object patched (enough of it to parse).
            "PATCH" if path.starts_with("/api/v1/persistentvolumes/") => {
                let name = path.trim_start_matches("/api/v1/persistentvolumes/");
                let pv =
                    serde_json::json!({ "apiVersion": "v1", "kind": "PersistentVolume", "metadata": { "name": name } });
                (200, pv.to_string())
            }
            "GET" if path == "/api/v1/nodes/n1" => (200, serde_json::to_string(&node()).unwrap_or_default()),
            // A merge patch of the Node's labels: applied, and the Node answered as it is now.
            "PATCH" if path == "/api/v1/nodes/n1" => {
                let patch: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
                let mut labels = self.node_labels.lock().unwrap();
                for (k, v) in patch["metadata"]["labels"].as_object().into_iter().flatten() {
                    match v.as_str() {
                        Some(v) => labels.insert(k.clone(), v.to_string()),
                        None => labels.remove(k),
                    };
                }
                self.node_patches.lock().unwrap().push(patch);
                let mut node = node();
                node.metadata.labels.get_or_insert_default().extend(labels.clone());
                (200, serde_json::to_string(&node).unwrap_or_default())
            }
            // The node inventory: a status apply answers the object; a list has none unless
            // the test put one in `objects`.
            "PATCH" if path.starts_with(INVENTORIES) => {
                let obj = serde_json::json!({
                    "apiVersion": "local-static-provisioner.io/v1alpha1", "kind": "LocalStorageNode",
                    "metadata": { "name": "n1" },
                });
                (200, obj.to_string())
            }
            "GET" if path == INVENTORIES => {
                (200, r#"{"kind":"LocalStorageNodeList","apiVersion":"local-static-provisioner.io/v1alpha1","metadata":{},"items":[]}"#.into())
            }
            "GET" if path.starts_with(INVENTORIES) => (404, r#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":404,"reason":"NotFound","message":"not found"}"#.into()),
            "GET" if path == "/api/v1/persistentvolumes" => {
                (200, r#"{"kind":"PersistentVolumeList","apiVersion":"v1","metadata":{},"items":[]}"#.into())
            }
            _ => (200, r#"{"kind":"Status","apiVersion":"v1","status":"Success"}"#.into()),
        }
    }

    fn count(&self, method: &str, prefix: &str) -> usize {
        self.seen.lock().unwrap().iter().filter(|(m, p)| m == method && p.starts_with(prefix)).count()
    }

    fn events(&self) -> usize {
        let seen = self.seen.lock().unwrap();
        // The recorder posts an event once and patches its series when it repeats.
        seen.iter().filter(|(m, p)| (m == "POST" || m == "PATCH") && p.contains("/events")).count()
    }
}

struct Lab {
    agent: Agent,
    api: MockApi,
    host: Arc<FakeHost>,
    pvs: Writer<PvFacts>,
    wipes_done: mpsc::UnboundedReceiver<WipeOutcome>,
    _config: tempfile::TempDir,
}

const CLASS: &str = "local";

/// The path of the LocalStorageNode objects.
const INVENTORIES: &str = "/apis/local-static-provisioner.io/v1alpha1/localstoragenodes";

fn node() -> Node {
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": "n1", "uid": "node-uid", "labels": { "kubernetes.io/hostname": "n1" } }
    }))
    .unwrap()
}

async fn lab() -> Lab {
    let config_dir = tempfile::tempdir().unwrap();
    let map = format!("{CLASS}:\n  hostDir: /mnt/disks\n  mountDir: /mnt/disks\n");
    std::fs::write(config_dir.path().join("storageClassMap"), map).unwrap();
    let mut source = ConfigSource::new(config_dir.path());
    let config: ProvisionerConfig = source.load().unwrap().config;
    let api = MockApi::default();
    let opts = ClientOptions { kubeconfig: None, qps: 1000, burst: 1000, ..Default::default() };
    let cluster = Cluster::from_client(api.client(), &opts, "n1");
    let host = Arc::new(FakeHost::default());
    let metrics = Metrics::new();
    let cleaner_opts = CleanerOptions { concurrency: 2, timeout_base: Duration::from_secs(60), min_rate: 1 << 20 };
    let ops = crate::host::ops::Operations::new();
    let (cleaner, wipes_done) =
        Cleaner::new(cluster.clone(), host.clone(), ops.clone(), cleaner_opts.clone(), metrics.clone());
    let (pv_store, pvs) = reflector::store::<PvFacts>();
    let (sc_store, mut classes) = reflector::store::<StorageClass>();
    let class: StorageClass = serde_json::from_value(serde_json::json!({
        "metadata": { "name": CLASS }, "provisioner": "kubernetes.io/no-provisioner", "reclaimPolicy": "Delete"
    }))
    .unwrap();
    classes.apply_watcher_event(&watcher::Event::Apply(class));
    let parts = Parts {
        cluster,
        host: host.clone(),
        ops,
        cleaner,
        metrics,
        readiness: Readiness::new("test"),
        node: node(),
        pv_store,
        sc_store,
    };
    let opts = AgentOptions {
        config_dir: config_dir.path().to_path_buf(),
        node_name: "n1".into(),
        client: opts,
        discovery_period: None,
        settle: Duration::ZERO,
        succession_settle: Duration::ZERO,
        state_dir: PathBuf::from("/nonexistent"),
        kubelet: crate::host::volumes::kubelet::KubeletView { dir: PathBuf::from("/nonexistent"), required: false },
        create_concurrency: 4,
        cleaner: cleaner_opts,
        listen_address: "127.0.0.1:0".into(),
        metrics_path: "/metrics".into(),
        host_op_timeout: Duration::from_millis(300),
        install_boot_fence: false,
        heartbeat_namespace: None,
    };
    let agent = Agent::new(parts, &opts, Some(config), None, source).unwrap();
    Lab { agent, api, host, pvs, wipes_done, _config: config_dir }
}

fn found(entry: &str) -> FoundVolume {
    FoundVolume {
        class: CLASS.into(),
        entry: entry.into(),
        host_path: format!("/mnt/disks/{entry}"),
        capacity_bytes: 1 << 30,
        identity: format!("v2;fs;uuid=u-{entry};ino=2;dev=8:1"),
        disk: DiskKey::fs(format!("8:{entry}"), "/"),
        in_use: None,
        used: Default::default(),
    }
}

/// One of this node's PVs as the watch would show it.
fn own_pv(name: &str, phase: &str, extra_annotations: serde_json::Value) -> PvFacts {
    own_pv_labelled(name, phase, extra_annotations, serde_json::json!({}), "7")
}

/// [`own_pv`] with more labels, at a resourceVersion.
fn own_pv_labelled(
    name: &str,
    phase: &str,
    extra_annotations: serde_json::Value,
    extra_labels: serde_json::Value,
    resource_version: &str,
) -> PvFacts {
    let mut labels = serde_json::json!({ "local-static-provisioner.io/node": "n1" });
    for (k, v) in extra_labels.as_object().into_iter().flatten() {
        labels[k] = v.clone();
    }
    let mut annotations =
        serde_json::json!({ "pv.kubernetes.io/provisioned-by": "local-volume-provisioner-n1-node-uid" });
    if let Some(extra) = extra_annotations.as_object() {
        for (k, v) in extra {
            annotations[k] = v.clone();
        }
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": name, "uid": format!("uid-{name}"), "resourceVersion": resource_version,
            "labels": labels,
            "annotations": annotations,
            "finalizers": ["local-static-provisioner.io/wipe"],
        },
        "spec": {
            "capacity": { "storage": "1Gi" }, "accessModes": ["ReadWriteOnce"], "storageClassName": CLASS,
            "persistentVolumeReclaimPolicy": "Delete", "local": { "path": format!("/mnt/disks/{name}") },
        },
        "status": { "phase": phase },
    }))
    .unwrap()
}

impl Lab {
    /// Lets every retry deadline pass (instead of sleeping through it).
    fn deadlines_pass(&mut self) {
        self.agent.effects.expire_for_test();
    }

    async fn pass(&mut self) {
        // On the heap: a pass's future is large in a debug build, and a test's own future
        // holds it (a test thread's stack is 2 MiB).
        Box::pin(self.agent.reconcile(None)).await;
    }
}

#[tokio::test]
async fn a_refused_create_is_retried_at_its_deadline_with_growing_delays_until_it_succeeds() {
    let mut lab = lab().await;
    *lab.host.scan.lock().unwrap() = Scan { volumes: vec![found("1")], ..Default::default() };
    lab.api.script("POST /api/v1/persistentvolumes", &[403, 403, 500]);
    lab.pass().await;
    assert_eq!(lab.api.count("POST", "/api/v1/persistentvolumes"), 1);
    let key =
        lab.agent.effects.failure_keys().into_iter().find(|k| matches!(k, EffectKey::Create(_))).expect("failure kept");
    let first = lab.agent.effects.failure(&key).unwrap().clone();
    assert_eq!((first.failures, first.delay), (1, Duration::from_millis(500)));
    assert!(lab.agent.next_wake().is_some_and(|at| at <= first.due), "the deadline wakes the loop");

    lab.pass().await; // An unrelated event before the deadline: nothing is sent.
    assert_eq!(lab.api.count("POST", "/api/v1/persistentvolumes"), 1);

    let mut delays = vec![first.delay];
    for _ in 0..2 {
        lab.deadlines_pass();
        lab.pass().await;
        delays.push(lab.agent.effects.failure(&key).unwrap().delay);
    }
    assert_eq!(delays, [500, 1000, 2000].map(Duration::from_millis), "delays double");
    assert_eq!(lab.api.count("POST", "/api/v1/persistentvolumes"), 3);

    lab.deadlines_pass();
    lab.pass().await;
    assert_eq!(lab.api.count("POST", "/api/v1/persistentvolumes"), 4);
    assert!(lab.agent.effects.failure(&key).is_none(), "the record is kept until success");
    assert!(lab.agent.effects.next_due().is_none());
}

#[tokio::test]
async fn a_failed_delete_and_a_failed_patch_back_off_apart_and_are_forgotten_once_done() {
    let mut lab = lab().await;
    // An unbound PV whose volume vanished is withdrawn (DELETE); a bound one is flagged (PATCH).
    lab.pvs.apply_watcher_event(&watcher::Event::Apply(own_pv("gone", "Available", serde_json::json!({}))));
    lab.pvs.apply_watcher_event(&watcher::Event::Apply(own_pv("bound", "Bound", serde_json::json!({}))));
    *lab.host.absent.lock().unwrap() = vec!["uid-gone".into(), "uid-bound".into()];
    lab.api.script("DELETE /api/v1/persistentvolumes/gone", &[500, 500]);
    lab.api.script("PATCH /api/v1/persistentvolumes/bound", &[500]);
    lab.pass().await;
    assert_eq!(lab.api.count("DELETE", "/api/v1/persistentvolumes/gone"), 1);
    assert_eq!(lab.api.count("PATCH", "/api/v1/persistentvolumes/bound"), 1);
    lab.pass().await;
    assert_eq!(lab.api.count("DELETE", "/api/v1/persistentvolumes/gone"), 1, "waits for its deadline");
    lab.deadlines_pass();
    lab.pass().await;
    assert_eq!(lab.api.count("DELETE", "/api/v1/persistentvolumes/gone"), 2);
    assert_eq!(lab.api.count("PATCH", "/api/v1/persistentvolumes/bound"), 2, "the patch succeeded on its retry");
    assert_eq!(lab.agent.effects.failure(&EffectKey::Withdraw("gone".into())).unwrap().delay, Duration::from_secs(1));
    assert!(lab.agent.effects.failure(&EffectKey::FlagMissing("bound".into())).is_none());
    // The PV went away meanwhile: its failure is forgotten, not retried for ever.
    lab.pvs.apply_watcher_event(&watcher::Event::Delete(own_pv("gone", "Available", serde_json::json!({}))));
    lab.pass().await;
    assert!(lab.agent.effects.failure(&EffectKey::Withdraw("gone".into())).is_none());
}

#[tokio::test]
async fn problems_are_reported_once_per_occurrence_and_again_when_they_come_back() {
    let mut lab = lab().await;
    let refused =
        Skipped { class: CLASS.into(), path: "/mnt/disks/link".into(), reason: SkipReason::Symlink("/etc".into()) };
    let with = Scan { skipped: vec![refused], ..Default::default() };
    *lab.host.scan.lock().unwrap() = with.clone();
    lab.pass().await;
    let first = lab.api.events();
    assert!(first >= 1, "reported");
    lab.pass().await;
    lab.pass().await;
    assert_eq!(lab.api.events(), first, "not again while it lasts");
    *lab.host.scan.lock().unwrap() = Scan::default();
    lab.pass().await;
    assert!(lab.agent.problems.is_empty(), "forgotten once resolved");
    *lab.host.scan.lock().unwrap() = with;
    lab.pass().await;
    assert!(lab.api.events() > first, "reported again when it comes back");
}

fn wipe_target(lab: &Lab, pv: &PvState) -> crate::wiper::WipeTarget {
    target_for(pv, lab.agent.config.storage_class_map.get(CLASS)).unwrap()
}

#[tokio::test]
async fn a_refused_wipe_backs_off_growing_and_a_new_cleanup_request_retries_it_at_once() {
    let mut lab = lab().await;
    lab.host.refuse_wipes.store(true, Ordering::SeqCst);
    let mut pv = PvState::from_pv(&own_pv("v", "Released", serde_json::json!({})));
    let target = wipe_target(&lab, &pv);
    let cleaner = &mut lab.agent.cleaner;
    cleaner.start(pv.clone(), AfterWipe::DeletePv, target.clone());
    let outcome = lab.wipes_done.recv().await.unwrap();
    assert!(outcome.result.is_err());
    cleaner.finished(&outcome);
    assert!(cleaner.busy(std::slice::from_ref(&pv)).pvs.contains(&pv.uid), "backing off");
    assert_eq!(cleaner.failure(&EffectKey::Wipe(pv.uid.clone())).unwrap().delay, Duration::from_secs(300));
    assert_eq!(lab.api.count("DELETE", "/api/v1/persistentvolumes"), 0, "a refused wipe deletes nothing");

    // Retried at its deadline: the delay doubles.
    cleaner.start(pv.clone(), AfterWipe::DeletePv, target.clone());
    let outcome = lab.wipes_done.recv().await.unwrap();
    cleaner.finished(&outcome);
    assert_eq!(cleaner.failure(&EffectKey::Wipe(pv.uid.clone())).unwrap().delay, Duration::from_secs(600));

    // The administrator asks again (`cleanup`): not busy any more, and the delays start over.
    pv.cleanup_requested = true;
    pv.cleanup_requested_at = Some("2026-11-24T09:00:00Z".into());
    assert!(!cleaner.busy(std::slice::from_ref(&pv)).pvs.contains(&pv.uid), "the trigger resets the backoff");
    cleaner.start(pv.clone(), AfterWipe::DeletePv, target.clone());
    let outcome = lab.wipes_done.recv().await.unwrap();
    cleaner.finished(&outcome);
    assert_eq!(cleaner.failure(&EffectKey::Wipe(pv.uid.clone())).unwrap().delay, Duration::from_secs(300));
    assert!(cleaner.busy(std::slice::from_ref(&pv)).pvs.contains(&pv.uid));
    assert_eq!(lab.host.wipes.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_wipe_of_a_volume_kubelet_still_holds_is_retried_within_seconds_and_deletes_nothing() {
    let mut lab = lab().await;
    lab.host.held_by_pod.store(true, Ordering::SeqCst);
    let pv = PvState::from_pv(&own_pv("v", "Released", serde_json::json!({})));
    let target = wipe_target(&lab, &pv);
    let cleaner = &mut lab.agent.cleaner;
    for expected in [2, 4, 8] {
        cleaner.start(pv.clone(), AfterWipe::DeletePv, target.clone());
        let outcome = lab.wipes_done.recv().await.unwrap();
        let err = outcome.result.as_ref().unwrap_err().to_string();
        assert!(err.contains("still mounted for a pod") && err.contains("/var/lib/kubelet/pods/u1"), "{err}");
        cleaner.finished(&outcome);
        assert!(cleaner.busy(std::slice::from_ref(&pv)).pvs.contains(&pv.uid), "waits for its deadline");
        assert_eq!(cleaner.failure(&EffectKey::Wipe(pv.uid.clone())).unwrap().delay, Duration::from_secs(expected));
    }
    assert_eq!(lab.api.count("DELETE", "/api/v1/persistentvolumes"), 0, "nothing is deleted while held");
    assert_eq!(lab.api.count("PATCH", "/api/v1/persistentvolumes/v"), 0, "a wait is not a failed wipe");
}

#[tokio::test]
async fn shutdown_during_a_wipe_cancels_it_and_leaves_the_pv_as_it_is() {
    let mut lab = lab().await;
    let pv = PvState::from_pv(&own_pv("v", "Released", serde_json::json!({})));
    lab.agent.cleaner.start(pv.clone(), AfterWipe::DeletePv, wipe_target(&lab, &pv));
    while !lab.host.wiping.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(lab.agent.cleaner.running(), 1);
    lab.agent.shut_down(&mut lab.wipes_done).await;
    assert_eq!(lab.agent.cleaner.running(), 0, "the wipe stopped");
    assert_eq!(lab.api.count("DELETE", "/api/v1/persistentvolumes"), 0, "the PV is not deleted");
    // Only the failed wipe's result annotation is written; the finalizer stays.
    assert_eq!(lab.api.count("PATCH", "/api/v1/persistentvolumes/v"), 1);
    assert!(lab.agent.cleaner.failure(&EffectKey::Wipe(pv.uid.clone())).is_some(), "wiped again from the start later");
}

#[tokio::test]
async fn a_failed_wipe_first_backs_off_like_any_wipe() {
    let mut lab = lab().await;
    lab.host.refuse_wipes.store(true, Ordering::SeqCst);
    let located = PvState { host_path: "/mnt/disks/x".into(), class: CLASS.into(), ..Default::default() };
    let target = wipe_target(&lab, &located);
    let key = EffectKey::WipeFirst("/mnt/disks/x".into());
    let node = crate::api::node_reference(&node());
    lab.agent.cleaner.start_wipe_first("local-pv-x", "/mnt/disks/x", "id-x", target, node);
    let outcome = lab.wipes_done.recv().await.unwrap();
    lab.agent.cleaner.finished(&outcome);
    assert!(lab.agent.cleaner.busy(&[]).paths.contains("/mnt/disks/x"), "not retried before its deadline");
    assert_eq!(lab.agent.cleaner.failure(&key).unwrap().delay, Duration::from_secs(300));
}

#[tokio::test]
async fn the_node_wait_retries_every_failure_and_says_why_in_readiness() {
    let api = MockApi::default();
    api.script("GET /api/v1/nodes", &[403, 500]);
    let opts = ClientOptions { kubeconfig: None, qps: 1000, burst: 1000, ..Default::default() };
    let cluster = Cluster::from_client(api.client(), &opts, "n1");
    let readiness = Readiness::new("starting");
    let waiting = {
        let readiness = readiness.clone();
        tokio::spawn(async move {
            let (store, events) = cluster.watch_own_node("n1");
            let mut events = Box::pin(events);
            super::node::wait_for_node(&cluster, "n1", &store, &mut events, &readiness).await
        })
    };
    let mut said = Vec::new();
    while !waiting.is_finished() {
        if let Some(why) = readiness.get().filter(|w| said.last() != Some(w)) {
            said.push(why);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let node = waiting.await.unwrap().expect("the Node");
    assert_eq!(node.metadata.name.as_deref(), Some("n1"), "a refusal and an outage do not stop the agent");
    assert!(said.iter().any(|w| w.contains("forbidden to read the Node")), "{said:?}");
    assert!(said.iter().any(|w| w.contains("cannot read the Node") && w.contains("answered 500")), "{said:?}");
    // The watch is the only read: refused, failed, then answered with the Node.
    assert_eq!(api.count("GET", "/api/v1/nodes"), 3, "{:?}", api.seen.lock().unwrap());
}

/// A reload that breaks one class keeps that class's last valid definition (its PVs keep a
/// class to be located and wiped with), applies the other classes' changes, reports the
/// failure once (event, readiness detail, metric) and recovers when it is fixed.
#[tokio::test]
async fn a_class_broken_by_a_reload_keeps_its_last_valid_definition() {
    let mut lab = lab().await;
    let dir = lab._config.path().to_path_buf();
    let write = |map: &str| std::fs::write(dir.join("storageClassMap"), map).unwrap();
    write(&format!(
        "{CLASS}:\n  hostDir: /mnt/elsewhere\n  mountDir: /mnt/elsewhere\n  accessMode: RWX\nnew:\n  hostDir: /mnt/new\n  mountDir: /mnt/new\n"
    ));
    let events = lab.api.events();
    lab.agent.reload_config().await;
    let classes = &lab.agent.config.storage_class_map;
    assert_eq!(classes.keys().collect::<Vec<_>>(), [CLASS, "new"]);
    assert_eq!(classes[CLASS].host_dir, "/mnt/disks", "the broken class runs as before");
    assert_eq!(lab.api.events(), events + 2, "one reload event and one ConfigInvalid event");
    let problem = lab.agent.config_state.config_problem.clone().expect("the failure is remembered");
    assert!(
        problem.contains(&format!("class \"{CLASS}\" is invalid, its last valid definition stays in use")),
        "{problem}"
    );
    assert!(problem.contains(&format!("storageClassMap.{CLASS}.accessMode")), "{problem}");
    // Read again unchanged: not reported again.
    lab.agent.reload_config().await;
    assert_eq!(lab.api.events(), events + 2);
    // Fixed.
    write(&format!("{CLASS}:\n  hostDir: /mnt/disks2\n  mountDir: /mnt/disks2\n"));
    lab.agent.reload_config().await;
    assert!(lab.agent.config_state.config_problem.is_none());
    assert_eq!(lab.agent.config.storage_class_map[CLASS].host_dir, "/mnt/disks2");
}

/// A config directory that stops answering (its read stuck in the kernel) costs a reload at
/// most the executor's grace: the last good configuration stays in use and readiness says so;
/// once the directory answers, the change on disk applies.
#[tokio::test(flavor = "multi_thread")]
async fn a_config_directory_that_does_not_answer_keeps_the_last_good_config() {
    let mut lab = lab().await;
    let dir = lab._config.path().to_path_buf();
    std::fs::write(dir.join("storageClassMap"), format!("{CLASS}:\n  hostDir: /mnt/d2\n  mountDir: /mnt/d2\n"))
        .unwrap();
    // The directory's subject held by a read that does not return.
    let release = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let held = release.clone();
    let subject = crate::host::ops::Subject::Config(dir.display().to_string());
    let ops = lab.agent.ops.clone();
    let stuck = tokio::task::spawn_blocking(move || {
        ops.run(subject, "config read", Duration::from_millis(300), move |_| {
            while !held.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    });
    let _ = stuck.await.unwrap();
    let started = std::time::Instant::now();
    lab.agent.reload_config().await;
    assert!(started.elapsed() < Duration::from_secs(2), "waited {:?}", started.elapsed());
    assert_eq!(lab.agent.config.storage_class_map[CLASS].host_dir, "/mnt/disks", "the last good config stays");
    assert!(lab.agent.config_state.config_unread);
    let detail = lab.agent.readiness.detail().unwrap_or_default();
    assert!(detail.contains("not read, the last good one stays in use"), "{detail}");
    // It answers again: the background retry reads it, a later reload applies it.
    release.store(true, std::sync::atomic::Ordering::SeqCst);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while lab.agent.config.storage_class_map[CLASS].host_dir != "/mnt/d2" && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        lab.agent.reload_config().await;
    }
    assert_eq!(lab.agent.config.storage_class_map[CLASS].host_dir, "/mnt/d2");
    assert!(!lab.agent.config_state.config_unread);
    assert!(lab.agent.readiness.detail().is_none_or(|d| !d.contains("not read")));
}

fn tampered(name: &str) -> crate::core::devices::device_claim::Tampered {
    crate::core::devices::device_claim::Tampered {
        class: CLASS.into(),
        name: name.into(),
        host_path: format!("/mnt/disks/{name}"),
        why: "while its PV was unbound: ext4 superblock at 1024".into(),
    }
}

#[tokio::test]
async fn a_device_changed_under_its_unbound_pv_withdraws_it_with_a_precondition_then_holds_it() {
    let mut lab = lab().await;
    let states: Vec<PvState> = [("a", "Available"), ("b", "Bound"), ("c", "Released")]
        .iter()
        .map(|(n, phase)| PvState::from_pv(&own_pv(n, phase, serde_json::json!({}))))
        .collect();
    let all = [tampered("a"), tampered("b"), tampered("c")];
    lab.agent.withdraw_tampered(&states, &all).await;
    // Only the unbound one; a bound or released PV is never touched by this rule.
    assert_eq!(lab.api.count("DELETE", "/api/v1/persistentvolumes/a"), 1);
    assert_eq!(lab.api.count("DELETE", "/api/v1/persistentvolumes"), 1);
    let holds = lab.host.holds.lock().unwrap().clone();
    assert_eq!(holds, vec![("/mnt/disks/a".to_string(), all[0].why.clone())]);
    assert!(lab.api.events() >= 1, "a Warning event says why");
}

#[tokio::test]
async fn a_pv_bound_meanwhile_fails_the_precondition_and_its_device_is_not_held() {
    let mut lab = lab().await;
    let states = vec![PvState::from_pv(&own_pv("a", "Available", serde_json::json!({})))];
    // The API answers 409: the PV changed (bound) since the store showed it.
    lab.api.script("DELETE /api/v1/persistentvolumes/a", &[409]);
    lab.agent.withdraw_tampered(&states, &[tampered("a")]).await;
    assert_eq!(lab.api.count("DELETE", "/api/v1/persistentvolumes/a"), 1);
    assert!(lab.host.holds.lock().unwrap().is_empty(), "nothing is held for a PV that was not withdrawn");
}

#[tokio::test]
async fn a_used_mark_write_that_never_returns_costs_its_volume_only() {
    let mut lab = lab().await;
    *lab.host.scan.lock().unwrap() = Scan { volumes: vec![found("1"), found("2")], ..Default::default() };
    lab.host.frozen.lock().unwrap().push("/mnt/disks/2".into());
    let started = std::time::Instant::now();
    lab.pass().await;
    assert!(started.elapsed() < Duration::from_secs(2), "the pass waits at most the deadline: {:?}", started.elapsed());
    assert_eq!(lab.api.count("POST", "/api/v1/persistentvolumes"), 1, "the healthy volume is published");
    assert_eq!(lab.agent.ops.stuck(), 1);
    assert!(lab.agent.ops.stalls().iter().any(|s| s.subject.volume_path() == Some("/mnt/disks/2")));
    let metrics = lab.agent.metrics.encode();
    assert!(
        metrics.contains(
            "local_static_provisioner_volume_unresponsive{path=\"/mnt/disks/2\",operation=\"used mark write\"} 1"
        ),
        "{metrics}"
    );
    assert!(metrics.contains("local_static_provisioner_host_operations_stuck 1"));
    assert!(metrics.contains("local_static_provisioner_wedged_threads 1"), "{metrics}");
    assert!(metrics.contains("local_static_provisioner_wedged_threads_cap_reached 0"), "{metrics}");

    // Later passes do not wait for it at all.
    let started = std::time::Instant::now();
    lab.pass().await;
    assert!(started.elapsed() < Duration::from_millis(250), "{:?}", started.elapsed());
    assert_eq!(lab.api.count("POST", "/api/v1/persistentvolumes"), 1);
    let waiting =
        |lab: &Lab| lab.agent.effects.failure_keys().into_iter().filter(|k| matches!(k, EffectKey::Create(_))).count();
    assert_eq!(waiting(&lab), 1, "the frozen volume's create waits for a retry");

    // It answers again: retried in the background, then published.
    lab.host.frozen.lock().unwrap().clear();
    let before = lab.api.count("POST", "/api/v1/persistentvolumes");
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        lab.deadlines_pass();
        lab.pass().await;
        if waiting(&lab) == 0 && lab.agent.ops.stalls().is_empty() {
            break;
        }
    }
    assert_eq!(waiting(&lab), 0, "published once it answers");
    assert!(lab.api.count("POST", "/api/v1/persistentvolumes") > before);
    assert!(lab.agent.ops.stalls().is_empty());
}

/// A Bound PV made with fence requirements in its node affinity, claimed by default/data-0.
fn fenced_pv(name: &str) -> PvFacts {
    let mut pv = own_pv(name, "Bound", serde_json::json!({}));
    let mut expressions = vec![k8s_openapi::api::core::v1::NodeSelectorRequirement {
        key: "kubernetes.io/hostname".into(),
        operator: "In".into(),
        values: Some(vec!["n1".into()]),
    }];
    expressions.extend(crate::core::fence::volume_fence::fence_requirements(name));
    pv.spec.node_affinity = Some(k8s_openapi::api::core::v1::VolumeNodeAffinity {
        required: Some(k8s_openapi::api::core::v1::NodeSelector {
            node_selector_terms: vec![k8s_openapi::api::core::v1::NodeSelectorTerm {
                match_expressions: Some(expressions),
                match_fields: None,
            }],
        }),
    });
    // As the store keeps it (core::volumes::pv_facts): whether it honours its fence.
    pv.fence_honoured = crate::core::fence::volume_fence::honours_fence(name, pv.spec.node_affinity.as_ref());
    crate::core::fence::volume_fence::strip_fence_requirements(&mut pv.spec.node_affinity);
    assert!(pv.fence_honoured);
    pv.spec.claim_ref = Some(Box::new(k8s_openapi::api::core::v1::ObjectReference {
        namespace: Some("default".into()),
        name: Some("data-0".into()),
        uid: Some("claim-uid".into()),
        ..Default::default()
    }));
    pv
}

fn fence_label(lab: &Lab) -> Option<String> {
    lab.api.node_labels.lock().unwrap().get("fence.local-static-provisioner.io/pv-a").cloned()
}

#[tokio::test]
async fn a_swapped_disk_is_fenced_on_the_node_until_its_own_disk_is_back_and_a_failed_write_is_retried() {
    let mut lab = lab().await;
    lab.pvs.apply_watcher_event(&watcher::Event::Apply(fenced_pv("pv-a")));
    *lab.host.checks.lock().unwrap() = vec![("uid-pv-a".into(), DiskCheck::Different)];
    // The first write fails: nobody is told, the failure waits for its deadline.
    lab.api.script("PATCH /api/v1/nodes/n1", &[500]);
    let events = lab.api.events();
    lab.pass().await;
    assert_eq!(fence_label(&lab), None);
    assert_eq!(lab.api.events(), events, "no event before the fence is up");
    assert!(lab.agent.effects.failure_keys().iter().any(|k| matches!(k, EffectKey::Fences(_))));

    lab.deadlines_pass();
    lab.pass().await;
    assert_eq!(fence_label(&lab).as_deref(), Some("not-its-disk"));
    assert_eq!(lab.api.events(), events + 2, "VolumeFenced on the PV and on its claim");
    let metrics = lab.agent.metrics.encode();
    assert!(
        metrics.contains("local_static_provisioner_fenced_volumes{pv=\"pv-a\",reason=\"not-its-disk\"} 1"),
        "{metrics}"
    );

    // Level-triggered: nothing more is written while nothing changes.
    let patches = lab.api.count("PATCH", "/api/v1/nodes/n1");
    lab.pass().await;
    assert_eq!(lab.api.count("PATCH", "/api/v1/nodes/n1"), patches);

    // No answer from the disk: the fence stays.
    lab.host.checks.lock().unwrap().clear();
    lab.pass().await;
    assert_eq!(fence_label(&lab).as_deref(), Some("not-its-disk"));

    // Its own disk is back: lifted, and both are told.
    *lab.host.checks.lock().unwrap() = vec![("uid-pv-a".into(), DiskCheck::Same)];
    lab.pass().await;
    assert_eq!(fence_label(&lab), None);
    assert_eq!(lab.api.events(), events + 4, "VolumeUnfenced on the PV and on its claim");
    assert!(!lab.agent.metrics.encode().contains("fenced_volumes{"));
}

#[tokio::test]
async fn a_stopping_agent_fences_its_node_and_the_next_one_checks_every_disk_before_lifting_it() {
    let mut lab = lab().await;
    lab.pvs.apply_watcher_event(&watcher::Event::Apply(fenced_pv("pv-a")));
    lab.pvs.apply_watcher_event(&watcher::Event::Apply(fenced_pv("pv-b")));
    lab.agent.fence_on_stop().await;
    let node_wide =
        |lab: &Lab| lab.api.node_labels.lock().unwrap().get("local-static-provisioner.io/volumes-unverified").cloned();
    assert_eq!(node_wide(&lab).as_deref(), Some("agent-stopped"));

    // The next agent: pv-a's disk is its own, pv-b's does not answer yet. One write lifts the
    // node-wide fence and fences pv-b alone.
    lab.agent.node.metadata.labels.get_or_insert_default().extend(lab.api.node_labels.lock().unwrap().clone());
    *lab.host.checks.lock().unwrap() = vec![("uid-pv-a".into(), DiskCheck::Same)];
    let patches = lab.api.count("PATCH", "/api/v1/nodes/n1");
    lab.pass().await;
    assert_eq!(lab.api.count("PATCH", "/api/v1/nodes/n1"), patches + 1);
    assert_eq!(node_wide(&lab), None);
    let labels = lab.api.node_labels.lock().unwrap().clone();
    assert_eq!(labels.get("fence.local-static-provisioner.io/pv-b").map(String::as_str), Some("unverified"));
    assert!(!labels.contains_key("fence.local-static-provisioner.io/pv-a"));

    // pv-b answers with its own disk: lifted.
    *lab.host.checks.lock().unwrap() = vec![("uid-pv-a".into(), DiskCheck::Same), ("uid-pv-b".into(), DiskCheck::Same)];
    lab.pass().await;
    assert!(!lab.api.node_labels.lock().unwrap().keys().any(|k| k.starts_with("fence.")));
}

#[tokio::test]
async fn a_pv_made_before_fences_never_gets_a_fence_label_and_an_agent_without_such_pvs_stops_without_one() {
    let mut lab = lab().await;
    lab.pvs.apply_watcher_event(&watcher::Event::Apply(own_pv("pv-old", "Bound", serde_json::json!({}))));
    *lab.host.checks.lock().unwrap() = vec![("uid-pv-old".into(), DiskCheck::Different)];
    lab.pass().await;
    lab.agent.fence_on_stop().await;
    assert_eq!(lab.api.count("PATCH", "/api/v1/nodes/n1"), 0, "nothing to fence: its affinity cannot honour it");
}

#[tokio::test]
async fn an_unbound_pv_withdrawn_because_its_disk_is_gone_is_not_fenced_on_its_way_out() {
    let mut lab = lab().await;
    let unbound = |name: &str| {
        let mut pv = fenced_pv(name);
        pv.spec.claim_ref = None;
        pv.status.phase = Some("Available".into());
        pv
    };
    lab.pvs.apply_watcher_event(&watcher::Event::Apply(unbound("pv-a")));
    lab.pvs.apply_watcher_event(&watcher::Event::Apply(unbound("pv-b")));
    *lab.host.absent.lock().unwrap() = vec!["uid-pv-a".into(), "uid-pv-b".into()];
    *lab.host.checks.lock().unwrap() =
        vec![("uid-pv-a".into(), DiskCheck::Missing), ("uid-pv-b".into(), DiskCheck::Missing)];
    // pv-a is withdrawn; pv-b's withdrawal fails, so it stays, and stays fenced meanwhile.
    lab.api.script("DELETE /api/v1/persistentvolumes/pv-b", &[500]);
    lab.pass().await;
    assert_eq!(lab.api.count("DELETE", "/api/v1/persistentvolumes/pv-a"), 1);
    let labels = lab.api.node_labels.lock().unwrap().clone();
    assert_eq!(fence_label(&lab), None, "a PV withdrawn in this pass is not fenced: {labels:?}");
    assert_eq!(labels.get("fence.local-static-provisioner.io/pv-b").map(String::as_str), Some("disk-missing"));

    // The next pass sees pv-a being deleted (our finalizer holds it a moment): still not fenced.
    let mut deleting = unbound("pv-a");
    deleting.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-01-01T00:00:00Z".parse().unwrap()));
    lab.pvs.apply_watcher_event(&watcher::Event::Apply(deleting));
    lab.pass().await;
    assert_eq!(fence_label(&lab), None, "a terminating PV no claim used is not fenced");
}

/// The PV name the agent gives the entry `entry` of the test class on n1.
fn name_of(entry: &str) -> String {
    crate::core::volumes::naming::pv_name(entry, "n1", CLASS)
}

/// A PV of another node holding the name `name` (a collision of upstream's name hash).
fn foreign_pv(name: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {
            "name": name, "uid": "uid-foreign", "resourceVersion": "3",
            "annotations": { "pv.kubernetes.io/provisioned-by": "local-volume-provisioner-n2-other" },
            "labels": { "kubernetes.io/hostname": "n2" },
        },
        "spec": {
            "capacity": { "storage": "1Gi" }, "accessModes": ["ReadWriteOnce"], "storageClassName": CLASS,
            "local": { "path": "/mnt/elsewhere/x" },
        },
    })
}

impl MockApi {
    fn reasons(&self) -> Vec<String> {
        self.event_reasons.lock().unwrap().clone()
    }
}

#[tokio::test]
async fn a_collided_name_is_retried_with_backoff_and_published_once_the_foreign_pv_is_gone() {
    let mut lab = lab().await;
    let name = name_of("1");
    *lab.host.scan.lock().unwrap() = Scan { volumes: vec![found("1")], ..Default::default() };
    lab.api.script("POST /api/v1/persistentvolumes", &[409, 409]);
    let path = format!("/api/v1/persistentvolumes/{name}");
    lab.api.objects.lock().unwrap().insert(path.clone(), foreign_pv(&name));
    lab.pass().await;
    assert_eq!(lab.api.count("POST", "/api/v1/persistentvolumes"), 1);
    assert_eq!(lab.api.reasons(), ["VolumeNameCollision"], "reported once");
    lab.pass().await;
    assert_eq!(lab.api.count("POST", "/api/v1/persistentvolumes"), 1, "not retried before its deadline");
    // The deadline: tried again, still taken (one report for the whole occurrence).
    lab.deadlines_pass();
    lab.pass().await;
    assert_eq!(lab.api.count("POST", "/api/v1/persistentvolumes"), 2, "retried at its deadline");
    assert_eq!(lab.api.reasons(), ["VolumeNameCollision"], "still one report");
    // The foreign PV is deleted: the next retry publishes the volume, and the name is forgotten.
    lab.api.objects.lock().unwrap().remove(&path);
    lab.deadlines_pass();
    lab.pass().await;
    assert_eq!(lab.api.count("POST", "/api/v1/persistentvolumes"), 3, "published once the name is free");
    assert!(lab.agent.foreign.is_empty(), "the name no longer collides: forgotten");
}

#[tokio::test]
async fn a_pv_just_created_is_neither_refused_nor_created_again_while_the_watch_catches_up() {
    let mut lab = lab().await;
    let name = name_of("1");
    let volume = found("1");
    *lab.host.scan.lock().unwrap() = Scan { volumes: vec![volume.clone()], ..Default::default() };
    lab.pass().await;
    assert_eq!(lab.api.count("POST", "/api/v1/persistentvolumes"), 1);
    // The disk now carries the mark of the PV just created (the mock answers UID uid-1), and
    // the API has it; the agent's store (the watch) does not show it yet.
    let mark = crate::core::identity::used_mark::UsedMark {
        pv: name.clone(),
        node: "n1".into(),
        path: volume.host_path.clone(),
        identity: volume.identity.clone(),
        at: "2026-11-27T00:00:00Z".into(),
        uid: Some("uid-1".into()),
        root: Some("/".into()),
        claimed: false,
        wiped_filesystems: Default::default(),
    };
    let marked = FoundVolume { used: crate::core::identity::used_mark::UsedRead::Marked(mark), ..volume.clone() };
    *lab.host.scan.lock().unwrap() = Scan { volumes: vec![marked], ..Default::default() };
    let created = serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {
            "name": name, "uid": "uid-1", "resourceVersion": "8",
            "labels": { "local-static-provisioner.io/node": "n1" },
            "annotations": {
                "pv.kubernetes.io/provisioned-by": "local-volume-provisioner-n1-node-uid",
                "local-static-provisioner.io/volume-identity": volume.identity,
            },
            "finalizers": ["local-static-provisioner.io/wipe"],
        },
        "spec": {
            "capacity": { "storage": "1Gi" }, "accessModes": ["ReadWriteOnce"], "storageClassName": CLASS,
            "persistentVolumeReclaimPolicy": "Delete", "local": { "path": volume.host_path },
        },
        "status": { "phase": "Available" },
    });
    let path = format!("/api/v1/persistentvolumes/{name}");
    lab.api.objects.lock().unwrap().insert(path.clone(), created.clone());
    for _ in 0..4 {
        lab.deadlines_pass();
        lab.pass().await;
    }
    assert_eq!(lab.api.count("POST", "/api/v1/persistentvolumes"), 1, "not created again");
    assert_eq!(lab.api.count("GET", &path), 0, "its own PV is not read back");
    assert!(
        !lab.api.reasons().iter().any(|r| r == "VolumeNotPublished"),
        "not refused as already published: {:?}",
        lab.api.reasons()
    );
    // The watch shows it: the expectation is met, nothing more happens.
    let pv: PvFacts = serde_json::from_value(created).unwrap();
    lab.pvs.apply_watcher_event(&watcher::Event::Apply(pv));
    lab.deadlines_pass();
    lab.pass().await;
    assert_eq!(lab.api.count("POST", "/api/v1/persistentvolumes"), 1);
    assert!(lab.api.reasons().is_empty(), "{:?}", lab.api.reasons());
}

#[tokio::test]
async fn a_held_device_is_one_warning_event_per_occurrence_whatever_its_details_say() {
    let mut lab = lab().await;
    let held = |what: &str| {
        let plan = crate::core::devices::device_claim::ClaimPlan {
            held: vec![(CLASS.into(), "disk-a".into(), what.to_string())],
            ..Default::default()
        };
        let skipped = Skipped {
            class: CLASS.into(),
            path: "/mnt/disks/disk-a".into(),
            reason: SkipReason::DeviceHeld(what.to_string()),
        };
        (
            crate::host::devices::claims::ClaimReport { plan, ..Default::default() },
            Scan { skipped: vec![skipped], ..Default::default() },
        )
    };
    // What the claim pass says of it changes from look to look (probed or not, what is now on
    // it): still one cause.
    for what in ["ext4 found", "ext4 found; now: ext4 found", "ext4 found", "ext4 found; now: 3 writes"] {
        let (report, scan) = held(what);
        *lab.host.claims.lock().unwrap() = Some(report);
        *lab.host.scan.lock().unwrap() = scan;
        lab.deadlines_pass();
        lab.pass().await;
    }
    assert_eq!(lab.api.reasons(), ["DeviceHeld"], "one event for one held device");
    assert_eq!(lab.api.events(), 1, "and no repeat of it in its series");
    // Cleared, then held again: a new occurrence.
    *lab.host.claims.lock().unwrap() = None;
    *lab.host.scan.lock().unwrap() = Scan::default();
    lab.pass().await;
    let (report, scan) = held("xfs found");
    *lab.host.claims.lock().unwrap() = Some(report);
    *lab.host.scan.lock().unwrap() = scan;
    lab.pass().await;
    assert_eq!(lab.api.events(), 2, "a new occurrence, a new event (in the same series)");
}

#[tokio::test]
async fn every_refused_entry_is_evented_once_per_occurrence() {
    let mut lab = lab().await;
    let skip = |path: &str, reason: SkipReason| Skipped { class: CLASS.into(), path: path.into(), reason };
    let skipped = vec![
        skip("/mnt/disks", SkipReason::UnreadableDirectory("permission denied".into())),
        skip("/mnt/disks", SkipReason::BadPattern("unclosed [".into())),
        skip("/mnt/disks/\\xff", SkipReason::NotUtf8),
        skip("/mnt/disks/dir", SkipReason::DirectoryInBlockClass),
        skip("/mnt/disks/fifo", SkipReason::NotDirectoryOrBlockDevice),
    ];
    *lab.host.scan.lock().unwrap() = Scan { skipped, ..Default::default() };
    lab.pass().await;
    lab.pass().await;
    // Two of them are about the class (one series): counted as posts and series updates.
    assert_eq!(lab.api.events(), 5, "each once: {:?}", lab.api.reasons());
    assert!(lab.api.reasons().iter().all(|r| r == "VolumeNotPublished"));
}

#[tokio::test]
async fn a_withdrawn_pv_is_not_withdrawn_again_while_the_watch_catches_up() {
    let mut lab = lab().await;
    let gone = own_pv("gone", "Available", serde_json::json!({}));
    lab.pvs.apply_watcher_event(&watcher::Event::Apply(gone.clone()));
    *lab.host.absent.lock().unwrap() = vec!["uid-gone".into()];
    lab.pass().await;
    assert_eq!(lab.api.count("DELETE", "/api/v1/persistentvolumes/gone"), 1);
    assert_eq!(lab.api.reasons(), ["VolumeWithdrawn"]);
    // The store still shows it as it was, pass after pass.
    for _ in 0..4 {
        lab.deadlines_pass();
        lab.pass().await;
    }
    assert_eq!(lab.api.count("DELETE", "/api/v1/persistentvolumes/gone"), 1, "not deleted again");
    assert_eq!(lab.api.reasons(), ["VolumeWithdrawn"], "not told again");
    // The watch shows it gone: nothing more is expected.
    lab.pvs.apply_watcher_event(&watcher::Event::Delete(gone));
    lab.pass().await;
    assert!(lab.agent.expectations.is_empty());
}

/// Unknown keys the agent ignores are told on the Node once per occurrence (again only when
/// they change), and a problem of the configuration read at start-up, before the API could be
/// reached, at the first pass.
#[tokio::test]
async fn unknown_config_keys_and_start_up_problems_are_told_on_the_node_once() {
    let mut lab = lab().await;
    let dir = lab._config.path().to_path_buf();
    let write = |extra: &str| {
        std::fs::write(
            dir.join("storageClassMap"),
            format!("{CLASS}:\n  hostDir: /mnt/disks\n  mountDir: /mnt/disks\n{extra}"),
        )
        .unwrap()
    };
    let events = lab.api.events();
    lab.agent.tell_config_findings().await;
    assert_eq!(lab.api.events(), events, "nothing to tell");

    write("  reclaimPolicy: Retain\n");
    lab.agent.reload_config().await;
    lab.agent.tell_config_findings().await;
    assert_eq!(lab.api.events(), events + 1, "the unknown key is told");
    lab.agent.reload_config().await;
    lab.agent.tell_config_findings().await;
    assert_eq!(lab.api.events(), events + 1, "told once");

    write("  reclaimPolicy: Retain\n  capacity: 10Gi\n");
    lab.agent.reload_config().await;
    lab.agent.tell_config_findings().await;
    assert_eq!(lab.api.events(), events + 2, "a new unknown key is told");

    write("");
    lab.agent.reload_config().await;
    lab.agent.tell_config_findings().await;
    assert_eq!(lab.api.events(), events + 2, "fixed: nothing to tell");
    assert!(lab.agent.config_state.config_warnings.is_empty());

    // A problem met at start-up (before the API could be reached) is told at the first pass.
    let mut lab = crate::agent::tests::lab().await;
    lab.agent.config_state.config_problem = Some("class \"x\" is invalid".into());
    let events = lab.api.events();
    lab.agent.tell_config_findings().await;
    lab.agent.tell_config_findings().await;
    assert_eq!(lab.api.events(), events + 1, "told once");
}

/// The status writes of the node inventory the mock API saw.
fn inventory_writes(lab: &Lab) -> usize {
    lab.api.count("PATCH", &format!("{INVENTORIES}/n1/status"))
}

/// Lets the inventory's delay and retry deadlines pass.
fn inventory_due_now(lab: &mut Lab) {
    lab.agent.inventory.expire_for_test();
}

#[tokio::test]
async fn the_inventory_is_written_once_per_change_and_never_by_an_idle_pass() {
    let mut lab = lab().await;
    // No object yet: the start-up read finds none.
    *lab.host.scan.lock().unwrap() = Scan { volumes: vec![found("1")], ..Default::default() };
    lab.pass().await;
    assert_eq!(inventory_writes(&lab), 0, "a change waits for its delay");
    assert_eq!(lab.api.count("GET", &format!("{INVENTORIES}/n1")), 1, "its own object is read once, at start");
    inventory_due_now(&mut lab);
    lab.pass().await;
    // Absent at the start-up read: created, then written, with no apply refused first.
    assert_eq!(lab.api.count("POST", INVENTORIES), 1);
    assert_eq!(inventory_writes(&lab), 1, "one apply, after the create");
    for _ in 0..5 {
        inventory_due_now(&mut lab);
        lab.pass().await;
    }
    assert_eq!(inventory_writes(&lab), 1, "idle passes write nothing");
    assert_eq!(lab.api.count("GET", &format!("{INVENTORIES}/n1")), 1, "nor read it again");
    // A second volume is one more write.
    *lab.host.scan.lock().unwrap() = Scan { volumes: vec![found("1"), found("2")], ..Default::default() };
    lab.pass().await;
    inventory_due_now(&mut lab);
    lab.pass().await;
    assert_eq!(inventory_writes(&lab), 2);
    // The object deleted meanwhile (404 on the apply): created again, then written.
    lab.api.script(&format!("PATCH {INVENTORIES}/n1/status"), &[404]);
    *lab.host.scan.lock().unwrap() = Scan { volumes: vec![found("1")], ..Default::default() };
    lab.pass().await;
    inventory_due_now(&mut lab);
    lab.pass().await;
    assert_eq!(lab.api.count("POST", INVENTORIES), 2);
    assert_eq!(inventory_writes(&lab), 4, "the apply that found no object, and the one after the create");
}

#[tokio::test]
async fn the_apis_view_of_the_pvs_waits_up_to_a_minute_and_anything_else_goes_out_at_once() {
    let mut lab = lab().await;
    *lab.host.scan.lock().unwrap() = Scan { volumes: vec![found("1")], ..Default::default() };
    lab.pvs.apply_watcher_event(&watcher::Event::Apply(own_pv("1", "Bound", serde_json::json!({}))));
    lab.pass().await;
    inventory_due_now(&mut lab);
    lab.pass().await;
    let written = inventory_writes(&lab);
    assert!(written >= 1);
    let age = |lab: &mut Lab, ms: u64| lab.agent.inventory.age_change_for_test(Duration::from_millis(ms));
    let view = super::inventory::VIEW_DELAY;

    // Released (reclaim policy Delete): the API's view, which the PV shows at once.
    lab.pvs.apply_watcher_event(&watcher::Event::Apply(own_pv("1", "Released", serde_json::json!({}))));
    lab.pass().await;
    age(&mut lab, 400);
    lab.pass().await;
    assert_eq!(inventory_writes(&lab), written, "a view change waits past the usual delay");
    let due = lab.agent.inventory_due().expect("the loop wakes for it");
    assert!(due > std::time::Instant::now() + view - Duration::from_secs(1), "it waits up to {view:?}");
    // Bound again, then Released under Retain: still only the view, still waiting.
    lab.pvs.apply_watcher_event(&watcher::Event::Apply(own_pv("1", "Bound", serde_json::json!({}))));
    lab.pass().await;
    let mut retained = own_pv("1", "Released", serde_json::json!({}));
    retained.spec.persistent_volume_reclaim_policy = Some("Retain".into());
    lab.pvs.apply_watcher_event(&watcher::Event::Apply(retained));
    lab.pass().await;
    age(&mut lab, 400);
    lab.pass().await;
    assert_eq!(inventory_writes(&lab), written, "the changes of a minute go out together");
    age(&mut lab, view.as_millis() as u64);
    lab.pass().await;
    assert_eq!(inventory_writes(&lab), written + 1, "a view that lasts is shown as it stands");

    // A new volume is no view change, but its publishing is under way (it settles, then its
    // PV is created): the change waits for it, at most PUBLISHING_DELAY, not the minute.
    *lab.host.scan.lock().unwrap() = Scan { volumes: vec![found("1"), found("2")], ..Default::default() };
    lab.pass().await;
    assert_eq!(inventory_writes(&lab), written + 1);
    age(&mut lab, 400);
    lab.pass().await;
    assert_eq!(inventory_writes(&lab), written + 1, "it waits while the new volume is published");
    let due = lab.agent.inventory_due().expect("the loop wakes for it");
    let publishing = super::inventory::PUBLISHING_DELAY;
    assert!(due < std::time::Instant::now() + publishing, "it waits at most {publishing:?}");
    age(&mut lab, publishing.as_millis() as u64);
    lab.pass().await;
    assert_eq!(inventory_writes(&lab), written + 2, "a change that is not the view goes out within a few seconds");
}

#[tokio::test]
async fn without_the_crd_the_agent_publishes_as_before_and_says_so_once() {
    let mut lab = lab().await;
    lab.api.script(&format!("PATCH {INVENTORIES}"), &[404; 8]);
    lab.api.script(&format!("POST {INVENTORIES}"), &[404; 8]);
    *lab.host.scan.lock().unwrap() = Scan { volumes: vec![found("1")], ..Default::default() };
    for _ in 0..4 {
        inventory_due_now(&mut lab);
        lab.pass().await;
    }
    assert_eq!(lab.api.count("POST", "/api/v1/persistentvolumes"), 1, "the volume is published");
    assert_eq!(lab.api.reasons().iter().filter(|r| *r == "InventoryUnavailable").count(), 1, "said once");
    // Applied later: the next retry creates and writes it.
    lab.api.script(&format!("PATCH {INVENTORIES}"), &[]);
    lab.api.script(&format!("POST {INVENTORIES}"), &[]);
    let before = inventory_writes(&lab);
    inventory_due_now(&mut lab);
    lab.pass().await;
    inventory_due_now(&mut lab);
    lab.pass().await;
    assert!(inventory_writes(&lab) > before, "written once the CRD exists");
}

/// A block volume whose disk (by its stable ID) another node's inventory records as used.
fn recorded_elsewhere(lab: &Lab, list_code: Option<u16>) -> FoundVolume {
    let identity = "v2;blk;disk=wwid:0x5000c;size=1073741824;dev=8:16".to_string();
    let list = serde_json::json!({
        "kind": "LocalStorageNodeList", "apiVersion": "local-static-provisioner.io/v1alpha1", "metadata": {},
        "items": [{
            "apiVersion": "local-static-provisioner.io/v1alpha1", "kind": "LocalStorageNode",
            "metadata": { "name": "n2" }, "spec": { "nodeName": "n2" },
            "status": { "nodeName": "n2", "usedDisks": [{
                "identity": "v2;blk;disk=wwid:0x5000c;size=1073741824;dev=8:48", "pv": "pv-on-n2", "uid": "u-n2",
                "path": "/mnt/raw/d", "at": "2026-11-28T10:00:00Z", "claimed": true,
            }]},
        }],
    });
    lab.api.objects.lock().unwrap().insert(INVENTORIES.to_string(), list);
    if let Some(code) = list_code {
        lab.api.script(&format!("GET {INVENTORIES}"), &[code]);
    }
    FoundVolume { identity, disk: DiskKey::block("8:16"), ..found("d") }
}

/// A PV of node n2 naming `identity` (by its disk-id label and identity annotation, unless
/// `by_name_only`), in the given phase, claimed or not.
fn pv_of_n2(
    name: &str,
    uid: &str,
    identity: &str,
    phase: &str,
    claimed: bool,
    by_name_only: bool,
) -> serde_json::Value {
    let mut pv = serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": { "name": name, "uid": uid, "labels": {}, "annotations": {} },
        "spec": {
            "local": { "path": "/mnt/raw/d" }, "storageClassName": CLASS,
            "nodeAffinity": { "required": { "nodeSelectorTerms": [{ "matchExpressions": [
                { "key": "kubernetes.io/hostname", "operator": "In", "values": ["n2"] }
            ]}]}},
        },
        "status": { "phase": phase },
    });
    if !by_name_only {
        let label = crate::core::identity::disk_trust::disk_label(identity).unwrap();
        pv["metadata"]["labels"][crate::core::volumes::naming::LABEL_DISK_ID] = serde_json::json!(label);
        pv["metadata"]["annotations"][crate::core::volumes::naming::ANN_VOLUME_IDENTITY] = serde_json::json!(identity);
    }
    if claimed {
        pv["spec"]["claimRef"] = serde_json::json!({ "namespace": "t", "name": "c", "uid": "claim-uid" });
    }
    pv
}

/// Makes the label-selected PV list answer these PVs.
fn pvs_listed(lab: &Lab, items: Vec<serde_json::Value>) {
    let list =
        serde_json::json!({ "kind": "PersistentVolumeList", "apiVersion": "v1", "metadata": {}, "items": items });
    lab.api.objects.lock().unwrap().insert("/api/v1/persistentvolumes".into(), list);
}

/// Puts an operator's release of holds on this node's own LocalStorageNode (in the list).
fn release_holds(lab: &Lab, uids: &str) {
    let mut objects = lab.api.objects.lock().unwrap();
    let list = objects.get_mut(INVENTORIES).unwrap();
    let own = serde_json::json!({
        "apiVersion": "local-static-provisioner.io/v1alpha1", "kind": "LocalStorageNode",
        "metadata": { "name": "n1", "annotations": { crate::core::volumes::naming::ANN_RELEASED_HOLDS: uids } },
        "spec": { "nodeName": "n1" },
    });
    list["items"].as_array_mut().unwrap().push(own);
}

#[tokio::test]
async fn another_nodes_record_alone_holds_a_block_disk_and_says_so_but_never_has_it_wiped() {
    let mut lab = lab().await;
    let volume = recorded_elsewhere(&lab, None);
    *lab.host.scan.lock().unwrap() = Scan { volumes: vec![volume], ..Default::default() };
    // A PV named as the record says, on n2, that does not name the disk: a decoy.
    pvs_listed(&lab, vec![pv_of_n2("pv-on-n2", "u-n2", "", "Bound", false, true)]);
    lab.pass().await;
    lab.pass().await;
    assert_eq!(lab.api.count("POST", "/api/v1/persistentvolumes"), 0, "not published");
    assert_eq!(lab.host.wipes.load(Ordering::SeqCst), 0, "not wiped on one node's word");
    let holds = lab.agent.inventory.holds_for_test().to_vec();
    assert_eq!(holds.len(), 1, "{holds:?}");
    assert_eq!(
        (holds[0].node.as_str(), holds[0].record.as_str(), holds[0].reason.as_str()),
        ("n2", "pv-on-n2", "record")
    );
    assert_eq!(
        lab.api.reasons().iter().filter(|r| *r == "VolumeNotPublished").count(),
        1,
        "said once: {:?}",
        lab.api.reasons()
    );
    // An operator released it (on this node's object, which no agent token may annotate):
    // the record is taken as a mark, so the disk is wiped first, then published.
    release_holds(&lab, "u-n2");
    lab.agent.effects.forget(&EffectKey::Held("/mnt/disks/d".into()));
    lab.pass().await;
    wait_for_wipe(&lab).await;
    assert!(lab.agent.inventory.holds_for_test().is_empty());
    lab.agent.inventory_wipe_done(&EffectKey::WipeFirst("/mnt/disks/d".into()), true);
    assert!(lab.agent.inventory.superseded_for_test().contains("u-n2"));
    lab.agent.cleaner.cancel_all();
}

#[tokio::test]
async fn a_block_disk_a_claim_used_on_another_node_is_wiped_first_once_without_any_record() {
    let mut lab = lab().await;
    // n2's LocalStorageNode was deleted (no record); its Released PV, which a claim used,
    // names the disk.
    let identity = "v2;blk;disk=wwid:0x5000c;size=1073741824;dev=8:16";
    let volume = FoundVolume { identity: identity.into(), disk: DiskKey::block("8:16"), ..found("d") };
    *lab.host.scan.lock().unwrap() = Scan { volumes: vec![volume], ..Default::default() };
    pvs_listed(&lab, vec![pv_of_n2("pv-on-n2", "u-n2", identity, "Released", true, false)]);
    lab.pass().await;
    assert_eq!(lab.api.count("POST", "/api/v1/persistentvolumes"), 0, "not published unwiped");
    wait_for_wipe(&lab).await;
    lab.agent.inventory_wipe_done(&EffectKey::WipeFirst("/mnt/disks/d".into()), true);
    assert_eq!(lab.agent.inventory.superseded_pvs_for_test().keys().collect::<Vec<_>>(), ["u-n2"]);
    lab.agent.cleaner.cancel_all();
    // Wiped: that PV no longer has it wiped again, and it is published.
    lab.pass().await;
    assert_eq!(lab.host.wipes.load(Ordering::SeqCst), 1, "wiped once");
    assert_eq!(lab.api.count("POST", "/api/v1/persistentvolumes"), 1, "published");
    // The PV is gone: nothing left to supersede.
    pvs_listed(&lab, Vec::new());
    lab.agent.consult_for_test(identity).await;
    assert!(lab.agent.inventory.superseded_pvs_for_test().is_empty());
}

#[tokio::test]
async fn a_bound_pv_of_another_node_holds_a_block_disk_while_a_decoy_by_name_does_not() {
    let mut lab = lab().await;
    let identity = "v2;blk;disk=wwid:0x5000c;size=1073741824;dev=8:16";
    // This node's own used disk, a record of n2 naming a decoy PV by name only: wiped as its
    // own mark says.
    let mark = crate::core::identity::used_mark::UsedMark {
        pv: "gone-pv".into(),
        node: "n1".into(),
        path: "/mnt/disks/d".into(),
        identity: identity.into(),
        at: String::new(),
        uid: Some("u-own".into()),
        root: None,
        claimed: true,
        wiped_filesystems: Vec::new(),
    };
    let volume = FoundVolume {
        used: crate::core::identity::used_mark::UsedRead::Marked(mark),
        ..recorded_elsewhere(&lab, None)
    };
    *lab.host.scan.lock().unwrap() = Scan { volumes: vec![volume.clone()], ..Default::default() };
    lab.api.objects.lock().unwrap().insert(
        "/api/v1/persistentvolumes/pv-on-n2".into(),
        pv_of_n2("pv-on-n2", "u-n2", identity, "Bound", true, true),
    );
    // The claimed PV that names the disk holds it.
    pvs_listed(&lab, vec![pv_of_n2("pv-bound", "u-b", identity, "Bound", true, false)]);
    lab.pass().await;
    assert_eq!(lab.host.wipes.load(Ordering::SeqCst), 0, "not wiped while a claim is bound to it");
    let holds = lab.agent.inventory.holds_for_test().to_vec();
    assert_eq!(holds.iter().map(|h| h.reason.as_str()).collect::<Vec<_>>(), ["claimed-pv"]);
    // Only the decoy is left: wiped as this node's own mark says.
    pvs_listed(&lab, Vec::new());
    lab.agent.effects.forget(&EffectKey::Held("/mnt/disks/d".into()));
    lab.pass().await;
    wait_for_wipe(&lab).await;
    lab.agent.cleaner.cancel_all();
}

#[tokio::test]
async fn without_the_crd_a_new_block_disk_is_published() {
    let mut lab = lab().await;
    lab.api.no_crd.store(true, Ordering::SeqCst);
    let volume = FoundVolume {
        identity: "v2;blk;disk=wwid:0x5000e;size=1073741824;dev=8:16".into(),
        disk: DiskKey::block("8:16"),
        ..found("d")
    };
    *lab.host.scan.lock().unwrap() = Scan { volumes: vec![volume], ..Default::default() };
    for _ in 0..3 {
        inventory_due_now(&mut lab);
        lab.pass().await;
    }
    assert_eq!(lab.api.count("POST", "/api/v1/persistentvolumes"), 1, "published: {:?}", lab.api.seen.lock().unwrap());
    assert_eq!(lab.api.reasons().iter().filter(|r| *r == "InventoryUnavailable").count(), 1, "said once");
}

#[tokio::test]
async fn a_block_disk_is_held_back_while_the_cluster_records_cannot_be_read() {
    let mut lab = lab().await;
    // Its own object read first (the scripted failure below is for the list).
    lab.pass().await;
    let volume = recorded_elsewhere(&lab, Some(500));
    *lab.host.scan.lock().unwrap() = Scan { volumes: vec![volume], ..Default::default() };
    lab.pass().await;
    assert_eq!(lab.api.count("POST", "/api/v1/persistentvolumes"), 0, "not published");
    assert_eq!(lab.host.wipes.load(Ordering::SeqCst), 0, "nor wiped");
    // A disk no record names is published as usual.
    let mut clean = recorded_elsewhere(&lab, None);
    clean.identity = "v2;blk;disk=wwid:0x5000d;size=1073741824;dev=8:32".into();
    *lab.host.scan.lock().unwrap() = Scan { volumes: vec![clean], ..Default::default() };
    lab.pass().await;
    assert_eq!(lab.api.count("POST", "/api/v1/persistentvolumes"), 1, "published");
}

async fn wait_for_wipe(lab: &Lab) {
    for _ in 0..200 {
        if lab.host.wipes.load(Ordering::SeqCst) > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("no wipe started: {:?} {:?}", lab.api.seen.lock().unwrap(), lab.api.reasons());
}

#[tokio::test]
async fn an_inventory_of_an_earlier_incarnation_of_the_node_is_left_to_the_garbage_collector() {
    let mut lab = lab().await;
    let own = format!("{INVENTORIES}/n1");
    let old = serde_json::json!({
        "apiVersion": "local-static-provisioner.io/v1alpha1", "kind": "LocalStorageNode",
        "metadata": { "name": "n1", "ownerReferences": [
            { "apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "an-earlier-node-uid" }
        ]},
        "spec": { "nodeName": "n1" },
    });
    lab.api.objects.lock().unwrap().insert(own.clone(), old);
    *lab.host.scan.lock().unwrap() = Scan { volumes: vec![found("1")], ..Default::default() };
    for _ in 0..3 {
        inventory_due_now(&mut lab);
        lab.pass().await;
    }
    assert_eq!(inventory_writes(&lab), 0, "nothing written into the earlier incarnation's object");
    // The garbage collector removed it: created for this incarnation, then written.
    lab.api.objects.lock().unwrap().remove(&own);
    lab.api.script(&format!("PATCH {INVENTORIES}/n1/status"), &[404]);
    inventory_due_now(&mut lab);
    lab.pass().await;
    assert_eq!(lab.api.count("POST", INVENTORIES), 1);
    assert_eq!(inventory_writes(&lab), 2);
}

#[tokio::test]
async fn a_pv_made_before_the_disk_id_label_gets_it_once() {
    let mut lab = lab().await;
    let identity = "v2;blk;disk=wwid:0x5000c;size=1073741824;dev=8:16";
    let annotations = serde_json::json!({ crate::core::volumes::naming::ANN_VOLUME_IDENTITY: identity });
    lab.pvs.apply_watcher_event(&watcher::Event::Apply(own_pv("old", "Bound", annotations.clone())));
    // A directory's PV has no disk to look up: no label, no patch.
    let dir = serde_json::json!({ crate::core::volumes::naming::ANN_VOLUME_IDENTITY: "v2;fs;uuid=u1;ino=2;dev=8:1" });
    lab.pvs.apply_watcher_event(&watcher::Event::Apply(own_pv("dir", "Bound", dir)));
    lab.pass().await;
    assert_eq!(lab.api.count("PATCH", "/api/v1/persistentvolumes/old"), 1, "labelled");
    assert_eq!(lab.api.count("PATCH", "/api/v1/persistentvolumes/dir"), 0);
    // The store has not shown the label yet: not patched again.
    lab.pass().await;
    assert_eq!(lab.api.count("PATCH", "/api/v1/persistentvolumes/old"), 1, "not again before the store shows it");
    // The store shows it: nothing more to do.
    let label = serde_json::json!({ crate::core::volumes::naming::LABEL_DISK_ID: crate::core::identity::disk_trust::disk_label(identity) });
    lab.pvs.apply_watcher_event(&watcher::Event::Apply(own_pv_labelled("old", "Bound", annotations, label, "8")));
    lab.pass().await;
    assert_eq!(lab.api.count("PATCH", "/api/v1/persistentvolumes/old"), 1);
}

/// The Node as the watch of it shows it: `labels` on top of the registered ones, at `version`.
fn watched_node(labels: &BTreeMap<String, String>, version: &str) -> Node {
    let mut node = node();
    node.metadata.resource_version = Some(version.into());
    node.metadata.labels.get_or_insert_default().extend(labels.clone());
    node
}

#[tokio::test]
async fn a_fence_label_removed_by_hand_is_put_back_by_the_next_pass_from_the_watched_node() {
    let mut lab = lab().await;
    let (store, mut nodes) = reflector::store::<Node>();
    lab.agent.node_store = Some(store);
    lab.pvs.apply_watcher_event(&watcher::Event::Apply(fenced_pv("pv-a")));
    *lab.host.checks.lock().unwrap() = vec![("uid-pv-a".into(), DiskCheck::Different)];
    lab.pass().await;
    assert_eq!(fence_label(&lab).as_deref(), Some("not-its-disk"));
    // The watch shows the Node as the write left it: nothing more to write.
    let labels = lab.api.node_labels.lock().unwrap().clone();
    nodes.apply_watcher_event(&watcher::Event::Apply(watched_node(&labels, "2")));
    let patches = lab.api.count("PATCH", "/api/v1/nodes/n1");
    lab.pass().await;
    assert_eq!(lab.api.count("PATCH", "/api/v1/nodes/n1"), patches);
    // Removed by hand: the watch shows it gone, and the next pass puts it back (no resync).
    lab.api.node_labels.lock().unwrap().remove("fence.local-static-provisioner.io/pv-a");
    let labels = lab.api.node_labels.lock().unwrap().clone();
    nodes.apply_watcher_event(&watcher::Event::Apply(watched_node(&labels, "3")));
    lab.pass().await;
    assert_eq!(fence_label(&lab).as_deref(), Some("not-its-disk"));
    assert_eq!(lab.api.count("PATCH", "/api/v1/nodes/n1"), patches + 1);
    // An unchanged watched copy (older than the Node our write returned) is not taken again:
    // the fence is written once, not on every pass.
    lab.pass().await;
    assert_eq!(lab.api.count("PATCH", "/api/v1/nodes/n1"), patches + 1);
}

#[tokio::test]
async fn a_starting_agent_fences_its_node_before_its_first_pass_which_lifts_it() {
    let mut lab = lab().await;
    lab.pvs.apply_watcher_event(&watcher::Event::Apply(fenced_pv("pv-a")));
    let node_wide =
        |lab: &Lab| lab.api.node_labels.lock().unwrap().get("local-static-provisioner.io/volumes-unverified").cloned();
    lab.agent.fence_at_start().await;
    assert_eq!(node_wide(&lab).as_deref(), Some("agent-stopped"));
    // Already up (a clean stop or kubelet's start set it): not written again.
    let patches = lab.api.count("PATCH", "/api/v1/nodes/n1");
    lab.agent.fence_at_start().await;
    assert_eq!(lab.api.count("PATCH", "/api/v1/nodes/n1"), patches);
    // The first pass checks the disk, finds its own, and lifts it.
    *lab.host.checks.lock().unwrap() = vec![("uid-pv-a".into(), DiskCheck::Same)];
    lab.pass().await;
    assert_eq!(node_wide(&lab), None);
    assert_eq!(fence_label(&lab), None);
}

/// Issue 41 through the agent: an I/O error the presence check met, a volume smaller than its
/// PV and one grown past it. The Available PV on a shrunk disk is withdrawn, the Bound one whose
/// presence check met EIO annotated (io-failure, never absent: no missing flag), and the grown
/// one told (Normal VolumeGrown), once.
#[tokio::test]
async fn presence_io_failures_and_size_changes_are_signs() {
    use crate::core::health::disk_health::{Signs, SizeFacts};
    use crate::core::volumes::naming::ANN_DISK_FAILING;
    let mut lab = lab().await;
    let annotated = |name: &str, annotations: serde_json::Value| {
        let mut pv = own_pv(name, "Bound", annotations);
        pv.spec.claim_ref = Some(Box::new(k8s_openapi::api::core::v1::ObjectReference {
            namespace: Some("ns".into()),
            name: Some(format!("claim-{name}")),
            uid: Some(format!("cu-{name}")),
            ..Default::default()
        }));
        pv
    };
    let bound = |name: &str| annotated(name, serde_json::json!({}));
    lab.pvs.apply_watcher_event(&watcher::Event::Apply(own_pv("small", "Available", serde_json::json!({}))));
    lab.pvs.apply_watcher_event(&watcher::Event::Apply(bound("eio")));
    lab.pvs.apply_watcher_event(&watcher::Event::Apply(bound("big")));
    let size =
        |bytes: u64| Signs { size: Some(SizeFacts { bytes, device_bytes: None, fixed: true }), ..Default::default() };
    lab.host.scan.lock().unwrap().signs = vec![
        ("/mnt/disks/small".into(), size(512 << 20)),
        ("/mnt/disks/eio".into(), size(1 << 30)),
        ("/mnt/disks/big".into(), size(2 << 30)),
    ];
    *lab.host.io_failures.lock().unwrap() =
        vec![("/mnt/disks/eio".into(), "open /mnt/disks/eio: Input/output error (os error 5)".into())];
    lab.pass().await;
    assert_eq!(lab.api.count("DELETE", "/api/v1/persistentvolumes/small"), 1, "the shrunk Available PV withdrawn");
    assert_eq!(lab.api.count("DELETE", "/api/v1/persistentvolumes"), 1, "nothing else deleted");
    assert_eq!(lab.api.count("PATCH", "/api/v1/persistentvolumes/eio"), 1, "the Bound PV annotated");
    assert_eq!(lab.api.count("PATCH", "/api/v1/persistentvolumes/big"), 0, "a grown PV is not annotated");
    let reasons = lab.api.reasons();
    let count = |r: &str| reasons.iter().filter(|x| *x == r).count();
    assert_eq!(count("VolumeWithdrawn"), 1, "{reasons:?}");
    // On the PV and on its claim.
    assert_eq!(count("DiskFailing"), 2, "{reasons:?}");
    assert_eq!(count("VolumeGrown"), 2, "{reasons:?}");
    assert_eq!(count("VolumeMissing"), 0, "an I/O error is not absence: {reasons:?}");

    // The I/O error is held though the next presence check is clean (the store shows the PV
    // annotated: a cleared sign would unflag it); the growth is not told again.
    lab.host.io_failures.lock().unwrap().clear();
    let flagged = annotated("eio", serde_json::json!({ ANN_DISK_FAILING: "io-failure: earlier" }));
    lab.pvs.apply_watcher_event(&watcher::Event::Apply(flagged));
    lab.pass().await;
    let reasons = lab.api.reasons();
    assert_eq!(reasons.iter().filter(|x| *x == "VolumeGrown").count(), 2, "told once per size: {reasons:?}");
    assert_eq!(reasons.iter().filter(|x| *x == "DiskRecovered").count(), 0, "the I/O failure is held: {reasons:?}");
}

/// Adoption lists every PV of the cluster, but reads in full (GET) and patches only the one
/// made for this node that lacks our label; another node's PV and one already labelled are
/// neither read again nor touched. The listing answered here carries fields an ownership
/// read skips (spec, managedFields), as the API server's does.
#[tokio::test]
async fn adoption_reads_again_and_labels_only_this_nodes_unlabelled_pvs() {
    let mut lab = lab().await;
    let pv = |name: &str, provisioned_by: &str, labels: serde_json::Value| {
        serde_json::json!({
            "metadata": {
                "name": name, "uid": format!("uid-{name}"), "resourceVersion": "5", "labels": labels,
                "annotations": { "pv.kubernetes.io/provisioned-by": provisioned_by },
                "managedFields": [{"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}],
            },
            "spec": { "storageClassName": CLASS, "local": { "path": format!("/mnt/disks/{name}") } },
            "status": { "phase": "Available" },
        })
    };
    let upstream = pv("upstream-n1", "local-volume-provisioner-n1-node-uid", serde_json::json!(null));
    let other = pv("upstream-n2", "local-volume-provisioner-n2-other-uid", serde_json::json!({}));
    let labelled = pv(
        "ours-n1",
        "local-volume-provisioner-n1-node-uid",
        serde_json::json!({"local-static-provisioner.io/node": "n1"}),
    );
    let list = serde_json::json!({
        "kind": "PersistentVolumeList", "apiVersion": "v1", "metadata": {},
        "items": [other.clone(), upstream.clone(), labelled.clone()],
    });
    {
        let mut objects = lab.api.objects.lock().unwrap();
        objects.insert("/api/v1/persistentvolumes".into(), list);
        for pv in [&upstream, &other, &labelled] {
            objects
                .insert(format!("/api/v1/persistentvolumes/{}", pv["metadata"]["name"].as_str().unwrap()), pv.clone());
        }
    }
    lab.pass().await;
    assert!(lab.agent.adopted, "adoption completed");
    assert_eq!(lab.api.count("GET", "/api/v1/persistentvolumes/upstream-n1"), 1, "the kept PV is read whole");
    assert_eq!(lab.api.count("PATCH", "/api/v1/persistentvolumes/upstream-n1"), 1, "and labelled");
    for name in ["upstream-n2", "ours-n1"] {
        let path = format!("/api/v1/persistentvolumes/{name}");
        assert_eq!(lab.api.count("GET", &path) + lab.api.count("PATCH", &path), 0, "{name} is left alone");
    }
    // Once done, a later pass lists nothing again.
    let lists =
        lab.api.seen.lock().unwrap().iter().filter(|(m, p)| m == "GET" && p == "/api/v1/persistentvolumes").count();
    lab.pass().await;
    let again =
        lab.api.seen.lock().unwrap().iter().filter(|(m, p)| m == "GET" && p == "/api/v1/persistentvolumes").count();
    assert_eq!((lists, again), (1, 1));
}

/// A kept PV that cannot be read whole leaves adoption undone, tried again at its deadline,
/// and nothing is patched meanwhile.
#[tokio::test]
async fn adoption_that_cannot_read_a_kept_pv_is_retried() {
    let mut lab = lab().await;
    let upstream = serde_json::json!({
        "metadata": { "name": "upstream-n1", "uid": "u", "resourceVersion": "5",
                      "annotations": { "pv.kubernetes.io/provisioned-by": "local-volume-provisioner-n1-node-uid" } },
        "spec": { "storageClassName": CLASS, "local": { "path": "/mnt/disks/upstream-n1" } },
    });
    let list = serde_json::json!({"kind": "PersistentVolumeList", "apiVersion": "v1", "metadata": {}, "items": [upstream.clone()]});
    lab.api.objects.lock().unwrap().insert("/api/v1/persistentvolumes".into(), list);
    lab.api.objects.lock().unwrap().insert("/api/v1/persistentvolumes/upstream-n1".into(), upstream);
    lab.api.script("GET /api/v1/persistentvolumes/upstream-n1", &[500]);
    lab.pass().await;
    assert!(!lab.agent.adopted);
    assert!(lab.agent.effects.failure_keys().contains(&EffectKey::Adopt));
    assert_eq!(lab.api.count("PATCH", "/api/v1/persistentvolumes/upstream-n1"), 0);
    lab.deadlines_pass();
    lab.pass().await;
    assert!(lab.agent.adopted, "adopted on the retry");
    assert_eq!(lab.api.count("PATCH", "/api/v1/persistentvolumes/upstream-n1"), 1);
}
