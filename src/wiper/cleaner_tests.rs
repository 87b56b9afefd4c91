//! The cleaner's shell without a cluster or a host: kube's client over a `tower-test` mock
//! that answers every request and keeps what it saw, and a fake host whose wipes succeed at
//! once. What a released PV costs in requests, and a wipe task that panics.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use kube::client::Body;
use tokio::sync::mpsc;

use super::{Cleaner, CleanerOptions, Progress, WipeError, WipeJob, WipeOutcome, WipeTarget, Wiped};
use crate::api::{ClientOptions, Cluster};
use crate::config::ClassConfig;
use crate::core::reconcile::effect_key::EffectKey;
use crate::core::wipe::cleanup::{AfterWipe, PvState};
use crate::core::wipe::wipe_history::LastWipe;
use crate::host::HostError;
use crate::host::access::{Ask, HostAccess, MarkJob, Observation};
use crate::host::identity::used_mark::MarkOutcome;
use crate::host::mounts::mountinfo::MountTable;
use crate::host::ops::{OnDeadline, Operations};
use crate::metrics::Metrics;

/// A host whose wipes succeed at once.
#[derive(Default)]
struct QuickHost {
    wipes: AtomicUsize,
    /// The volumes' last wipes it keeps (host::wipe::wipe_history).
    history: Mutex<Vec<LastWipe>>,
}

impl HostAccess for QuickHost {
    fn observe(&self, _ask: Ask) -> Result<Observation, HostError> {
        Ok(Observation::default())
    }
    fn mount_table(&self) -> Result<Arc<MountTable>, HostError> {
        Ok(Arc::default())
    }
    fn mark_one(&self, job: &MarkJob, _mounts: &MountTable, _on: &OnDeadline) -> Result<MarkOutcome, String> {
        Ok(MarkOutcome::Written(job.mark.clone(), crate::host::identity::used_mark::Carrier::Attribute))
    }
    fn record_marks(&self, _outcomes: &mut [Result<MarkOutcome, String>]) {}
    fn record_withdrawn(&self, _uids: &[String]) -> Result<(), String> {
        Ok(())
    }
    fn identity(&self, path: &std::path::Path, _on: &OnDeadline) -> Result<String, String> {
        Ok(format!("id-of-{}", path.display()))
    }
    fn wipe(
        &self,
        job: &WipeJob,
        _cancel: &std::sync::atomic::AtomicBool,
        _progress: &Progress,
        _on: &OnDeadline,
    ) -> Result<Wiped, WipeError> {
        self.wipes.fetch_add(1, Ordering::SeqCst);
        Ok(Wiped {
            mode: "fs",
            bytes: 4096,
            resumed: false,
            identity: job.pv.identity.clone().unwrap_or_default(),
            method: "filesystem".into(),
            at: "2026-11-28T10:00:00Z".into(),
            key_erased: None,
        })
    }
    fn hold_claim(&self, _host_path: &str, _why: &str) -> Result<(), String> {
        Ok(())
    }
    fn note_last_wipe(&self, wipe: &LastWipe) -> Result<(), String> {
        let mut all = self.history.lock().unwrap();
        all.retain(|w| w.host_path != wipe.host_path);
        all.push(wipe.clone());
        Ok(())
    }
    fn last_wipes(&self, keep: &(dyn Fn(&LastWipe) -> bool + Sync)) -> Result<Vec<LastWipe>, String> {
        let mut all = self.history.lock().unwrap();
        all.retain(|w| keep(w));
        Ok(all.clone())
    }
}

/// Every request seen, as "METHOD path".
type Seen = Arc<Mutex<Vec<String>>>;

/// A client whose every request succeeds (creates echo their body with a UID).
fn mock_client(seen: Seen) -> kube::Client {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        while let Some((request, send)) = handle.next_request().await {
            let line = format!("{} {}", request.method(), request.uri().path());
            let method = request.method().clone();
            let body = request.into_body().collect_bytes().await.unwrap_or_default();
            seen.lock().unwrap().push(line);
            let (status, reply) = if method == http::Method::POST {
                let mut obj: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                obj["metadata"]["uid"] = serde_json::json!("uid-e");
                (201, obj.to_string())
            } else {
                let pv = serde_json::json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "v"}});
                (200, pv.to_string())
            };
            send.send_response(Response::builder().status(status).body(Body::from(reply.into_bytes())).unwrap());
        }
    });
    kube::Client::new(service, "default")
}

fn cleaner() -> (Cleaner, mpsc::UnboundedReceiver<WipeOutcome>, Seen, Arc<QuickHost>) {
    let seen = Seen::default();
    let opts = ClientOptions { kubeconfig: None, qps: 1000, burst: 1000, ..Default::default() };
    let cluster = Cluster::from_client(mock_client(seen.clone()), &opts, "n1");
    let host = Arc::new(QuickHost::default());
    let cleaner_opts = CleanerOptions { concurrency: 2, timeout_base: Duration::from_secs(60), min_rate: 1 << 20 };
    let (cleaner, done) = Cleaner::new(cluster, host.clone(), Operations::new(), cleaner_opts, Metrics::new());
    (cleaner, done, seen, host)
}

fn released() -> (PvState, WipeTarget) {
    let pv = PvState {
        name: "v".into(),
        uid: "uid-v".into(),
        phase: "Released".into(),
        host_path: "/mnt/disks/v".into(),
        class: "local".into(),
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("storageClassMap"), "local:\n  hostDir: /mnt/disks\n  mountDir: /mnt/disks\n")
        .unwrap();
    let config = crate::config::ConfigSource::new(dir.path()).load().unwrap().config;
    let class: Option<&ClassConfig> = config.storage_class_map.get("local");
    let target = super::target_for(&pv, class).unwrap();
    (pv, target)
}

#[tokio::test]
async fn a_quick_wipe_of_a_released_pv_costs_its_delete_and_the_finalizer_removal_only() {
    let (mut cleaner, mut done, seen, _host) = cleaner();
    let (pv, target) = released();
    cleaner.start(pv, AfterWipe::DeletePv, target);
    let outcome = done.recv().await.unwrap();
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        ["DELETE /api/v1/persistentvolumes/v", "PATCH /api/v1/persistentvolumes/v"],
        "no event for a quick wipe, and no read before the finalizer's removal"
    );
}

#[tokio::test]
async fn a_finalizer_is_removed_by_one_patch_naming_the_uid_without_a_read() {
    let (mut cleaner, mut done, seen, _host) = cleaner();
    let (pv, target) = released();
    cleaner.start(pv, AfterWipe::RemoveFinalizer, target);
    assert!(done.recv().await.unwrap().result.is_ok());
    assert_eq!(seen.lock().unwrap().clone(), ["PATCH /api/v1/persistentvolumes/v"]);
}

#[tokio::test]
async fn a_panicking_wipe_task_ends_in_a_failure_that_is_evented_and_retried() {
    let (mut cleaner, mut done, seen, host) = cleaner();
    let (pv, target) = released();
    cleaner.panic_next.store(true, Ordering::Relaxed);
    cleaner.start(pv.clone(), AfterWipe::DeletePv, target.clone());
    let outcome = tokio::time::timeout(Duration::from_secs(10), done.recv())
        .await
        .expect("a panicking wipe task still reports its outcome")
        .unwrap();
    let err = outcome.result.as_ref().unwrap_err();
    assert!(matches!(err, WipeError::Failed(_)) && err.to_string().contains("panicked"), "{err}");
    assert!(err.to_string().contains("injected by a test"), "{err}");
    cleaner.finished(&outcome);
    assert_eq!(cleaner.running(), 0, "not left running");
    assert!(cleaner.busy(std::slice::from_ref(&pv)).pvs.contains(&pv.uid), "backing off");
    assert_eq!(cleaner.failure(&EffectKey::Wipe(pv.uid.clone())).unwrap().delay, Duration::from_secs(10));
    assert!(
        seen.lock().unwrap().iter().any(|r| r.starts_with("POST") && r.contains("/events")),
        "the failure is an event: {:?}",
        seen.lock().unwrap()
    );
    assert!(!seen.lock().unwrap().iter().any(|r| r.starts_with("DELETE")), "the PV is not finished");
    // Retried: this time it goes through.
    cleaner.start(pv.clone(), AfterWipe::DeletePv, target);
    let outcome = done.recv().await.unwrap();
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    cleaner.finished(&outcome);
    assert!(cleaner.failure(&EffectKey::Wipe(pv.uid.clone())).is_none());
    assert_eq!(host.wipes.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_finished_wipe_is_kept_for_the_same_disk_until_its_new_pv_exists() {
    let (mut cleaner, mut done, _seen, host) = cleaner();
    let (mut pv, target) = released();
    let identity = "v2;fs;fsid=ab;volatile=tmpfs;ino=2;dev=0:50";
    pv.identity = Some(identity.into());
    cleaner.start(pv.clone(), AfterWipe::DeletePv, target);
    let outcome = done.recv().await.unwrap();
    assert!(outcome.result.is_ok());
    let last = cleaner.last_wipe_for("/mnt/disks/v", identity).expect("known before the outcome is handled");
    assert_eq!(
        (last.host_path.as_str(), last.pv.as_str(), last.pv_uid.as_str(), last.method.as_str(), last.bytes),
        ("/mnt/disks/v", "v", "uid-v", "filesystem", 4096)
    );
    assert_eq!(host.history.lock().unwrap().clone(), vec![last.clone()], "kept durably");
    cleaner.finished(&outcome);
    assert_eq!(cleaner.last_wipe_for("/mnt/disks/v", identity), Some(last.clone()));
    assert_eq!(
        cleaner.last_wipe_for("/mnt/disks/v", "v2;fs;fsid=cd;volatile=tmpfs;ino=2;dev=0:50"),
        None,
        "another disk"
    );
    assert_eq!(cleaner.last_wipe_for("/mnt/disks/w", identity), None, "another path");
    // A restart finds it again.
    let restarted =
        Cleaner::new(cleaner.cluster.clone(), host.clone(), Operations::new(), cleaner.opts.clone(), Metrics::new()).0;
    assert_eq!(restarted.last_wipe_for("/mnt/disks/v", identity), Some(last));
    // Published: forgotten, durably.
    cleaner.forget_history(["/mnt/disks/v".to_string()].into());
    assert_eq!(cleaner.last_wipe_for("/mnt/disks/v", identity), None);
    for _ in 0..100 {
        if host.history.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(host.history.lock().unwrap().is_empty());
    // A wipe-first (no PV was released) leaves no history.
    let node = k8s_openapi::api::core::v1::ObjectReference::default();
    cleaner.start_wipe_first("v", "/mnt/disks/v", identity, released().1, node);
    assert!(done.recv().await.unwrap().result.is_ok());
    assert_eq!(cleaner.last_wipe_for("/mnt/disks/v", identity), None);
    assert!(host.history.lock().unwrap().is_empty());
}

#[tokio::test]
async fn last_wipes_older_than_a_week_are_not_read_back() {
    let (cleaner, _done, _seen, host) = cleaner();
    let old = LastWipe {
        host_path: "/mnt/disks/v".into(),
        identity: "v2;fs;fsid=ab;volatile=tmpfs;ino=2;dev=0:50".into(),
        at: "2020-01-01T00:00:00Z".into(),
        method: "filesystem".into(),
        bytes: 1,
        elapsed_ms: Some(1),
        pv: "v".into(),
        pv_uid: "u".into(),
        key_erased: None,
        earlier: Vec::new(),
    };
    host.note_last_wipe(&old).unwrap();
    let restarted =
        Cleaner::new(cleaner.cluster.clone(), host.clone(), Operations::new(), cleaner.opts.clone(), Metrics::new()).0;
    assert_eq!(restarted.last_wipe_for(&old.host_path, &old.identity), None);
    assert!(host.history.lock().unwrap().is_empty(), "and dropped from the host's record");
}
